"""Lesson 07, large-batch training: its questions, reading, conclusions and exercise checks (07.1-07.3)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dlscale.lessons.lesson_tools import Question, Reading, passed, trained_r2

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "LARGER_BATCH_KEPT",
    "LARGE_BATCH_SETTING",
    "NOISE_SCALE",
    "NO_SCALING",
    "check_break_and_rescue",
    "check_lars_trust_ratio",
    "check_lr_schedule",
    "noise_scale_conclusions",
    "sweep_conclusions",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _no_scaling_keeps_up(rows: list[dict[str, Any]], tolerance: float = 0.02) -> str | None:
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    largest = max(r["multiple"] for r in rows if r["recipe"] != "baseline")
    run = next((r for r in rows if r["recipe"] == "no scaling" and r["multiple"] == largest), None)
    if run is None:
        return None
    return "a" if math.isfinite(run["val_r2"]) and run["val_r2"] >= baseline["val_r2"] - tolerance else "b"


def _noise_scale(b_simple: float, batches: list[int]) -> str:
    return "a" if b_simple < min(batches) else "c" if b_simple > max(batches) else "b"


NO_SCALING = Question(
    "at the sweep's largest batch, does training with no LR scaling stay within 0.02 of the baseline's R²?",
    {"a": "yes", "b": "no, it falls behind"},
    _no_scaling_keeps_up,
)


NOISE_SCALE = Question(
    "the measured gradient noise scale B_simple lies...",
    {"a": "below the smallest batch of the sweep", "b": "among the sweep's batches", "c": "above the largest batch"},
    _noise_scale,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _larger_batch_kept(r2: dict[int, float], tolerance: float = 0.02) -> tuple[Callable[[Any], bool], str]:
    small, large = min(r2), max(r2)
    kept = r2[large] >= r2[small] - tolerance
    shows = (
        f"R² {r2[large]:.4f} at global batch {large} against {r2[small]:.4f} at {small}: "
        f"{'within' if kept else 'more than'} {tolerance} {'of' if kept else 'below'} it"
    )
    return (lambda answer: isinstance(answer, bool) and answer == kept), shows


LARGER_BATCH_KEPT = Reading(
    "at the larger global batch, with your stage's LR scaling and warmup, did the validation "
    "R² stay within 0.02 of the smaller batch's?",
    "True or False",
    _larger_batch_kept,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def sweep_conclusions(rows: list[dict[str, Any]], tolerance: float = 0.02) -> list[str]:
    """What the large-batch sweep shows, per batch multiple: the best recipe, who kept up, who diverged."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    lines = [f"baseline: batch {baseline['batch']}, R² {baseline['val_r2']:.3f}."]
    for multiple in sorted({r["multiple"] for r in rows if r["recipe"] != "baseline"}):
        runs = [r for r in rows if r["multiple"] == multiple and r["recipe"] != "baseline"]
        finite = [r for r in runs if math.isfinite(r["val_r2"]) and r["val_r2"] > -1]
        diverged = [r["recipe"] for r in runs if r not in finite]
        parts = []
        if finite:
            best = max(finite, key=lambda r: r["val_r2"])
            kept_up = [r["recipe"] for r in finite if r["val_r2"] >= baseline["val_r2"] - tolerance]
            parts.append(f"best {best['recipe']} (R² {best['val_r2']:.3f}, {best['steps']} steps)")
            parts.append(f"within {tolerance} of the baseline: {', '.join(kept_up) if kept_up else 'none'}")
        if diverged:
            parts.append(f"diverged: {', '.join(diverged)}")
        lines.append(f"{multiple}× (batch {runs[0]['batch']}): " + "; ".join(parts) + ".")
    return lines


