"""Stage 07, large batches (lesson 07): the scaled LR, warmup and decay, and the schedule's step.

The probes read the LR the optimizer used at every step and compare it with the engine's rule and schedule (the
stage's twin). A wrong peak scales the whole decay by one factor; a wrong schedule bends its shape; a schedule
never stepped keeps the first value: three mistakes told apart by the one trace. The check tries every scaling rule.
"""

from __future__ import annotations

import math
from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant


def expected_lrs(args: dict[str, Any], steps: int) -> list[float]:
    """Stage 07's LR at each step, from its arguments: the engine's scaling rule and schedule."""
    from dlscale.optim.schedules import lr_trace, scale_lr

    scaling = args["scaling"]
    if scaling == "auto":
        scaling = "sqrt" if args["optimizer_name"] in ("adamw", "lamb") else "linear"
    lr, warmup = args["lr"], args["warmup_steps"]
    peak = scale_lr(lr, args["base_batch"], args["batch_size"], scaling)
    return lr_trace(peak, warmup, steps, "cosine", lr / peak if peak > lr else 1.0 / max(1, warmup))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _trace(seen: dict[str, Any], args: dict[str, Any]) -> tuple[list[float], list[float]] | None:
    lrs = seen["lrs"]
    if not lrs or args.get("resume"):
        return None
    return lrs, expected_lrs(args, len(lrs))


