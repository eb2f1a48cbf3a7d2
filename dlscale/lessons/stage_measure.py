"""The lessons' headline measurements, taken on the attendee's own stage.

After its check, a lesson measures the stage the attendee wrote (the ``main`` their cell defined, or the file it
wrote for the ranks), not ``dlscale.train``: their throughput against the batch size, their loader's workers, their
stage in three precisions, compiled against not, on one rank against two. :func:`measure_stage` runs it once per
setting per round, the settings taking turns (:func:`~dlscale.bench.repeats.measure_rounds`), and says whose stage
it measured: after :func:`~dlscale.lessons.recipes.use_ours` every measurement says that it ran ours.

Every stage result a measurement used is kept in :data:`MEASURED` (this process's), so that a test can run a lesson
with a marked stage and find the mark in what the lesson measured.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.bench.repeats import Spread, measure_rounds
from dlscale.runtime.threads import choose_threads, pinned_threads

#: Every result of a stage run that a measurement used, in this process (the marked-stage test reads it).
MEASURED: list[dict[str, Any]] = []


class StageFailed(RuntimeError):
    """A stage that stopped while being measured (one line: what it said, and what to do)."""


def steady_throughput(result: Mapping[str, Any]) -> float:
    """A stage run's samples/s: the median of its logged blocks after the first (which pays for the first steps'
    allocations and, compiled, for compiling)."""
    blocks = list(result["throughput"])
    if not blocks:
        raise StageFailed("the stage logged no samples/s (its Progress saw no step): is its loop empty?")
    return statistics.median(blocks[1:] or blocks)


def final_r2(result: Mapping[str, Any]) -> float:
    """A stage run's last validation R²."""
    if not result["r2"]:
        raise StageFailed("the stage returned no validation R² (its 'r2' list is empty)")
    return float(result["r2"][-1])


def whose(stage: str | Callable) -> str:
    """ "your stage" or "our stage (use_ours)": a stage defined in the kit's ``recipes/`` folder is ours."""
    from dlscale.lessons.stage_probes import is_ours

    return "our stage (use_ours)" if is_ours(stage) else "your stage"


@dataclass
class StageMeasurement:
    """What :func:`measure_stage` measured: a spread per setting, the stage's own results, and whose stage."""

    whose: str
    spreads: dict[Hashable, Spread]
    results: dict[Hashable, list[dict[str, Any]]] = field(default_factory=dict)
    unit: str = "samples/s"
    #: torch's threads of the runs in this process (one count for every setting, or one per setting); None: not set
    threads: int | Mapping[Hashable, int] | None = None

    def __getitem__(self, key: Hashable) -> Spread:
        return self.spreads[key]

    def lines(self) -> list[str]:
        """One line per setting: ``your stage, batch 64: 1,234 (rounds 1,200-1,300) samples/s``."""
        width = max(len(str(key)) for key in self.spreads)
        return [f"{self.whose}, {str(key):{width}s}: {self._value(spread)}" for key, spread in self.spreads.items()]

    def _value(self, spread: Spread) -> str:
        if self.unit == "R²":
            rounds = f" (rounds {spread.low:.4f}-{spread.high:.4f})" if len(spread.values) > 1 else ""
            return f"R² {spread.median:.4f}{rounds}"
        return f"{spread} {self.unit}" if len(spread.values) > 1 else f"{spread.median:,.0f} {self.unit}"

    def __str__(self) -> str:
        return "\n".join(self.lines())


def run_quietly(stage: str | Callable, arguments: Mapping[str, Any], threads: int | None = None) -> dict[str, Any]:
    """``stage``'s ``main(**arguments)`` with its printed lines kept out of the notebook; one
    :class:`StageFailed` line if it stops. ``threads``: torch's threads for the run (then put back)."""
    import torch

    from dlscale.lessons.stage_probes import stage_main

    main, kept, printed = stage_main(stage), torch.get_num_threads(), io.StringIO()
    # (threads: in the environment too, where the recipe's use_free_cpus keeps what OMP_NUM_THREADS says)
    pinned = pinned_threads(threads) if threads else contextlib.nullcontext()
    try:
        with contextlib.redirect_stdout(printed), pinned:
            result = dict(main(**arguments))
    except Exception as err:  # noqa: BLE001 - the attendee's code: any failure becomes one line
        from dlscale.lessons.stage_probes import leave_group

        leave_group()
        raise StageFailed(
            f"{whose(stage)} stopped while being measured with {dict(arguments)}: "
            f"{type(err).__name__}: {str(err)[:300]} (the stage's check names the gap; or "
            f"use_ours(...) to go on with ours)"
        ) from None
    finally:
        torch.set_num_threads(kept)
    for key in ("losses", "r2", "throughput"):
        if key not in result:
            raise StageFailed(
                f"{whose(stage)} returned no {key!r}: its main must return the dict the recipe's does "
                f"(losses, r2, throughput)"
            )
    return {**result, "printed": printed.getvalue()}


