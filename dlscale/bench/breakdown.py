"""``dlscale bench breakdown``: where the scaling efficiency goes — exposed I/O, exposed communication, the rest
(lesson 11).

At each size (ranks on one node, or nodes through the Slurm scripts) the same step is trained
several ways, weak scaling (every rank keeps its batch), the ways taking turns over rounds:

- **full**: as ``dlscale train`` runs it;
- **data in memory** (``data_in_memory=true``): the batches already on the device, no loader;
- **no communication** (also ``data_parallel=none``): every rank steps alone on the same batch;
- **data in memory with another** ``bucket_cap_mb`` (and ``static_graph`` if asked), one run per
  setting: how much of the communication DDP's buckets hide.

With ``t`` a rank's time per step (its batch over its samples/s) and one rank the reference, the
lost efficiency ``1 - t_full(1) / t_full(n)`` splits, each part over ``t_full(n)``, into

- **exposed I/O**: the growth of what the data path adds, ``(t_full(n) - t_mem(n)) - (t_full(1) - t_mem(1))``;
- **exposed communication**: ``t_mem(n) - t_alone(n)``;
- **the rest**: ``t_alone(n) - t_mem(1)``: compute that does not scale (ranks sharing cores, memory
  bandwidth or a GPU's clocks; stragglers).

No part is a remainder: each is the difference of two measured runs, and the three telescope, so
computed from each way's median time they add up to the loss computed from the full runs' medians
to rounding (:data:`ADDS_UP_WITHIN`; the tests check it on real runs). How far to trust each part
is the rounds' spread, which the table prints beside it.

Under DDP the exposed communication holds three costs that the scaling model prices apart: DDP's own
work, the all-reduce left exposed, and the backward pass slowed by the part it hid.
:func:`~dlscale.bench.breakdown_terms.add_communication_terms` splits it with the prices ``dlscale bench ddp-cost``
and ``dlscale bench overlap`` measure (or the published ones) and a fitted link, and :func:`format_breakdown` prints
the split beside the parts (``dlscale bench breakdown --allreduce allreduce.json``).

FSDP and tensor parallelism cannot step without their collectives: for them the no-communication
time is the data-in-memory time less the collectives' time per step that the profiler recorded
in a run of its own (``profile_steps``; the profiler slows the steps it records). On a CPU, where gloo's collectives
block, that is all exposed; on a
GPU, where NCCL's kernels overlap compute, it is an upper bound of the exposed part.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.bench.repeats import measure_rounds
from dlscale.reporting.tables import markdown_table

#: How closely the three parts add up to the measured loss: they telescope, so only rounding separates them.
ADDS_UP_WITHIN = 1e-9

#: A runner trains ``overrides`` at one size and returns the run's ``summary.json``: (size, overrides, run_dir) -> dict.
Runner = Callable[[int, dict[str, Any], Path], dict]

FULL, MEMORY, ALONE = "full", "data in memory", "no communication"
PROFILED = "data in memory, profiled"  # (FSDP/TP: where the collectives' time is read; its own step time is not used)


@dataclass(frozen=True)
class Way:
    """One way of running the step: its name and the config keys it changes."""

    name: str
    overrides: dict[str, Any]


def ways(
    communicates: bool, sharded: bool, buckets: Iterable[float] = (), static_graph: bool = False, steps: int = 40
) -> list[Way]:
    """The ways a size runs: full and data in memory always; where there is communication to remove (more than one
    rank), without it and with each bucket setting under DDP, or a profiled run that times the collectives under
    FSDP/TP (apart from the timed ones: the profiler slows the steps it records)."""
    out = [Way(FULL, {}), Way(MEMORY, {"data_in_memory": True})]
    if communicates and sharded:
        out.append(Way(PROFILED, {"data_in_memory": True, "profile_steps": (max(6, steps - 5), steps)}))
    if communicates and not sharded:
        out.append(Way(ALONE, {"data_in_memory": True, "data_parallel": "none"}))
        for mb in buckets:
            out.append(
                Way(
                    bucket_way(mb, static_graph),
                    {"data_in_memory": True, "bucket_cap_mb": mb, **({"static_graph": True} if static_graph else {})},
                )
            )
    return out


def bucket_way(mb: float, static_graph: bool = False) -> str:
    return f"buckets {mb:g} MiB" + (", static graph" if static_graph else "")


def step_seconds(summary: dict) -> float:
    """The slowest rank's seconds per optimizer step: its share of the global batch over its own samples/s.

    The slowest, not rank 0's: when every rank steps alone, a straggler's extra time shows only on
    its own rank, and with the all-reduce every rank waits for it. Taking rank 0's would put that
    wait in exposed communication; taking the slowest puts it in "the rest", where it belongs.
    """
    rate = min(summary.get("samples_per_s_each_rank") or [summary["samples_per_s_per_rank"]])
    return summary["global_batch_size"] / summary["applied"]["data_parallel_ranks"] / rate


def collective_seconds(run_dir: Path) -> float:
    """Seconds per step the profiler saw in collectives, from the run's ``profile_summary.json``."""
    from dlscale.profiling import read_summary

    return read_summary(run_dir)["collectives_ms_per_step"] / 1000


