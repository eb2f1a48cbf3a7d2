"""Stage 03, mixed precision (lesson 03): the precision and the scaler, and the scaled, clipped step."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, steps_of
from dlscale.lessons.stages.step_probes import whole_step

_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": None}


def precision_choice(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Autocast runs in the dtype ``precision`` names (disabled for fp32); the scaler acts for fp16 only."""
    precision = args.get("precision", "fp32")
    enabled = [dtype for _, dtype, on in seen["autocast"] if on]
    want = _DTYPES.get(precision)
    if want is not None and not enabled:
        return (
            f"precision={precision}, but no forward pass ran under autocast "
            f"({len(seen['autocast'])} autocast block(s), none enabled)"
        )
    if want is not None and any(dtype != want for dtype in enabled):
        return f"precision={precision} wants {want}, but autocast ran in {sorted(set(enabled))}"
    if steps_of(result) and any(on != (precision == "fp16") for on in seen["scaler_enabled"]):
        state = "on" if seen["scaler_enabled"][0] else "off"
        return (
            f"the loss scaler was {state} with precision={precision}: it acts for fp16 only (fp16 gradients "
            f"underflow; bf16 keeps fp32's range)"
        )
    return None


_ORDER = ["scale", "unscale", "clip", "scaler step", "update"]


def scaled_step(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Every forward pass under autocast; the loss scaled, the gradients unscaled before they are clipped, then the
    step and the scale's update; one backward pass per step."""
    order, steps = seen["order"], steps_of(result)
    under = len([a for a in seen["autocast"] if a[2]])
    if args.get("precision", "fp32") == "fp32" and under:
        dtype = next(dtype for _, dtype, on in seen["autocast"] if on)
        return f"precision=fp32, but autocast ran in {dtype}: under fp32 autocast is switched off (its enabled=)"
    if args.get("precision", "fp32") != "fp32" and under < steps:
        return f"{under} forward passes under autocast in {steps} steps: every step's forward pass and loss"
    step = order[: order.index("update") + 1] if "update" in order else order
    # (a disabled scaler's calls do nothing: without one, only the clip before the step is asked for)
    want = _ORDER if any(seen["scaler_enabled"]) else ["clip"]
    calls = [name for name in step if name in want]
    if calls != want:
        if "clip" in calls and "unscale" in calls and calls.index("clip") < calls.index("unscale"):
            return (
                "the gradients were clipped before they were unscaled: the clip compared the scaled gradients "
                "(thousands of times too large under fp16) with `clip`"
            )
        missing = [name for name in want if name not in calls]
        return (
            f"the first step called {calls or 'none of'} of the scaler and the clip, without {missing}: the "
            f"loss scaled for the backward pass, the gradients unscaled and clipped, then the step and the update"
        )
    return whole_step(seen, args, result)


STAGE = Stage(
    lesson="03",
    file="03_mixed_precision.py",
    runs_on="kernel",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "norm": "group",
        "channels_last": False,
    },  # (a constant LR, the recipe's group norm)
    by_numbers=((), ("03.a", "03.b")),
    switches=({"precision": "fp32"}, {"precision": "bf16"}, {"precision": "fp16"}),
    gaps=(
        Gap(
            id="03.a",
            title="the precision and the scaler",
            first="dtype = {",
            last="scaler = torch.amp.GradScaler(",
            asks="`dtype`, the reduced precision that `precision` names (None for fp32), and `scaler`, a loss scaler "
            "for this device that acts for fp16 only (bf16 has fp32's range)",
            question="Which of fp32, bf16 and fp16 can lose small gradients to underflow, and so which of them "
            "needs the loss scaled?",
            api="torch.bfloat16, torch.float16; torch.amp.GradScaler(device.type, enabled=...)",
            probe=precision_choice,
            mistakes=(
                Variant(
                    "the scaler off for fp16",
                    (
                        (
                            'scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")',
                            "scaler = torch.amp.GradScaler(device.type, enabled=False)",
                        ),
                    ),
                ),
                Variant(
                    "the scaler on for bf16",
                    (
                        (
                            'scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")',
                            'scaler = torch.amp.GradScaler(device.type, enabled=precision != "fp32")',
                        ),
                    ),
                ),
                Variant(
                    "fp16 and bf16 swapped",
                    (
                        (
                            'dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]',
                            'dtype = {"bf16": torch.float16, "fp16": torch.bfloat16, "fp32": None}[precision]',
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "an if/elif chain",
                    (
                        (
                            'dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]',
                            'dtype = None\nif precision == "bf16":\n    dtype = torch.bfloat16\nelif precision == "fp16":\n    dtype = torch.float16',
                        ),
                    ),
                ),
                Variant(
                    "enabled by the dtype",
                    (
                        (
                            'scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")',
                            "scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="03.b",
            title="the scaled, clipped step",
            first="with torch.autocast(",
            last="scaler.update()",
            asks="the step in that precision: forward and loss in `dtype` (in full precision for fp32), backward of "
            "the loss scaled up, the gradients clipped to `clip` at their true size, then the step and the "
            "scale's update (a step whose gradients overflowed is skipped)",
            question="If the loss was multiplied by S before the backward pass, what size are the gradients the "
            "clip sees, and what must happen to them first? What keeps fp32 runs in full precision?",
            api="torch.autocast(device.type, dtype=..., enabled=...); scaler.scale(loss).backward(); "
            "scaler.unscale_(optimizer); nn.utils.clip_grad_norm_(...); scaler.step(optimizer); scaler.update()",
            probe=scaled_step,
            mistakes=(
                Variant(
                    "clipped before unscaled",
                    (
                        ("nn.utils.clip_grad_norm_(model.parameters(), clip)", "pass"),
                        (
                            "scaler.unscale_(optimizer)",
                            "nn.utils.clip_grad_norm_(model.parameters(), clip)\nscaler.unscale_(optimizer)",
                        ),
                    ),
                ),
                Variant(
                    "autocast always on",
                    (
                        (
                            "with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):",
                            "with torch.autocast(device.type, dtype=dtype):",
                        ),
                    ),
                ),
                Variant("the loss not scaled", (("scaler.scale(loss).backward()", "loss.backward()"),)),
                Variant(
                    "two backward passes",
                    (
                        (
                            "scaler.scale(loss).backward()",
                            "scaler.scale(loss).backward(retain_graph=True)\nscaler.scale(loss).backward()",
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "keywords, and enabled from the precision",
                    (
                        (
                            "with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):",
                            'with torch.autocast(device_type=device.type, dtype=dtype or torch.float32, enabled=precision != "fp32"):',
                        ),
                    ),
                ),
                Variant(
                    "the clip's keyword",
                    (
                        (
                            "nn.utils.clip_grad_norm_(model.parameters(), clip)",
                            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)",
                        ),
                    ),
                ),
            ),
        ),
    ),
)
