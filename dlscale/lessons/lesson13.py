"""Lesson 13, the pipeline and the 3-D mesh: its question, readings, the bubble measured on the attendee's stage,
and exercise 13.1's check.

The bubble is measured on the attendee's own file (``recipes/13_pipeline.py`` as they wrote it): a short run per
schedule and micro-batch count on the notebook's engines, each rank watched
(:func:`~dlscale.lessons.stage_probes.watched_rank`), which times every training step and the part of it the rank
spent in its own stages' forwards and backwards, and counts the activations it held for backward passes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlscale.lessons.lesson_tools import Question, Reading, as_number, passed

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "BUBBLE_SHARE",
    "HELD_ACTIVATIONS",
    "PIPELINE_BUBBLE",
    "bubble_conclusion",
    "check_idle_share",
    "format_bubble",
    "measure_bubble",
]

#: The steps of each run that are not timed: the first builds the stages' buffers (shape inference), the second
#: still pays for first allocations.
WARM_STEPS = 2

# -- asked before the measurement ----------------------------------------------------------------------------


def _row(rows: list[dict[str, Any]], schedule: str, microbatches: int | None = None) -> dict[str, Any] | None:
    """The row of ``schedule`` at ``microbatches`` (None: the most micro-batches measured with it)."""
    found = [r for r in rows if r["schedule"] == schedule and microbatches in (None, r["microbatches"])]
    return max(found, key=lambda r: r["microbatches"], default=None)


def _gpipe_bubble(rows: list[dict[str, Any]]) -> str | None:
    row = _row(rows, "gpipe", 4)
    if row is None or row["ranks"] != 2:
        return None
    return "a" if row["idle_share"] < 0.1 else "b" if row["idle_share"] < 0.35 else "c"


PIPELINE_BUBBLE = Question(
    "a pipeline of 2 stages runs a step as 4 micro-batches with GPipe (all forwards, then all backwards). What "
    "share of the step does each stage wait, idle?",
    {"a": "about 0%: each stage always has a micro-batch to work on", "b": "about 20%", "c": "about 50%"},
    _gpipe_bubble,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _bubble_share(rows: list[dict[str, Any]]) -> tuple[Callable[[Any], bool], str]:
    row = _row(rows, "1f1b")
    if row is None:
        return (lambda answer: False), "no 1f1b run (see bubble_schedules in the parameters cell)"
    percent = 100 * row["idle_share"]
    shows = (
        f"with 1f1b at {row['microbatches']} micro-batches your stages idled {percent:.0f}% of a step "
        f"(the textbook says {100 * row['textbook']:.0f}%)"
    )
    return (lambda answer: (n := as_number(answer)) is not None and abs(n - percent) <= 10), shows


BUBBLE_SHARE = Reading(
    "with 1f1b at the most micro-batches in your table, what share of a step did your stages idle, in percent?",
    "a number, within 10 of your table's",
    _bubble_share,
)


def _held_ratio(rows: list[dict[str, Any]]) -> tuple[Callable[[Any], bool], str]:
    both = [(_row(rows, "gpipe", r["microbatches"]), r) for r in rows if r["schedule"] == "1f1b"]
    both = [(g, f) for g, f in both if g is not None and f["held_peak"] > 0]
    if not both:
        return (lambda answer: False), "no micro-batch count measured with both gpipe and 1f1b"
    gpipe, one_f = max(both, key=lambda pair: pair[1]["microbatches"])
    ratio = gpipe["held_peak"] / one_f["held_peak"]
    shows = (
        f"at {gpipe['microbatches']} micro-batches a stage held at most {gpipe['held_peak'] / 2**10:,.0f} KiB of "
        f"activations with gpipe and {one_f['held_peak'] / 2**10:,.0f} KiB with 1f1b: {ratio:.2f}x"
    )
    return (lambda answer: (n := as_number(answer)) is not None and abs(n - ratio) <= 0.2 * ratio), shows


HELD_ACTIVATIONS = Reading(
    "at the most micro-batches measured with both, how many times 1F1B's peak of held activations per stage "
    "did GPipe hold?",
    "a number, within 20% of your table's ratio",
    _held_ratio,
    variable="my_held_reading",
)

# -- the bubble, measured on the attendee's stage ------------------------------------------------------------


def _steady(steps: list[dict[str, float]]) -> tuple[float, float]:
    """(step seconds, idle share): the medians over the steps after :data:`WARM_STEPS`."""
    timed = steps[WARM_STEPS:] or steps
    if not timed:
        raise RuntimeError("the stage took no training step: give it more samples (steps)")
    step = statistics.median(s["step_s"] for s in timed)
    idle = statistics.median(max(0.0, 1 - s["busy_s"] / s["step_s"]) for s in timed if s["step_s"] > 0)
    return step, idle


def _bubble_row(schedule: str, count: int, virtual: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the table from every rank's watched run."""
    from dlscale.distributed.pipeline import textbook_bubble

    steady = [_steady(rank["seen"]["pipeline_steps"]) for rank in ranks]
    return {
        "schedule": schedule,
        "microbatches": count,
        "virtual": virtual,
        "ranks": len(ranks),
        "step_ms": 1000 * max(step for step, _ in steady),  # (the pipeline's step is its slowest rank's)
        "idle_share": statistics.fmean(idle for _, idle in steady),
        "idle_by_rank": [idle for _, idle in steady],
        "textbook": textbook_bubble(len(ranks), count, virtual),
        "held_peak": max(rank["seen"]["held_activations_peak"] for rank in ranks),
        "held_by_rank": [rank["seen"]["held_activations_peak"] for rank in ranks],
    }