def run_rank(stage: str, arguments: Mapping[str, Any], threads: int | None = None) -> dict[str, Any]:
    """:func:`run_quietly` on one rank of a notebook-driven job (an engine calls it)."""
    return run_quietly(stage, arguments, threads)


def measure_stage(
    stage: str | Callable,
    settings: Mapping[Hashable, Mapping[str, Any]],
    rounds: int = 1,
    value: Callable[[Mapping[str, Any]], float] = steady_throughput,
    ranks: Mapping[Hashable, int] | None = None,
    threads: int | Mapping[Hashable, int] | None = None,
    unit: str = "samples/s",
) -> StageMeasurement:
    """Run ``stage`` once per setting (its arguments) per round and read ``value`` from each run's result.

    ``ranks``: per setting, on how many notebook engines the stage's file runs (a data-parallel stage); left out, it
    runs in this process. ``threads``: torch's threads in each process, the same on both sides of a comparison —
    or, per setting, the thread counts compared (a shared node's lesson). Left out, the settings that run in this
    process get one count, chosen once before the first run as the engine chooses
    (:func:`~dlscale.runtime.threads.choose_threads`; recorded in the measurement's ``threads``): left to each run,
    the stage counted the busy CPUs at its own start, and beside a busy process two settings could run with
    different counts.
    """
    results: dict[Hashable, list[dict[str, Any]]] = {key: [] for key in settings}
    here = threads
    if threads is None and any(not (ranks and ranks.get(key)) for key in settings):
        here = choose_threads().count  # (for the runs in this process; ranks choose their own)

    def once(key: Hashable) -> Callable[[], float]:
        def measure() -> float:
            arguments = dict(settings[key])
            count = threads.get(key) if isinstance(threads, Mapping) else threads
            if ranks and ranks.get(key):
                from dlscale.jobs.notebook_engines import run_on_engines

                result = run_on_engines(run_rank, ranks[key], str(stage), arguments, count, show=False)[0]
            else:
                result = run_quietly(stage, arguments, here if threads is None else count)
            results[key].append(result)
            MEASURED.append(result)
            return value(result)

        return measure

    spreads = measure_rounds({key: once(key) for key in settings}, rounds)
    return StageMeasurement(whose(stage), spreads, results, unit, here)


@dataclass
class StageProfile:
    """What :func:`profile_stage` read from a stage's profiling window."""

    ranges: dict[str, float]  # ms per step of each range the stage marked, largest first
    trace: Path  # the stage's trace.json (Perfetto opens it)
    table: str  # the profiler's table as the stage printed it


def profile_stage(stage: str | Callable, folder: str | Path, window: tuple[int, int], **arguments: Any) -> StageProfile:
    """Run ``stage`` with its profiling window (``profile_steps``) in ``folder``, where its ``trace.json`` lands:
    the milliseconds per step of each range the stage marked in the window, its trace, and the table it printed."""
    from dlscale.reporting.plots import loop_ranges, trace_events

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    arguments = {**arguments, "profile_steps": f"{window[0]},{window[1]}"}
    if "checkpoint" in arguments:  # (its checkpoint where the lesson said, not inside the profile's folder)
        arguments["checkpoint"] = str(Path(arguments["checkpoint"]).resolve())
    here = Path.cwd()
    os.chdir(folder)
    try:
        result = run_quietly(stage, arguments)
    finally:
        os.chdir(here)
    MEASURED.append(result)
    trace = folder / "trace.json"
    if not trace.is_file():
        raise StageFailed(
            f"{whose(stage)} wrote no trace.json for profile_steps={window[0]},{window[1]}: does its "
            f"loop call the profiling window's step() after each step (TODO 04.b)?"
        )
    events = loop_ranges(trace_events(trace))
    steps = window[1] - window[0]
    totals: dict[str, float] = {}
    for event in events:
        totals[event["name"]] = totals.get(event["name"], 0.0) + event.get("dur", 0) / 1000 / steps
    lines = result["printed"].splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("---")), len(lines))
    table = "\n".join(line for line in lines[first:] if not line.startswith("step "))
    return StageProfile(dict(sorted(totals.items(), key=lambda item: -item[1])), trace, table)


def checkpoint_shares(folder: str | Path) -> dict[str, float]:
    """Each rank's share of the bytes of a DCP checkpoint (its latest ``epoch-N`` folder, or ``folder`` itself):
    ``{file: share}`` over its ``.distcp`` files, one per rank."""
    folder = Path(folder)
    epochs = sorted((p for p in folder.glob("epoch-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[-1]))
    latest = epochs[-1] if epochs else folder
    files = sorted(latest.glob("*.distcp"))
    if not files:
        raise StageFailed(
            f"{latest} holds no .distcp file: did the stage save with torch.distributed.checkpoint (TODO 10.e)?"
        )
    total = sum(f.stat().st_size for f in files)
    return {f.name: f.stat().st_size / total for f in files}
