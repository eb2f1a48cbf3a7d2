"""Lesson 12, search, not just scale: its question, conclusions and exercise check (12.1).

12.1's check loads the learner's space (a mistake in it gets the space's own message), trains the defaults once,
runs a TPE search with pruning on worker processes (a single worker: the calling process), and re-runs the best
trial: a trial's result is a property of its settings, so the re-run must give the same value (within
:data:`RERUN_TOLERANCE`), and that value must beat the defaults.
"""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import torch

from dlscale.hpo import SearchSpaceError, load_space
from dlscale.hpo.local_search import rerun_best, run_search
from dlscale.hpo.worker import run_worker
from dlscale.lessons.lesson_tools import Question

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "BEST_PER_COST",
    "baseline_value",
    "check_space",
    "repeated_searches",
    "search_conclusions",
    "values_over_seeds",
    "width_conclusions",
]

# -- asked before the measurement: which way of searching wins -----------------------------------------------


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

# -- ours, from their numbers --------------------------------------------------------------------------------


def search_conclusions(
    summary: dict[str, dict[str, Any]],
    rows: dict[str, list[list[dict[str, Any]]]],
    baseline: float,
    pruning: dict[str, dict[str, Any]] | None = None,
    pruned_way: str = "tpe + hyperband",
    plain_way: str = "tpe",
) -> list[str]:
    """What lesson 12's searches show over their seeds (``rows[way]``: the trials of each seed's study): the samplers
    with pruning off (``summary``, ``repeated_searches`` of those studies), then what pruning changed on one sampler
    (``pruning``, ``repeated_searches`` of its two ways: each question at its own common budget). A tie is called a
    tie, and a lead whose seeds overlap another's is not called a win."""

    def shown(way: str, table: dict[str, dict[str, Any]] = summary) -> str:
        s = table[way]
        return f"{way} {s['median']:.4f} ({s['low']:.4f} to {s['high']:.4f})"

    seeds = len(next(iter(rows.values())))
    samplers = [w for w in SEARCHES if w in summary]
    lines = [
        f"Within {summary[samplers[0]]['budget'] * 3600:.1f} node-seconds (what the cheapest study spent), the best "
        f"R², median over {seeds} seeds (range): "
        + ", ".join(shown(w) for w in samplers)
        + f"; the config's defaults give {baseline:.4f}."
    ]
    winner = clear_winner(summary, samplers)
    ranked = sorted(samplers, key=lambda w: -summary[w]["median"])
    if winner:
        lines.append(
            f"With pruning off, {winner} found the best settings on every seed: its worst seed beats the others' best."
        )
    elif summary[ranked[0]]["median"] - summary[ranked[1]]["median"] <= 1e-12:
        tied = [w for w in ranked if summary[ranked[0]]["median"] - summary[w]["median"] <= 1e-12]
        lines.append(f"{' and '.join(tied)} tie on the median: at this budget the samplers cannot be told apart.")
    else:
        lines.append(
            f"{ranked[0]} is ahead on the median, but its seeds overlap {ranked[1]}'s: at this budget "
            f"the sampler matters less than the draw. More trials, or more seeds, would tell."
        )
    if pruning and pruned_way in pruning and plain_way in pruning:
        trials = [t for study in rows[pruned_way] for t in study]
        pruned = [t for t in trials if t["state"] == "pruned"]
        a, b = pruning[plain_way], pruning[pruned_way]
        cheaper = b["high_spent"] < a["low_spent"]
        lines.append(
            f"Pruning, on {plain_way}: {len(pruned)} of {len(trials)} trials stopped early; node-seconds "
            f"spent, median {a['median_spent'] * 3600:.1f} without and {b['median_spent'] * 3600:.1f} with "
            f"({a['low_spent'] * 3600:.1f}-{a['high_spent'] * 3600:.1f} against "
            f"{b['low_spent'] * 3600:.1f}-{b['high_spent'] * 3600:.1f}): "
            + (
                "cheaper on every seed."
                if cheaper
                else "the ranges overlap, so these seeds do not show pruning saving node-hours."
            )
            + f" Best R² within {b['budget'] * 3600:.1f} node-seconds (what the cheapest of these spent): "
            f"{shown(plain_way, pruning)} against {shown(pruned_way, pruning)}."
        )
    return lines


def width_conclusions(result: dict[str, Any]) -> list[str]:
    """Concurrent trials against one wider trial on the same devices (dlscale.bench.concurrent_trials)."""
    many, wide, n = result["concurrent"], result["wide"], result["workers"]
    speedup = many["seconds"] / wide["seconds"]  # (one trial on one rank, of n at once; one trial on n ranks)
    efficiency = speedup / n
    lines = [
        f"{n} trials at once, one rank each: each took {many['seconds']:.1f} s, {many['trials_per_hour']:.0f} "
        f"trials per hour in all (R² {many['r2']:.4f} at global batch {many['global_batch']}).",
        f"One trial at a time over {n} ranks: each took {wide['seconds']:.1f} s, {wide['trials_per_hour']:.0f} "
        f"trials per hour (R² {wide['r2']:.4f} at global batch {wide['global_batch']}). {n} ranks made one "
        f"trial {speedup:.2f}x as fast as one rank did, {efficiency:.0%} of the ideal {n}x: that is the "
        f"scaling efficiency.",
    ]
    if efficiency < 1:
        lines.append(
            "Below perfect scaling the concurrent trials finish more of the search per device-hour; a wider "
            "trial pays only when the search must wait for each result."
        )
    b_simple = wide.get("noise_scale")
    if b_simple:
        ratio = wide["global_batch"] / b_simple
        rough = (
            "one estimate from one short trial, which can be off several times over (lesson 07 measures it on "
            "longer runs and finds other values)"
        )
        if 1 / 3 <= ratio <= 3:
            lines.append(
                f"The wide trial's batch {wide['global_batch']} is within a factor of 3 of its measured noise "
                f"scale B_simple ≈ {b_simple:.0f}, {rough}: too close to say on which side it lies."
            )
        else:
            above = ratio > 3
            lines.append(
                f"The wide trial's batch {wide['global_batch']} is {'above' if above else 'below'} its "
                f"measured noise scale B_simple ≈ {b_simple:.0f} by more than 3x ({rough}): "
                + (
                    "past it, a wider trial needs more epochs for the same R², so widening stops paying"
                    if above
                    else "widening can still keep the epochs per trial"
                )
            )
    return lines


