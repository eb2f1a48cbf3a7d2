"""Think first, then see: a question a lesson asks before it measures, and the answer read from the measurement.

A lesson shows the question and its choices, and a cell holds ``prediction = None`` for the
attendee's letter; the cells after it measure, and ``QUESTION.verdict(prediction, ...)`` prints
the prediction beside the choice the numbers support. Each question's ``outcome`` reads the
measurement the lesson has just made, with the same rules as the conclusions printed after it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlscale.bench.repeats import Spread, clearly_faster


@dataclass(frozen=True)
class Question:
    """A multiple-choice question about a measurement, and how to read its answer from the numbers."""

    text: str
    choices: dict[str, str]
    outcome: Callable[..., str | None]  # the measurement -> the letter it supports (None: not measured)

    def markdown(self) -> str:
        """The question and its choices, for the cell before the measurement."""
        return f"**Predict first:** {self.text}\n\n" + "\n".join(f"- ({k}) {v}" for k, v in self.choices.items())

    def ask(self) -> None:
        """Show :meth:`markdown` in a notebook (the cell that asks also holds ``prediction = None``)."""
        from IPython.display import Markdown, display

        display(Markdown(self.markdown()))

    def verdict(self, prediction: str | None, *measurement: Any) -> str:
        """The attendee's prediction beside what ``measurement`` shows."""
        answer = self.outcome(*measurement)
        if prediction is not None and prediction not in self.choices:
            raise ValueError(
                f"prediction must be one of {', '.join(map(repr, self.choices))} (or None); got {prediction!r}"
            )
        if answer is None:
            return "This run did not measure it (see the parameters cell)."
        shown = f"the measurement says ({answer}) {self.choices[answer]}"
        if prediction is None:
            return f"No prediction was made (set `prediction` before running the measurement); {shown}."
        if prediction == answer:
            return f"You predicted ({prediction}), and {shown}."
        return f"You predicted ({prediction}) {self.choices[prediction]}; {shown}. Why? Read on."


def _convergence(r2: list[float]) -> str:
    return "b" if any(later < earlier for earlier, later in zip(r2, r2[1:])) else "a"


def _loader(supply: Spread, demand: Spread) -> str:
    return "a" if clearly_faster(supply, demand) else "b" if clearly_faster(demand, supply) else "c"


def _precision(r2: dict[str, float], spread: float) -> str:
    return "a" if max(r2.values()) - min(r2.values()) <= spread else "b"


def _strong_scaling(rows: list[dict[str, Any]]) -> str | None:
    efficiency = next(
        (r["efficiency"] for r in rows if r["mode"] == "strong" and r["processes"] > min(q["processes"] for q in rows)),
        None,
    )
    if efficiency is None:
        return None
    return "a" if efficiency >= 0.9 else "b" if efficiency >= 0.5 else "c"


def _no_scaling_keeps_up(rows: list[dict[str, Any]], tolerance: float = 0.02) -> str | None:
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    largest = max(r["multiple"] for r in rows if r["recipe"] != "baseline")
    run = next((r for r in rows if r["recipe"] == "no scaling" and r["multiple"] == largest), None)
    if run is None:
        return None
    return "a" if math.isfinite(run["val_r2"]) and run["val_r2"] >= baseline["val_r2"] - tolerance else "b"


def _noise_scale(b_simple: float, batches: list[int]) -> str:
    return "a" if b_simple < min(batches) else "c" if b_simple > max(batches) else "b"


def _fsdp_memory(rows: list[dict[str, Any]]) -> str | None:
    row = next((r for r in rows if r["layout"].startswith("FSDP") and r["processes"] == 2), None)
    if row is None:
        return None
    return "a" if row["held_vs_ddp"] >= 0.75 else "b" if row["held_vs_ddp"] >= 0.375 else "c"


def _compiled(compiled: Spread, plain: Spread) -> str:
    return "a" if clearly_faster(compiled, plain) else "c" if clearly_faster(plain, compiled) else "b"


def _horovod_same(difference: float) -> str:
    return "a" if difference < 1e-4 else "b"