def measure_bubble(
    stage: str | Path,
    engines: int,
    schedules: Iterable[str] = ("gpipe", "1f1b", "interleaved-1f1b"),
    microbatches: Iterable[int] = (2, 4, 8),
    steps: int = 4,
    virtual: int = 2,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Run the stage's file on ``engines`` ranks once per schedule and micro-batch count, ``steps`` timed steps each
    (after :data:`WARM_STEPS`), and return a row per run: the step, the idle share (the mean over ranks of each
    rank's median ``1 - busy / step``) beside the textbook's, and the most activations a stage held.

    ``settings`` go to the stage's ``main`` (``workers``, ``batch_size``, ``config``: its maps are cut to the
    steps' worth). The depth is raised to ``engines × virtual`` for every run when interleaved-1f1b is measured,
    so that every schedule trains the same model."""
    from dlscale.bench.pipeline import runnable
    from dlscale.jobs.notebook_engines import run_on_engines
    from dlscale.lessons.stage_measure import MEASURED, StageFailed, whose
    from dlscale.lessons.stage_probes import small_config, watched_rank

    schedules = list(schedules)
    batch = settings.get("batch_size", 32)
    depth = max(settings.get("depth", 4), engines * (virtual if "interleaved-1f1b" in schedules else 1))
    config = small_config(str(settings.pop("config", "tiny")), batch * (WARM_STEPS + steps))
    rows = []
    # (what the schedules can run, as dlscale.bench.pipeline measures them, and a count that divides the batch)
    for schedule, count, per_rank in runnable(schedules, [m for m in microbatches if batch % m == 0], engines, virtual):
        arguments = {
            **settings,
            "config": config,
            "depth": depth,
            "epochs": 1,
            "schedule": schedule,
            "microbatches": count,
            "stages_per_rank": per_rank,
            "checkpoint": f"runs/lesson13/bubble-{schedule}-{count}",  # (beside the lesson's, never over it)
        }
        ranks = run_on_engines(watched_rank, engines, str(stage), arguments, show=False)
        failed = next((rank["error"] for rank in ranks if rank.get("error")), None)
        if failed:
            raise StageFailed(
                f"{whose(str(stage))} stopped with {schedule} at {count} micro-batches: {failed['type']}: "
                f"{failed['message'][:300]} (the stage's check names the gap; or use_ours('13'))"
            )
        MEASURED.append(ranks[0])
        rows.append({**_bubble_row(schedule, count, per_rank, ranks), "whose": whose(str(stage))})
    return rows


def format_bubble(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table: each run's step, its idle share beside the textbook's, its held activations."""
    from dlscale.reporting.tables import markdown_table

    return markdown_table(
        ["schedule", "m", "v", "step ms", "idle (measured)", "textbook (p−1)/(v·m+p−1)", "held activations per stage"],
        [
            (
                r["schedule"],
                r["microbatches"],
                r["virtual"],
                f"{r['step_ms']:.1f}",
                f"{r['idle_share']:.0%}",
                f"{r['textbook']:.0%}",
                " / ".join(f"{held / 2**10:,.0f} KiB" for held in r["held_by_rank"]),
            )
            for r in rows
        ],
    )


def bubble_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """Ours, from the attendee's rows: per schedule, how the idle share moved with the micro-batches against the
    textbook's, and what each held."""
    lines = []
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        mine = [r for r in rows if r["schedule"] == schedule]
        shares = ", ".join(f"m={r['microbatches']}: {r['idle_share']:.0%} ({r['textbook']:.0%})" for r in mine)
        held = ", ".join(f"{r['held_peak'] / 2**10:,.0f}" for r in mine)
        lines.append(
            f"{mine[0]['whose']}, {schedule} on {mine[0]['ranks']} ranks: idle {shares} (textbook in brackets); "
            f"at most {held} KiB of activations held per stage"
        )
    return lines


# -- 13.1: the textbook bubble -------------------------------------------------------------------------------


def _mistake(idle_share: Callable[..., float]) -> str:
    """What a wrong ``idle_share`` most likely computed, read from a few telling inputs."""
    plain = idle_share(2, 4)  # (the textbook: 1/5)
    if abs(plain - 1 / 5) < 1e-9:
        return "it ignores v: with v stages per rank a micro-batch's work is cut v ways, so the fill costs v·m"
    if abs(plain - 1 / 4) < 1e-9:
        return "(p − 1) / m is the idle time against the busy time; the share of the whole step divides by v·m + p − 1"
    if abs(plain - 1 / 3) < 1e-9:
        return "the pipeline fills and drains in p − 1 slots, not p: the first stage starts at once"
    return "a stage idles p − 1 slots of a step of v·m + p − 1 slots"


def check_idle_share(idle_share: Callable[..., float]) -> None:
    """13.1: ``idle_share(p, m, v=1)`` is the textbook bubble, ``(p − 1) / (v·m + p − 1)``, over a grid."""
    from dlscale.distributed.pipeline import textbook_bubble

    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 4, 8, 32):
            for v in (1, 2, 4):
                try:
                    got = idle_share(p, m) if v == 1 else idle_share(p, m, v)
                except TypeError as err:  # (a signature without v, or without its default)
                    raise AssertionError(f"idle_share takes (p, m, v=1): {err}") from None
                want = textbook_bubble(p, m, v)
                assert isinstance(got, (int, float)) and abs(got - want) < 1e-9, (
                    f"idle_share({p}, {m}{f', {v}' if v > 1 else ''}) returned {got!r}, the textbook {want:.4f}: "
                    f"{_mistake(idle_share)}"
                )
    passed("13.1")