# -- 12.1: a search space that beats the config's defaults within a budget of trials -------------------------


#: How far the best trial's re-run may land from its value in the study, in R². On a CPU the same kernels run
#: in the same order: the same R² to the last digit. On a GPU cuDNN may pick other convolution algorithms in each
#: process, some of them not deterministic, and the difference grows over the epochs: 0.02 there. A setting that
#: changes between runs (a seed drawn anew) moves it by more.
RERUN_TOLERANCE = {"cpu": 1e-9, "cuda": 2e-2}


def check_rerun(best: float, again: float, device: str | None = None) -> None:
    """The re-run of the best trial gives its value again, within :data:`RERUN_TOLERANCE` for ``device`` (default:
    CUDA where a GPU is visible, as ``device=auto`` trains there)."""
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if abs(again - best) > RERUN_TOLERANCE[kind]:
        raise AssertionError(
            f"the best trial gave R² {best:.6f} in the search but {again:.6f} when re-run, more than "
            f"rounding allows on {kind} ({RERUN_TOLERANCE[kind]:g}): something in the space changes "
            f"between runs (a seed drawn anew?)"
        )


#: Torch threads of the runs trained here beside the searches (the defaults, settings over new seeds): one, as each
#: trial of the lesson's studies and of 12.1's check has, so that they compute as a trial does, and so that a run
#: started while the CPUs look idle does not spin a second thread against the engines and workers that follow.
THREADS = 1


def baseline_value(space: Any, run_dir: str | Path) -> float:
    """The space's metric for its base config with only the fixed overrides: what a search must beat."""
    from dlscale.training.loop import train_quietly

    result = train_quietly(space.config({}, run_dir=str(run_dir), progress=False, plot=False, threads=THREADS))
    return float(result.final[space.metric])


def values_over_seeds(
    space: Any, params: dict[str, Any], seeds: list[int] | tuple[int, ...], run_root: str | Path
) -> list[float]:
    """The space's metric for ``params`` (``{}``: the config's defaults) trained once per seed, each seed's run in
    ``run_root/seed-N``: whether settings beat others is read over seeds, not from one draw."""
    from dlscale.training.loop import train_quietly

    values = []
    for seed in seeds:
        cfg = space.config(
            dict(params),
            seed=seed,
            run_dir=str(Path(run_root) / f"seed-{seed}"),
            progress=False,
            plot=False,
            resume=False,
            threads=THREADS,
        )
        values.append(float(train_quietly(cfg).final[space.metric]))
    return values


def check_space(
    space: dict[str, Any], budget: int = 8, workers: int = 2, study_dir: str | Path = "runs/exercise12"
) -> dict[str, float]:
    """12.1: search ``space`` with ``budget`` trials on ``workers`` worker processes (one: this process); the best
    must re-run to the same value and beat the defaults."""
    if not isinstance(space, dict):
        raise AssertionError(f"return the space as a dict (base, fixed, parameters), got {type(space).__name__}")
    try:
        loaded = load_space(space)
    except SearchSpaceError as err:
        raise AssertionError(f"the space is refused: {err}") from None
    if loaded.metric != "r2" or loaded.direction != "maximize":
        raise AssertionError("search for the highest validation R² (metric: r2, direction: maximize)")
    if (
        set(loaded.fixed) - {"epochs", "checkpoint_every", "keep_checkpoints", "progress", "plot"}
        or loaded.fixed.get("epochs", 6) > 6
    ):
        raise AssertionError(
            "keep the data and the budget as given: fixed may set epochs (at most 6) and the "
            "checkpoint settings only; a bigger dataset or more epochs is not a better setting"
        )
    study_dir = Path(study_dir)
    shutil.rmtree(study_dir, ignore_errors=True)  # each check searches afresh
    baseline = baseline_value(loaded, study_dir / "defaults")
    # one thread per trial, as a worker process gets anyway; a single worker is this process (a process's start
    # costs more than a trial of the tiny model), and so is the best trial's re-run then
    here = workers == 1
    run_search(
        study_dir,
        loaded,
        trials=budget,
        workers=0 if here else workers,
        sampler="tpe",
        pruner="hyperband",
        threads=THREADS,
    )
    if here:
        run_worker(study_dir)
    best, again = rerun_best(study_dir, in_process=here)
    check_rerun(best, again)
    if best <= baseline:
        raise AssertionError(
            f"the best of {budget} trials reached R² {best:.4f}, not above the defaults' "
            f"{baseline:.4f}. Search what matters most (the learning rate, log-uniform over a "
            f"decade or two, and the batch), and leave out parameters that only spread the budget thin"
        )
    print(f"Exercise 12.1 passed ✓ best R² {best:.4f} (re-run: {again:.4f}) against the defaults' {baseline:.4f}")
    return {"best": best, "rerun": again, "baseline": baseline}
