"""``dlscale bench scaling``: weak and strong scaling of the training over local processes (lesson 05).

Also :func:`run_training`, the launcher of one benchmark run that ``bench memory`` shares.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from dlscale.jobs.local_ranks import run_local, torchrun_command
from dlscale.reporting.tables import markdown_table

#: What every benchmark run sets: no checkpoints, no bar, no plot, never resumed.
QUIET = {"checkpoint_every": 0, "progress": False, "plot": False, "resume": False}


def run_training(cfg, processes: int, run_dir: Path, overrides: Iterable[str], threads: int, label: str) -> dict:
    """Train ``cfg`` with ``overrides`` as ``processes`` local ranks (torchrun beyond one) into ``run_dir``.

    Quiet, no checkpoints, never resumed; every process gets ``threads`` threads. Returns the
    run's ``summary.json``; a failed run raises with the ranks' own error (``label`` names it).
    """
    args = [
        "dlscale.train",
        *(f"{k}={v}" for k, v in cfg.to_dict().items() if k != "profile_steps"),
        *overrides,
        f"run_dir={run_dir}",
        *(f"{k}={str(v).lower()}" for k, v in QUIET.items()),
    ]
    command = torchrun_command(processes, args) if processes > 1 else [sys.executable, "-m", *args]
    run_local(command, label, threads)
    return json.loads((Path(run_dir) / "summary.json").read_text())


def bench_scaling(
    cfg,
    procs: Iterable[int] = (1, 2),
    steps: int = 60,
    out_dir: str | Path = "runs/scaling",
    progress: bool = True,
    threads: int | None = None,
) -> list[dict]:
    """Train at each process count, strong (same global batch) and weak (same per-rank batch), and compare.

    Each run is ``dlscale.train`` under torchrun on this machine; on a cluster the same
    comparison comes from the Slurm scripts. Efficiency is throughput over
    ``processes × single-process throughput``. Every process of every run gets the same
    ``threads`` (default: the CPUs shared by the largest run's processes), and each row
    reports the threads its run's summary says it used. On one process the two modes are one run, launched once.
    """
    from tqdm.auto import tqdm

    from dlscale.runtime.threads import fair_threads

    procs = list(procs)
    threads = threads or fair_threads(max(procs))
    out_dir = Path(out_dir)
    base = cfg.global_batch_size
    jobs = [(mode, n) for mode in ("strong", "weak") for n in procs]
    rows = []
    for mode, n in tqdm(jobs, desc="scaling", unit="run", disable=not progress):
        batch = base if mode == "strong" else base * n
        if mode == "weak" and n == 1:  # one process, the same global batch: strong scaling's run, not launched again
            rows += [{**row, "mode": "weak"} for row in rows if row["mode"] == "strong" and row["processes"] == 1]
            continue
        summary = run_training(
            cfg,
            n,
            out_dir / f"{mode}-n{n}",
            [f"global_batch_size={batch}", f"max_steps={steps}", "epochs=1000000"],
            threads,
            f"{mode} scaling run with {n} processes",
        )
        rows.append(
            {
                "mode": mode,
                "processes": n,
                "global_batch": batch,
                "samples_per_s": summary["samples_per_s"],
                "threads_per_process": summary["threads"]["count"],
            }
        )
    for row in rows:
        single = next(r for r in rows if r["mode"] == row["mode"] and r["processes"] == min(procs))
        row["speedup"] = row["samples_per_s"] / single["samples_per_s"]
        row["efficiency"] = row["speedup"] * single["processes"] / row["processes"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scaling.json").write_text(json.dumps(rows, indent=1) + "\n")
    from dlscale.reporting.plots import scaling_curves

    scaling_curves(rows).savefig(out_dir / "scaling.png", dpi=120)
    return rows


def format_scaling(rows: list[dict]) -> str:
    return markdown_table(
        ["scaling", "processes", "threads each", "global batch", "samples/s", "speedup", "efficiency"],
        [
            (
                r["mode"],
                r["processes"],
                r.get("threads_per_process", "?"),
                r["global_batch"],
                f"{r['samples_per_s']:,.0f}",
                f"{r['speedup']:.2f}",
                f"{100 * r['efficiency']:.0f}%",
            )
            for r in rows
        ],
    )
