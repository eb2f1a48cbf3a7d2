"""Stage 04, profiling and compiling (lesson 04): the compiled model, and the step's named ranges."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, steps_of
from dlscale.lessons.stages.step_probes import whole_step


def compiled(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """With ``compile`` on, the loss comes from a compiled module every step; with it off, from none."""
    steps, calls = steps_of(result), seen["compiled_calls"]
    if args.get("compile", False) and calls < steps:
        made = f" and torch.compile ran {seen['compiled']} time(s)" if seen["compiled"] else ""
        return (
            f"compile=True{made}, but the loop called a compiled module {calls} time(s) in {steps} steps: the "
            f"module the loop calls must be the compiled one (compiling returns a new module)"
        )
    if not args.get("compile", False) and calls:
        return f"compile=False, but a compiled module ran {calls} time(s): the switch must turn compilation off"
    if seen["compiled_names_saved"]:
        return (
            "the checkpoint holds the compiled module's names (_orig_mod.…): the loop may call the compiled module, "
            "but the model saved (and trained without compiling) is the plain one it was made from"
        )
    unfused = sorted({backend for backend in seen["compile_backends"] if backend not in ("inductor", "None")})
    if args.get("compile", False) and unfused:
        return f"compiled with backend {unfused}, which fuses no kernels: PyTorch 2's compiler is inductor's backend"
    return None


PHASES = ("forward", "backward", "optimizer step")


def named_phases(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Each step's forward (with the loss), backward and optimizer step, each inside the range of its name; the
    profiling window told of every step."""
    steps = steps_of(result)
    short = {name: seen["ranges"].get(name, 0) for name in PHASES if seen["ranges"].get(name, 0) < steps}
    if short:
        return (
            f"in {steps} steps the profiler saw the ranges {short} times: each step's forward, backward and "
            f"optimizer step inside a range of that name (other names: {sorted(set(seen['ranges']) - set(PHASES))})"
        )
    held = seen["range_events"]
    for name in PHASES:
        inside = {event: held.get(name, {}).get(event, 0) for event in ("backward", "optimizer step")}
        wrong = [event for event, count in inside.items() if bool(count) != (event == name)]
        if wrong:
            said = ", ".join(f"{count} {event}(s)" for event, count in inside.items())
            return (
                f'the range "{name}" held {said} in {steps} steps: each range must hold the phase of its name '
                f"(the forward pass and the loss, the backward pass, the optimizer's step)"
            )
    outside = {name: count for name, count in seen["loss_ranges"].items() if name != "forward"}
    if outside:
        return (
            f'the loss was computed outside the range "forward" in {sum(outside.values())} of {steps} steps (in '
            f"{sorted(outside)}): the forward range holds the model's forward pass and the loss"
        )
    if seen["window_steps"] != steps:
        return (
            f"the profiling window heard of {seen['window_steps']} steps in {steps}: it must be told at the end "
            f"of every step, or it records the wrong ones"
        )
    return whole_step(seen, args, result)


STAGE = Stage(
    lesson="04",
    file="04_compile.py",
    runs_on="kernel",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "norm": "group",
        "channels_last": True,
    },  # (a constant LR; NHWC from stage 04 on)
    by_numbers=((), ("04.a", "04.b")),
    switches=({"compile": False},),
    gaps=(
        Gap(
            id="04.a",
            title="the compiled model",
            first="step_model = torch.compile(",
            last="step_model = torch.compile(",
            asks="`step_model`, the model the loop calls: turned into fused kernels by PyTorch 2's compiler when that "
            "switch is on, the plain model otherwise",
            question="Compiling does not change the model in place: what does it give back, and which of the two "
            "must the loop call when the switch is on, and when it is off?",
            api="torch.compile(model)",
            probe=compiled,
            mistakes=(
                Variant(
                    "the compiled module thrown away",
                    (
                        (
                            "step_model = torch.compile(model) if compile else model",
                            "if compile:\n    torch.compile(model)\nstep_model = model",
                        ),
                    ),
                    {"compile": True},
                ),
                Variant(
                    "never compiled",
                    (("step_model = torch.compile(model) if compile else model", "step_model = model"),),
                    {"compile": True},
                ),
                Variant(
                    "compiled whatever the switch",
                    (("step_model = torch.compile(model) if compile else model", "step_model = torch.compile(model)"),),
                    {"compile": False},
                ),
            ),
            alternatives=(
                Variant(
                    "an if/else statement",
                    (
                        (
                            "step_model = torch.compile(model) if compile else model",
                            "if compile:\n    step_model = torch.compile(model)\nelse:\n    step_model = model",
                        ),
                    ),
                ),
                Variant(
                    "the switch read the other way",
                    (
                        (
                            "step_model = torch.compile(model) if compile else model",
                            "step_model = model if not compile else torch.compile(model, dynamic=False)",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="04.b",
            title="the named phases",
            first='with marked("forward")',
            last="window.step()",
            asks='stage 03\'s step, each of its phases a named range the profilers show ("forward" with the loss, '
            '"backward", "optimizer step"); then the loss logged and the profiling window told that a step '
            "ended",
            question="A profiler's table groups time by named ranges: which three phases does one step have, and "
            "which lines belong to each? What must the profiling window hear after each step?",
            api='with marked("forward"): ... (training_tools.marked); progress.step(loss); window.step()',
            probe=named_phases,
            mistakes=(
                Variant(
                    "two range names swapped",
                    (
                        ('marked("forward")', 'marked("backward")'),
                        ('with marked("backward"):', 'with marked("forward"):'),
                    ),
                ),
                Variant("a range named otherwise", (('"optimizer step"', '"update"'),)),
                Variant("the window never told", (("window.step()", "pass"),)),
            ),
            alternatives=(
                Variant(
                    "the profiler's own ranges",
                    (('with marked("backward"):', 'with torch.profiler.record_function("backward"):'),),
                ),
                Variant(
                    "the contexts in the other order",
                    (
                        (
                            'with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):',
                            'with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None), marked("forward"):',
                        ),
                    ),
                ),
            ),
        ),
    ),
)