def lr_advances(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The LR moved from its first value (the schedule was stepped)."""
    trace = _trace(seen, args)
    if not trace or len(trace[0]) < 2:
        return None
    lrs, want = trace
    # the first value right, then no step (where that first value is not also the peak, which a constant factor gives)
    if len(set(lrs)) == 1 and len(set(want)) > 1 and _close(lrs[0], want[0]) and not _close(want[0], max(want)):
        return (
            f"the LR stayed at {lrs[0]:.6g} for all {len(lrs)} steps: the schedule never moved on (one step of "
            f"it after every optimizer step)"
        )
    moves, wanted_moves = (sum(not _close(a, b) for a, b in zip(t, t[1:])) for t in (lrs, want))
    values = expected_lrs(args, len(lrs) + 1)
    known = all(any(_close(value, w) for w in values) for value in lrs)
    # (a value of the schedule held too long; the peak held is a constant factor instead, 07.b's mistake)
    if known and moves < wanted_moves and not any(_close(value, max(values)) for value in lrs):
        return (
            f"the LR moved {moves} time(s) in {len(lrs)} steps, each time to a value of the schedule: the schedule "
            f"was stepped less often than the optimizer (once after every optimizer step)"
        )
    ahead = expected_lrs(args, len(lrs) + 1)[1:]
    if all(_close(a, b) for a, b in zip(lrs, ahead)) and not all(_close(a, b) for a, b in zip(lrs, want)):
        return (
            f"each step used the next step's LR (first steps {[round(v, 6) for v in lrs[:3]]}, want "
            f"{[round(v, 6) for v in want[:3]]}): the schedule was stepped before the optimizer's step, not after it"
        )
    return None


def lr_peak(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """After the warmup the LR is the wanted one times one factor: that factor is the peak's error."""
    trace = _trace(seen, args)
    if not trace:
        return None
    lrs, want = trace
    after = [(got, wanted) for step, (got, wanted) in enumerate(zip(lrs, want)) if step >= args["warmup_steps"]]
    ratios = [got / wanted for got, wanted in after if wanted > 1e-12]
    if ratios and all(_close(r, ratios[0]) for r in ratios) and not _close(ratios[0], 1.0):
        peak = max(want) if max(want) > 0 else args["lr"]
        return (
            f"the LR peaked at {peak * ratios[0]:.6g}, want {peak:.6g} with scaling={args['scaling']}: lr="
            f"{args['lr']} tuned at base_batch={args['base_batch']}, scaled for batch_size={args['batch_size']} by "
            f"that rule"
        )
    return None


def lr_shape(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The LR at every step against the schedule: a straight warmup from the start, then half a cosine to 0."""
    trace = _trace(seen, args)
    if not trace:
        return None
    lrs, want = trace
    worst = max(range(len(lrs)), key=lambda i: abs(lrs[i] - want[i]))
    if not _close(lrs[worst], want[worst]):
        return (
            f"the LR at step {worst} was {lrs[worst]:.6g}, want {want[worst]:.6g} (first steps: "
            f"{[round(v, 6) for v in lrs[:4]]}, want {[round(v, 6) for v in want[:4]]}, with "
            f"warmup_steps={args['warmup_steps']}): a straight rise from the start over the warmup, then half a "
            f"cosine to 0 at the last step"
        )
    return None


STAGE = Stage(
    lesson="07",
    file="07_large_batch.py",
    runs_on="ranks",
    twin={"norm": "group", "channels_last": True},  # (stage 07's own warmup and decay)
    by_numbers=((), ("07.a", "07.b", "07.c")),
    switch_samples=256,  # (4 steps of the lesson's batch of 64: one of warmup, three of decay)
    probe_order=("07.c", "07.a", "07.b"),  # (a schedule never stepped also bends the shape: say the cause)
    # every rule (linear at another batch), warmup over one step so that a short run reaches the decay, and none
    switches=(
        {"scaling": "linear", "warmup_steps": 1, "batch_size": 128},  # (k = 4: not the ranks' count, as 64 gives on 2)
        {"scaling": "sqrt", "warmup_steps": 1},
        {"scaling": "none", "warmup_steps": 1},
        {"warmup_steps": 0},
    ),
    gaps=(
        Gap(
            id="07.a",
            title="the scaled LR",
            first="peak_lr = lr * {",
            last="peak_lr = lr * {",
            asks="`peak_lr`: `lr` was tuned at `base_batch`; for a batch k = batch_size / base_batch times larger, "
            "scale it by the rule `scaling` names: by k, by the square root of k, or not at all",
            question="A k times larger batch takes k times fewer steps: how much further should each step go under "
            "each of the three rules, and what is k here?",
            api='lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]',
            probe=lr_peak,
            mistakes=(
                Variant(
                    "not scaled",
                    (('peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]', "peak_lr = lr"),),
                ),
                Variant(
                    "k inverted", (("k = batch_size / base_batch", "k = base_batch / batch_size"),), names="outside"
                ),
                Variant("a rule broken for one of its values", (('"none": 1.0', '"none": k'),)),
            ),
            alternatives=(
                Variant(
                    "an if/elif chain",
                    (
                        (
                            'peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]',
                            'if scaling == "linear":\n    peak_lr = lr * k\nelif scaling == "sqrt":\n    peak_lr = lr * k ** 0.5\nelse:\n    peak_lr = lr',
                        ),
                    ),
                ),
                Variant(
                    "powers",
                    (
                        (
                            'peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]',
                            'peak_lr = lr * {"linear": k, "sqrt": k ** 0.5, "none": 1}[scaling]',
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="07.b",
            title="warmup and decay",
            first="if step < warmup_steps:",
            last="return 0.5 * (1 + math.cos(",
            asks="the factor of peak_lr at `step`: a straight line from `start` up to 1 over the warmup steps, then "
            "half a cosine down to 0 at the last step",
            question="At step 0 the factor is `start`, at the end of the warmup 1, at the last step 0: what shape "
            "joins them, and what fraction of the decay has passed at `step`?",
            api="start + (1 - start) * step / warmup_steps; 0.5 * (1 + math.cos(math.pi * progress))",
            probe=lr_shape,
            mistakes=(
                Variant(
                    "no warmup, no decay",
                    (
                        ("if step < warmup_steps:", "if True:"),
                        ("return start + (1 - start) * step / warmup_steps", "return 1.0"),
                    ),
                ),
                Variant(
                    "warmup counted in epochs",
                    (
                        ("if step < warmup_steps:", "if step < warmup_steps * (total_steps // epochs):"),
                        ("step / warmup_steps", "step / (warmup_steps * (total_steps // epochs))"),
                    ),
                ),
                Variant("a full cosine", (("math.cos(math.pi *", "math.cos(2 * math.pi *"),)),
            ),
            alternatives=(
                Variant("min() in the warmup", (("step / warmup_steps", "min(1.0, step / warmup_steps)"),)),
                Variant(
                    "the progress named",
                    (
                        (
                            "return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))",
                            "progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))\nreturn (1 + math.cos(math.pi * progress)) / 2",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="07.c",
            title="the schedule's step",
            first="scheduler.step()",
            last="scheduler.step()",
            asks="the learning rate moves along the schedule: one step of it after every optimizer step",
            question="The schedule knows the factor at each step: what tells it that a step has passed, and when?",
            api="scheduler.step()",
            probe=lr_advances,
            mistakes=(
                Variant("never stepped", (("scheduler.step()", "pass"),)),
                Variant(
                    "stepped once per epoch",
                    (("scheduler.step()", "pass"), ("progress.begin()", "progress.begin()\nscheduler.step()")),
                ),
                Variant(
                    "stepped before the optimizer",
                    (
                        ("scheduler.step()", "pass"),
                        ("scaler.step(optimizer)", "scheduler.step()\nscaler.step(optimizer)"),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "stepped after the loss is logged",
                    (("scheduler.step()", "pass"), ("progress.step(loss)", "progress.step(loss)\nscheduler.step()")),
                ),
                Variant(
                    "stepped between the scaler's step and its update",
                    (("scheduler.step()", "pass"), ("scaler.update()", "scheduler.step()\nscaler.update()")),
                ),
            ),
        ),
    ),
)
