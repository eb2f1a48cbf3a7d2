"""Lesson 04, profiling: its question, reading, conclusion and exercise checks (04.1, 04.2)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch

from dlscale.bench.repeats import Spread, clearly_faster
from dlscale.lessons.lesson_tools import Question, Reading, compare_spreads, passed

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "COMPILE",
    "LARGEST_RANGE",
    "check_annotated_loop",
    "check_slowest_phase",
    "ladder_conclusions",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _compiled(compiled: Spread, plain: Spread) -> str:
    return "a" if clearly_faster(compiled, plain) else "c" if clearly_faster(plain, compiled) else "b"


COMPILE = Question(
    "your stage compiled with torch.compile, against not compiled, on this machine: its steady samples/s are...",
    {"a": "clearly faster", "b": "not told apart", "c": "clearly slower"},
    _compiled,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _largest_range(times: dict[str, float], marked: Collection[str]) -> tuple[Callable[[Any], bool], str]:
    own = {name: ms for name, ms in times.items() if name in marked}
    if not own:
        return (lambda answer: False), f"none of the ranges {sorted(marked)} in your trace"
    top = max(own.values())
    near = [name for name, ms in own.items() if ms >= 0.9 * top]  # (within 10%: not told apart by one window)
    shows = (
        ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(own.items(), key=lambda item: -item[1])) + " per step"
    )
    return (lambda answer: answer in near), shows


LARGEST_RANGE = Reading(
    "which of your stage's own ranges takes the most time in a step?",
    "a range's name, as your table prints it",
    _largest_range,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def ladder_conclusions(rows: list[dict[str, Any]]) -> list[str]:
    """For each measured rung of ``bench_ladder(rounds > 1)``: did it help, hurt, or neither?"""
    measured = [r for r in rows if "rates" in r]
    lines = [
        compare_spreads(row["rung"], Spread(row["rates"]), previous["rung"], Spread(previous["rates"]))
        for previous, row in zip(measured, measured[1:])
    ]
    lines += [f"{r['rung']}: skipped ({r['skipped']})." for r in rows if "skipped" in r]
    return lines


# -- the exercises' checks -----------------------------------------------------------------------------------


def check_annotated_loop(train_steps: Callable[[int], None]) -> None:
    """04.1: every step of the loop marks data, forward, backward and optimizer with nvtx_range."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        train_steps(3)
    counts = {event.key: event.count for event in profiler.key_averages()}
    missing = [name for name in ("data", "forward", "backward", "optimizer") if counts.get(name, 0) < 3]
    assert not missing, (
        f"ranges missing or not marked every step: {missing} (found {sorted(counts.get(n, 0) for n in missing)} "
        f"calls); wrap each phase of each step in `with nvtx_range(name):`"
    )
    # A range must hold its phase's work, not just exist: `with nvtx_range("forward"): pass` would profile nothing.
    events = list(profiler.events())
    spans = {name: [(e.time_range.start, e.time_range.end) for e in events if e.name == name] for name in counts}
    work = {
        "data": ("aten::randn", "aten::normal_", "aten::rand"),
        "forward": ("aten::linear", "aten::addmm", "aten::mm"),
        "backward": ("Backward",),
        "optimizer": ("Optimizer.step", "aten::_foreach", "aten::add_"),
    }
    empty = [
        phase
        for phase, ops in work.items()
        if not any(
            any(op in e.name for op in ops)
            and any(s <= e.time_range.start and e.time_range.end <= t for s, t in spans.get(phase, []))
            for e in events
            if e.name != phase
        )
    ]
    assert not empty, (
        f"the range(s) {empty} hold none of their phase's work: put the batch creation, the model "
        f"call and the loss, loss.backward() and optimizer.step() inside their `with` blocks"
    )
    passed("04.1")


def check_slowest_phase(slowest: Callable[[list[dict], str], str]) -> None:
    """04.2: the phase that costs most per step on the device doing the work: its device time on a GPU
    (where the CPU time of a range is mostly kernel launches), its whole CPU time on a CPU."""

    def profile(times: dict[str, tuple[float, float, float]]) -> list[dict]:
        return [
            {"name": name, "cpu_ms_per_step": cpu, "self_cpu_ms_per_step": own, "device_ms_per_step": device}
            for name, (cpu, own, device) in times.items()
        ]

    # (CPU time, self CPU time, device time) per step, in ms. On the GPU the optimizer launches many small
    # kernels (CPU time), while the backward pass runs the big ones (device time).
    cases = [
        (
            "cpu",
            profile(
                {
                    "data": (2.0, 1.9, 0.0),
                    "forward": (3.0, 0.1, 0.0),
                    "backward": (6.0, 0.2, 0.0),
                    "optimizer": (1.0, 0.9, 0.0),
                }
            ),
            "the CPU does the work there, so compare each range's whole CPU time (cpu_ms_per_step, its children "
            "included; the self time leaves out the operators it called)",
        ),
        (
            "cuda:0",
            profile(
                {
                    "data": (0.4, 0.3, 0.2),
                    "forward": (1.5, 0.1, 3.1),
                    "backward": (1.2, 0.1, 6.4),
                    "optimizer": (4.8, 0.6, 0.9),
                }
            ),
            "the CPU time of a range there measures how long the CPU took to launch its kernels, which run later "
            "on the GPU. Which column says how long the GPU spent on each phase?",
        ),
    ]
    for device, rows, hint in cases:
        answer = slowest(rows, device)
        assert answer == "backward", f"on {device} you chose {answer!r}: {hint}"
    passed("04.2")