def breakdown_parts(t: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """The lost efficiency at one size and its three parts, from the step times ``t`` there and ``ref`` at the
    reference size (the smallest; one rank, usually).

    Each maps :data:`FULL`, :data:`MEMORY` and :data:`ALONE` to seconds per step; where a size has
    no communication to remove (one rank) :data:`ALONE` may be left out: it is the data-in-memory time.
    Each part is how much a cost grew from the reference to this size, over this size's step time.
    """
    full = t[FULL]
    ref_alone, alone = ref.get(ALONE, ref[MEMORY]), t.get(ALONE, t[MEMORY])
    return {
        "efficiency": ref[FULL] / full,
        "loss": 1 - ref[FULL] / full,
        "io": ((full - t[MEMORY]) - (ref[FULL] - ref[MEMORY])) / full,
        "communication": ((t[MEMORY] - alone) - (ref[MEMORY] - ref_alone)) / full,
        "rest": (alone - ref_alone) / full,
    }


PARTS = ("io", "communication", "rest")


def bench_breakdown(
    cfg,
    sizes: Iterable[int],
    runner: Runner,
    steps: int = 40,
    rounds: int = 2,
    buckets: Iterable[float] = (1.0,),
    static_graph: bool = False,
    unit: str = "ranks",
    ranks_per_unit: int = 1,
    out_dir: str | Path = "runs/breakdown",
    progress: bool = True,
    split: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Measure each way at each size (weak scaling: ``cfg``'s global batch is the smallest size's) and split the loss.

    ``runner`` trains one way at one size (:func:`local_runner`, :func:`engine_runner`,
    :func:`slurm_runner`); ``unit`` says what a size counts (ranks, or nodes of ``ranks_per_unit``
    ranks each); ``split``, if given, adds the exposed communication's terms to the result
    (:func:`~dlscale.bench.breakdown_terms.add_communication_terms`). Writes ``breakdown.json`` and
    ``breakdown.png`` into ``out_dir`` and returns what they hold.
    """
    from dlscale.distributed.parallelize import ParallelPlan  # (only its rule for what is sharded)

    sizes = sorted(set(sizes))
    out_dir = Path(out_dir)
    sharded = ParallelPlan(cfg.data_parallel, cfg.tensor_parallel, 0, 1, pipeline=cfg.pipeline_parallel).sharded
    buckets = list(buckets)
    communicates = lambda n: n * ranks_per_unit > 1  # noqa: E731  (only then is there communication to remove)
    plan = {(n, way.name): way for n in sizes for way in ways(communicates(n), sharded, buckets, static_graph, steps)}
    summaries: dict[tuple[int, str], list[dict]] = {key: [] for key in plan}

    def measure(n: int, way: Way) -> Callable[[], float]:
        def run() -> float:
            tag = "".join(c if c.isalnum() else "_" for c in way.name)
            run_dir = out_dir / f"{unit}{n}-{tag}-round{len(summaries[n, way.name]) + 1}"
            overrides = {
                "max_steps": steps,
                "epochs": 10**6,
                "warmup_steps": 0,
                **way.overrides,
                "global_batch_size": cfg.global_batch_size * n // sizes[0],
            }
            summary = {**runner(n, overrides, run_dir), "run_dir": str(run_dir)}
            summaries[n, way.name].append(summary)
            return step_seconds(summary)

        return run

    start = getattr(runner, "start", None)
    if start is not None:  # (engines: the largest size's set first, or the smallest size starts a set of its own)
        start(max(sizes) * ranks_per_unit)
    spreads = measure_rounds({key: measure(key[0], way) for key, way in plan.items()}, rounds, progress)
    seconds = {key: spread.values for key, spread in spreads.items()}
    if sharded:  # no step without collectives: take off what the profiler saw in them
        for n in sizes:
            if communicates(n):
                seconds[n, ALONE] = [
                    step - collective_seconds(Path(s["run_dir"]))
                    for step, s in zip(seconds[n, MEMORY], summaries[n, PROFILED])
                ]
                del seconds[n, PROFILED]
    rows = [
        _size_row(n, sizes[0], seconds, summaries, buckets, static_graph, cfg.bucket_cap_mb, sharded) for n in sizes
    ]
    result = {
        "unit": unit,
        "per_rank_batch": rows[0]["per_rank_batch"],
        "steps": steps,
        "rounds": rounds,
        "config": cfg.name,
        "model": cfg.model,
        "layout": "FSDP/TP" if sharded else "DDP",
        "no_communication_from": ("the profiler's collective time" if sharded else "runs with data_parallel=none"),
        "adds_up_within": ADDS_UP_WITHIN,
        "rows": rows,
    }
    if split is not None:
        result = split(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "breakdown.json").write_text(json.dumps(result, indent=1) + "\n")
    from dlscale.reporting.plots import breakdown_bars

    breakdown_bars(result).savefig(out_dir / "breakdown.png", dpi=120)
    return result


def _median_times(seconds: dict, n: int) -> dict[str, float]:
    return {way: statistics.median(values) for (size, way), values in seconds.items() if size == n}


def _size_row(
    n: int,
    ref: int,
    seconds: dict,
    summaries: dict,
    buckets: list[float],
    static_graph: bool,
    default_mb: float,
    sharded: bool,
) -> dict[str, Any]:
    """One size's row: each way's median ms per step, the parts from the medians, and each part's range over rounds."""
    times, ref_times = _median_times(seconds, n), _median_times(seconds, ref)
    full = summaries[n, FULL][0]
    row = {
        "size": n,
        "ranks": full["world_size"],
        "nodes": full.get("nodes", 1),
        "threads_per_process": full["threads"]["count"],
        "gradient_bytes": full["memory_per_rank"][0]["parameters"],  # (DDP: every rank holds them whole)
        "per_rank_batch": full["global_batch_size"] // full["applied"]["data_parallel_ranks"],
        "ms": {way: 1000 * value for way, value in times.items()},
        **breakdown_parts(times, ref_times),
    }
    rounds = len(seconds[n, FULL])
    per_round = [
        breakdown_parts({way: seconds[n, way][r] for way in times}, {way: seconds[ref, way][r] for way in ref_times})
        for r in range(rounds)
    ]
    row["range"] = {
        part: (min(p[part] for p in per_round), max(p[part] for p in per_round)) for part in ("loss", *PARTS)
    }
    if ALONE in times and not sharded:  # how much communication each bucket setting leaves exposed, ms per step
        row["exposed_communication_ms"] = {
            f"{default_mb:g}": 1000 * (times[MEMORY] - times[ALONE]),
            **{f"{mb:g}": 1000 * (times[bucket_way(mb, static_graph)] - times[ALONE]) for mb in buckets},
        }
    return row


def format_breakdown(result: dict[str, Any]) -> str:
    """The breakdown as a Markdown table: each size's ms per step by way, and the loss split into its parts."""
    rows = result["rows"]
    way_names = list(dict.fromkeys(way for row in rows for way in row["ms"]))

    def pct(row: dict, part: str) -> str:
        low, high = row["range"][part]
        return f"{100 * row[part]:.1f}%" + (f" ({100 * low:.0f} to {100 * high:.0f})" if result["rounds"] > 1 else "")

    by_nodes = result["unit"] == "nodes"
    table = markdown_table(
        [
            result["unit"],
            *(["ranks"] if by_nodes else []),
            "threads each",
            *(f"{w} (ms)" for w in way_names),
            "efficiency",
            "lost",
            "exposed I/O",
            "exposed communication",
            "the rest",
        ],
        [
            (
                row["size"],
                *([row["ranks"]] if by_nodes else []),
                row["threads_per_process"],
                *(f"{row['ms'][w]:.1f}" if w in row["ms"] else "-" for w in way_names),
                f"{100 * row['efficiency']:.0f}%",
                pct(row, "loss"),
                pct(row, "io"),
                pct(row, "communication"),
                pct(row, "rest"),
            )
            for row in rows
        ],
    )
    notes = (
        f"{result['layout']}, {result['config']} ({result['model']}), per-rank batch {result['per_rank_batch']}, "
        f"{result['steps']} steps, median of {result['rounds']} round(s) (range over rounds in brackets); "
        f"no communication from {result['no_communication_from']}. The parts add up to the lost efficiency "
        f"(to {result['adds_up_within']:g})."
    )
    terms = format_terms(result)
    return f"{table}\n\n{notes}" + (f"\n\n{terms}" if terms else "")


def format_terms(result: dict[str, Any]) -> str:
    """The exposed communication split into DDP's own cost, the overlap's slow-down and the exposed all-reduce
    (:func:`~dlscale.bench.breakdown_terms.add_communication_terms`), as a Markdown table of the sizes that have one,
    and what the split rests on; empty when the result was not split."""
    rows = [row for row in result["rows"] if "terms" in row]
    if not rows:
        return ""
    table = markdown_table(
        [
            result["unit"],
            "communication (data in memory - alone)",
            "of which DDP's own cost",
            "overlap slow-down",
            "exposed all-reduce",
            "all-reduce hidden (ms)",
        ],
        [
            (
                row["size"],
                f"{100 * row['terms']['measured']:.1f}%",
                f"{100 * row['terms']['ddp']:.1f}%",
                f"{100 * row['terms']['slowdown']:.1f}%",
                f"{100 * row['terms']['allreduce']:.1f}%",
                f"{row['terms']['hidden_ms']:.3g} of {row['terms']['allreduce_ms']:.3g}",
            )
            for row in rows
        ],
    )
    where = result["terms_from"]
    return (
        f"{table}\n\nThe exposed communication split by the scaling model: DDP's own cost at {where['ddp_cost']}; "
        f"the overlap's slow-down at {where['slowdown']}; the whole all-reduce from {where['allreduce']}. "
        "The exposed all-reduce is what the other two leave of the measured part."
    )


# -- runners: one way at one size ----------------------------------------------------------------


def local_runner(cfg, threads: int) -> Runner:
    """Ranks on this machine under torchrun (one process for one rank), ``threads`` torch threads each: the same
    at every size (the CPUs shared by the largest run's ranks, :func:`~dlscale.runtime.threads.fair_threads`),
    so that a rank does the same work everywhere."""
    from dlscale.bench.scaling import run_training

    def run(n: int, overrides: dict[str, Any], run_dir: Path) -> dict:
        return run_training(
            cfg,
            n,
            run_dir,
            [f"{k}={_as_arg(v)}" for k, v in overrides.items()],
            threads,
            f"breakdown run {run_dir.name}",
        )

    return run


def engine_runner(cfg, threads: int = 1) -> Runner:
    """Ranks on the notebook's ipyparallel engines (lesson 11): started once, kept for every run. Its ``start(n)``
    starts n of them before the first run (:func:`bench_breakdown` gives its largest size): a set started for one rank
    would be stopped again when the first run of two comes."""
    import os

    from dlscale.jobs.notebook_engines import run_on_engines, train_rank

    def run(n: int, overrides: dict[str, Any], run_dir: Path) -> dict:
        done = run_on_engines(train_rank, n, cfg, **_quiet(overrides), threads=threads, run_dir=str(run_dir))
        return json.loads((Path(done[0]["run_dir"]) / "summary.json").read_text())

    def start(n: int) -> None:
        run_on_engines(os.getpid, n, as_ranks=False, show=False)  # (kept up: a smaller job runs on the first ones)

    run.start = start  # type: ignore[attr-defined]
    return run


def slurm_runner(cfg, script: str | Path, env: dict[str, str], tasks_per_node: int = 1, timeout: float = 600) -> Runner:
    """Nodes through a site's (or the local cluster's) ``train.sbatch``: one job of ``n`` nodes per run."""
    from dlscale.jobs.slurm_jobs import submit, wait_for_jobs

    def run(n: int, overrides: dict[str, Any], run_dir: Path) -> dict:
        settings = {**cfg.to_dict(), **_quiet(overrides), "run_dir": str(Path(run_dir).resolve())}
        args = [f"{k}={_as_arg(v)}" for k, v in settings.items() if v != ()]
        job = submit(script, args, options=[f"--nodes={n}", f"--ntasks-per-node={tasks_per_node}"], env=env)
        wait_for_jobs([job], env, timeout=timeout)
        return json.loads((Path(run_dir) / "summary.json").read_text())

    return run


def _quiet(overrides: dict[str, Any]) -> dict[str, Any]:
    from dlscale.bench.scaling import QUIET

    return {**overrides, **QUIET}


def _as_arg(value: Any) -> str:
    """A config value as the command line writes it (``profile_steps=10,15``)."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)