def noise_scale_conclusions(rows: list[dict[str, Any]], b_simple: float, tolerance: float = 0.02) -> list[str]:
    """Per batch multiple of the sweep: the batch against the measured noise scale, and whether any recipe
    kept up with the baseline there (McCandlish et al.: batches well beyond B_simple stop paying)."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    lines = []
    for multiple in sorted({r["multiple"] for r in rows if r["recipe"] != "baseline"}):
        runs = [r for r in rows if r["multiple"] == multiple and r["recipe"] != "baseline"]
        kept_up = [
            r["recipe"] for r in runs if math.isfinite(r["val_r2"]) and r["val_r2"] >= baseline["val_r2"] - tolerance
        ]
        where = "below" if runs[0]["batch"] < b_simple else "beyond"
        lines.append(
            f"batch {runs[0]['batch']} is {runs[0]['batch'] / b_simple:.2g}× B_simple ({where} it): "
            + (
                f"{', '.join(kept_up)} kept up with the baseline."
                if kept_up
                else "no recipe kept up with the baseline."
            )
        )
    return lines


# -- 07.1 and 07.2: break and rescue, LARS's trust ratio -----------------------------------------------------


#: Exercise 07.1's fixed setting: the tiny model at 8x its batch (256 against 32), for 4 epochs.
LARGE_BATCH_SETTING = {"train_samples": 4096, "global_batch_size": 256, "base_batch": 32, "epochs": 4}


def check_break_and_rescue(config: str, broken: dict[str, Any], rescued: dict[str, Any]) -> None:
    """07.1: ``broken`` makes the large-batch run diverge (or end no better than predicting the mean),
    ``rescued`` changes one of its settings, not the LR itself, and trains to a validation R² of 0.4 or more."""
    from dlscale.metrics.steplog import DivergedError

    for label, overrides in (("broken", broken), ("rescued", rescued)):
        assert isinstance(overrides, dict), (
            f"{label} should be a dict of config overrides, got {type(overrides).__name__}"
        )
        fixed = sorted(set(overrides) & set(LARGE_BATCH_SETTING))
        assert not fixed, f"{label} changes {fixed}: those are the experiment's fixed setting, keep them"
    changed = sorted(k for k in set(broken) | set(rescued) if broken.get(k, "<unset>") != rescued.get(k, "<unset>"))
    assert len(changed) == 1, (
        f"rescued differs from broken in {changed or 'nothing'}: change exactly one setting, "
        f"so that you learn which one matters"
    )
    assert changed != ["lr"], (
        "lowering the LR is the obvious rescue: keep the LR and find another setting that saves it"
    )

    def outcome(name: str, overrides: dict[str, Any]) -> float:
        try:
            return trained_r2(config, name=name, **{**LARGE_BATCH_SETTING, **overrides})
        except DivergedError:
            return float("-inf")

    first = outcome("check07-broken", broken)
    assert first <= 0.0, (
        f"broken ends at R² {first:.3f}: it neither diverged nor failed to learn. Raise the LR with "
        f"linear scaling and no warmup until the loss becomes inf or NaN"
    )
    second = outcome("check07-rescued", rescued)
    assert second >= 0.4, (
        "rescued diverged too"
        if second == float("-inf")
        else f"rescued ends at R² {second:.3f}: it no longer blows up, but it does not learn (0.4 or more is "
        f"the goal). A change that only stops the loss from becoming inf is not a rescue; try another setting"
    ) + (f" (you changed {changed[0]})")
    passed("07.1")


def check_lars_trust_ratio(lars_trust_ratio: Callable[[torch.Tensor, torch.Tensor, float, float], float]) -> None:
    """07.2: LARS's ratio η‖w‖ / (‖g‖ + wd‖w‖ + eps), and 1 when either norm is zero."""
    from dlscale.optim.layerwise import LARS

    generator = torch.Generator().manual_seed(3)
    cases = [
        (torch.randn(8, 4, generator=generator), torch.randn(8, 4, generator=generator) * 0.01, 1e-4, 1e-3),
        (torch.randn(16, generator=generator).reshape(4, 4) * 5, torch.randn(4, 4, generator=generator), 0.1, 0.02),
        (torch.zeros(3, 3), torch.randn(3, 3, generator=generator), 1e-4, 1e-3),
        (torch.randn(3, 3, generator=generator), torch.zeros(3, 3), 1e-4, 1e-3),
    ]
    for weight, grad, weight_decay, eta in cases:
        param = torch.nn.Parameter(weight.clone())
        param.grad = grad.clone()
        reference = LARS([param], lr=1.0, momentum=0.0, weight_decay=weight_decay, trust_coefficient=eta)
        reference.step()
        expected = float(reference.trust_ratios[0][0])
        answer = float(lars_trust_ratio(weight, grad, weight_decay, eta))
        assert abs(answer - expected) <= 1e-6 * max(1.0, abs(expected)), (
            f"‖w‖={float(weight.norm()):.3g}, ‖g‖={float(grad.norm()):.3g}, weight_decay={weight_decay}, "
            f"η={eta}: got {answer:.6g}, expected {expected:.6g}. The ratio is η‖w‖ / (‖g‖ + weight_decay·‖w‖ + 1e-8), "
            f"and exactly 1 when ‖w‖ or ‖g‖ is 0"
        )
    passed("07.2")