CONVERGENCE = Question(
    "epoch by epoch, the validation R² of this run...",
    {"a": "rises in every epoch", "b": "falls in at least one epoch"},
    _convergence,
)
LOADER = Question(
    "can one process read and augment maps as fast as the model trains on plain ones?",
    {
        "a": "yes: the loader alone is clearly faster",
        "b": "no: the step would be starved",
        "c": "too close to tell apart",
    },
    _loader,
)
PRECISION = Question(
    "after the same training, the validation R² of fp32, bf16 and fp16...",
    {
        "a": "agree within the spread fp32 shows between two seeds",
        "b": "differ by more: a 16-bit format loses accuracy",
    },
    _precision,
)
STRONG_SCALING = Question(
    "two ranks on this machine split the same global batch (strong scaling); the efficiency is...",
    {"a": "90% or more", "b": "between 50% and 90%", "c": "below 50%"},
    _strong_scaling,
)
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
COMPILE = Question(
    "your stage compiled with torch.compile, against not compiled, on this machine: its steady samples/s are...",
    {"a": "clearly faster", "b": "not told apart", "c": "clearly slower"},
    _compiled,
)
HOROVOD_SAME = Question(
    "Horovod averages the gradients through the optimizer, DDP through the model; after the same "
    "steps on 2 ranks, Horovod's weights against one process's differ by...",
    {"a": "rounding only (below 1e-4)", "b": "more: Horovod trains another model"},
    _horovod_same,
)
FSDP_MEMORY = Question(
    "on 2 ranks, what FSDP holds per rank (parameters, gradients, optimizer state), against DDP, is...",
    {"a": "about the same", "b": "about half", "c": "about a quarter"},
    _fsdp_memory,
)


def _largest_part(result: dict[str, Any]) -> str | None:
    row = max(result["rows"], key=lambda r: r["size"])
    if row["size"] == min(r["size"] for r in result["rows"]):
        return None
    top, second = sorted(("io", "communication", "rest"), key=lambda p: -row[p])[:2]
    if result.get("rounds", 1) > 1 and row["range"][top][0] <= row["range"][second][1]:
        return "d"  # (the rounds disagree on which part is largest: the same rule as breakdown_conclusions)
    return {"io": "a", "communication": "b", "rest": "c"}[top]


LARGEST_LOSS = Question(
    "at the largest size of the breakdown, the largest part of the lost efficiency is...",
    {
        "a": "exposed I/O (the loader)",
        "b": "exposed communication (the all-reduce)",
        "c": "the rest (compute that does not scale: ranks sharing cores)",
        "d": "too close to tell: the rounds disagree on which part is largest",
    },
    _largest_part,
)


#: The samplers lesson 12 compares with pruning off, in the order of BEST_PER_COST's choices.
SEARCHES = ("grid", "random", "tpe")


def best_within(points: list[tuple[float, float]], budget: float) -> float:
    """The best value a search had found once it had spent ``budget`` (points: (spent, best so far))."""
    found = [best for spent, best in points if spent <= budget * (1 + 1e-9) and math.isfinite(best)]
    return max(found, default=-math.inf)


def repeated_searches(progress: dict[str, list[list[tuple[float, float]]]]) -> dict[str, dict[str, Any]]:
    """Each way of searching, repeated over seeds (``progress[way]``: one list of points per seed): the best found
    within the common budget (what the cheapest study of all spent) and the node-hours spent, per seed, with their
    median and range."""
    budget = min(points[-1][0] for studies in progress.values() for points in studies if points)
    out = {}
    for way, studies in progress.items():
        best = [best_within(points, budget) for points in studies]
        spent = [points[-1][0] if points else 0.0 for points in studies]
        out[way] = {
            "best": best,
            "median": statistics.median(best),
            "low": min(best),
            "high": max(best),
            "spent": spent,
            "median_spent": statistics.median(spent),
            "low_spent": min(spent),
            "high_spent": max(spent),
            "budget": budget,
        }
    return out


def clear_winner(summary: dict[str, dict[str, Any]], ways: tuple[str, ...] | list[str]) -> str | None:
    """The way whose median best is highest and whose range over seeds lies above every other's; None for a tie
    on the median or overlapping ranges (then no way won at this budget)."""
    ranked = sorted(ways, key=lambda w: -summary[w]["median"])
    top, rest = ranked[0], ranked[1:]
    if any(summary[w]["median"] >= summary[top]["median"] - 1e-12 for w in rest):
        return None
    if any(summary[top]["low"] <= summary[w]["high"] for w in rest):
        return None
    return top


def _best_per_cost(summary: dict[str, dict[str, Any]]) -> str | None:
    if not all(name in summary for name in SEARCHES):
        return None
    winner = clear_winner(summary, SEARCHES)
    return "d" if winner is None else "abc"[SEARCHES.index(winner)]


BEST_PER_COST = Question(
    "with pruning off and the same budget, repeated over seeds, the best validation R² comes from...",
    {
        "a": "the grid (lesson 07's kind of sweep)",
        "b": "random search",
        "c": "TPE",
        "d": "no clear winner: a tie, or the seeds' ranges overlap",
    },
    _best_per_cost,
)
