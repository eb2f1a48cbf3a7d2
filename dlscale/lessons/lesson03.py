"""Lesson 03, mixed precision: its question, reading, conclusion and exercise checks (03.1, 03.2).

The checks that add recipe lines to the plain loop (03.2 here, 05.3, 07.3, 10.3 in their lessons) run the learner's
loop against a reference on data chosen so that the usual mistakes change the result, and name the mistake they
recognise: here, clipping before ``unscale_``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dlscale.lessons.lesson_tools import Question, Reading, passed, regression_problem

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "FP16_KEPT",
    "ACCURACY_BY_PRECISION",
    "check_amp_step",
    "check_mixed_precision_loop",
    "precision_conclusion",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _precision(r2: dict[str, float], spread: float) -> str:
    return "a" if max(r2.values()) - min(r2.values()) <= spread else "b"


ACCURACY_BY_PRECISION = Question(
    "after the same training, the validation R² of fp32, bf16 and fp16...",
    {
        "a": "agree within the spread fp32 shows between two seeds",
        "b": "differ by more: a 16-bit format loses accuracy",
    },
    _precision,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _precision_kept(r2: dict[str, float], noise: float, format_: str = "fp16") -> tuple[Callable[[Any], bool], str]:
    allowed = max(noise, 0.01)
    gap = abs(r2[format_] - r2["fp32"])
    kept = gap <= allowed
    shows = (
        f"{format_} R² {r2[format_]:.4f} against fp32's {r2['fp32']:.4f}: a gap of {gap:.4f}, "
        f"{'within' if kept else 'beyond'} the noise of {allowed:.4f} (fp32's spread over seeds, at least 0.01)"
    )
    return (lambda answer: isinstance(answer, bool) and answer == kept), shows


FP16_KEPT = Reading(
    "did your stage in fp16 (with its scaler) end within the noise of fp32's R²?", "True or False", _precision_kept
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def precision_conclusion(r2: dict[str, float], spread: float) -> str:
    """Do the precisions' validation R² differ by more than ``spread`` (run-to-run noise of fp32 seeds)?"""
    low, high = min(r2, key=r2.get), max(r2, key=r2.get)
    gap = r2[high] - r2[low]
    if gap <= spread:
        return (
            f"The R² of {', '.join(r2)} differ by at most {gap:.3f}, within the {spread:.3f} that fp32 "
            f"alone varies between seeds: no precision lost accuracy here."
        )
    return (
        f"{low} reached R² {r2[low]:.3f} against {r2[high]:.3f} for {high}: a gap of {gap:.3f}, larger than "
        f"the {spread:.3f} that fp32 varies between seeds. Look at its loss curve before trusting it."
    )


# -- 03.1: one mixed-precision step --------------------------------------------------------------------------


def _amp_reference(make_model: Callable, steps: list, name: str) -> tuple[torch.nn.Module, float]:
    from dlscale.runtime.precision import Precision

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = Precision.resolve(name, "cpu")
    scaler = policy.grad_scaler(init_scale=2.0**10)
    for x, y in steps:
        optimizer.zero_grad()
        with policy.autocast():
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model, scaler.get_scale()


def check_amp_step(amp_step: Callable) -> None:
    """03.1: one mixed-precision step: autocast forward, scaled backward, scaler.step and scaler.update."""
    from dlscale.runtime.precision import Precision

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    generator = torch.Generator().manual_seed(1)
    steps = [(torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(3)]
    steps.append((torch.full((8, 6), 1e5), torch.zeros(8, 2)))  # overflows in fp16: must be skipped
    reference, reference_scale = _amp_reference(make_model, steps, "fp16")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = Precision.resolve("fp16", "cpu")
    scaler = policy.grad_scaler(init_scale=2.0**10)
    for x, y in steps:
        try:
            amp_step(model, optimizer, scaler, policy, x, y)
        except RuntimeError as err:
            if "update()" in str(err):
                raise AssertionError(
                    "scaler.step() was called twice without scaler.update() in between: "
                    "call scaler.update() at the end of every step"
                ) from None
            raise
    assert scaler.get_scale() == reference_scale, (
        f"the scale is {scaler.get_scale()}, expected {reference_scale}: call scaler.update() after every step, "
        f"so that an overflow halves the scale"
    )
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.isfinite(ours).all(), (
            "an overflowing step reached the weights: step through scaler.step(optimizer)"
        )
        assert torch.allclose(ours, theirs, atol=1e-5), (
            "the weights differ from the reference: run the forward pass and the loss inside policy.autocast(), "
            "backward on scaler.scale(loss), then scaler.step(optimizer) and scaler.update()"
        )
    passed("03.1")


# -- 03.2: mixed precision with a scaler, in the plain loop --------------------------------------------------


#: 03.2's clip threshold: small enough that clipping the true gradients changes every step.
CLIP = 0.05


def _amp_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = regression_problem(n=64, seed=3)
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]


def _amp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _amp_loop(order: str) -> nn.Module:
    """03.2's loop done right (``"unscale, clip"``), or with a named mistake, for the comparison."""
    model = _amp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=order != "no scaler")
    for x, y in _amp_batches():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if order == "unscale, clip":
            scaler.unscale_(optimizer)
        if order != "no clipping":
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
    return model


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))


def check_mixed_precision_loop(train_fp16: Callable[[nn.Module, list, float, float], None]) -> None:
    """03.2: fp16 autocast with a GradScaler, and clipping of the true (unscaled) gradients, in the plain loop."""
    model = _amp_model()
    train_fp16(model, _amp_batches(), 0.1, CLIP)
    mistakes = {
        "clip then unscale": "clipping before scaler.unscale_(optimizer): the clip compared the scaled "
        "gradients (thousands of times too large) with the threshold",
        "no clipping": "no clipping: clip with torch.nn.utils.clip_grad_norm_(model.parameters(), clip) "
        "after scaler.unscale_(optimizer)",
        "no scaler": "no GradScaler: scale the loss (scaler.scale(loss).backward()), step through "
        "scaler.step(optimizer) and call scaler.update()",
    }
    if not _same_weights(model, _amp_loop("unscale, clip")):
        named = next((message for order, message in mistakes.items() if _same_weights(model, _amp_loop(order))), None)
        raise AssertionError(
            named
            or "the weights differ from the reference: autocast the forward pass and the "
            "loss, then scale, backward, unscale_, clip, step and update"
        )
    passed("03.2")