# -- 07.3: LR scaling and warmup, in the plain loop ----------------------------------------------------------


#: 07.3's setting: an LR tuned at batch 32, a run at batch 256 of 40 steps, 8 of them warmup.
SCHEDULE = {"lr": 0.01, "batch_size": 256, "base_batch": 32, "warmup_steps": 8, "total_steps": 40}


def _lr_trace(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> list[float]:
    trace = []
    for _ in range(steps):
        trace.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # (no gradients: nothing moves, only the schedule advances)
        scheduler.step()
    return trace


def check_lr_schedule(scaled_schedule: Callable[..., tuple[torch.optim.Optimizer, Any]]) -> None:
    """07.3: the linearly scaled peak LR, warmup from the unscaled LR, then a cosine to 0, as a LambdaLR."""
    from dlscale.optim.schedules import lr_trace

    s = SCHEDULE
    optimizer, scheduler = scaled_schedule(nn.Linear(4, 1), **s)
    trace = _lr_trace(optimizer, scheduler, s["total_steps"])
    peak = s["lr"] * s["batch_size"] / s["base_batch"]
    expected = lr_trace(peak, s["warmup_steps"], s["total_steps"], "cosine", s["lr"] / peak)
    if all(abs(a - b) <= 1e-9 * peak for a, b in zip(trace, expected)):
        return passed("07.3")
    top = max(trace)
    if abs(top - s["lr"]) < 1e-12:
        raise AssertionError(
            f"the LR never exceeds {s['lr']}: it is not scaled. With a batch {s['batch_size'] // s['base_batch']}"
            f"x larger take {s['batch_size'] // s['base_batch']}x fewer steps of a "
            f"{s['batch_size'] // s['base_batch']}x larger LR: lr * batch_size / base_batch"
        )
    if abs(top - s["lr"] * (s["batch_size"] / s["base_batch"]) ** 0.5) < 1e-9:
        raise AssertionError(
            "the peak is lr * sqrt(k): that is the square-root rule; this exercise asks for the "
            "linear one, lr * batch_size / base_batch"
        )
    if trace[0] == 0:
        raise AssertionError(
            "the first step's LR is 0: the first step would not move. Start the warmup at the "
            "unscaled lr (a factor of lr / peak at step 0)"
        )
    if abs(trace[0] - peak) < 1e-9:
        raise AssertionError(
            f"the first step already takes the peak LR {peak:g}: no warmup. Rise linearly from lr to "
            f"the peak over warmup_steps steps"
        )
    raise AssertionError(
        f"the LR by step differs from the reference: got {[round(v, 4) for v in trace[:10]]}..., "
        f"expected {[round(v, 4) for v in expected[:10]]}...: warmup from lr to the peak over "
        f"warmup_steps, then 0.5 * (1 + cos(pi * progress)) down to 0 at total_steps"
    )
