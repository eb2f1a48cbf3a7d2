"""``dlscale bench threads``: training on a shared node — torch's threads chosen by the kit against fixed counts.

Each setting trains the same run (``dlscale train CONFIG max_steps=N``) in a process of its own, alone and beside
``busy`` processes that spin on a core each (what a neighbour on a hub's shared node, or the lab's own kernel and
engines, does to a training run). The settings take turns, round after round (:mod:`dlscale.bench.repeats`), and
the table sets each beside the best fixed count in the same conditions: the kit's own choice (its affinity mask
less the CPUs busy at start, :func:`dlscale.runtime.threads.choose_threads`) should be within a few percent of the
best fixed count alone, and well above a thread per core beside the busy process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlscale.bench.repeats import measure_rounds

#: What each busy neighbour runs: one core, spinning.
SPIN = "while True: pass"


@contextlib.contextmanager
def busy_neighbours(count: int = 1) -> Iterator[None]:
    """``count`` processes that each keep a core busy (spinning) while the block runs: a neighbour on a shared
    node. They are killed when it ends, whatever happens in it."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _train_rate(config: str, steps: int, threads: int | None, out: Path) -> float:
    """samples/s of one run in a process of its own; ``threads`` None lets the kit choose."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    run_dir = Path(tempfile.mkdtemp(dir=out))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlscale.train",
            config,
            f"max_steps={steps}",
            f"run_dir={run_dir}",
            "progress=false",
            "plot=false",
            "checkpoint_every=0",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=out,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"dlscale train {config} failed: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return float(summary["samples_per_s"])


def bench_threads(
    config: str = "demo", steps: int = 200, rounds: int = 3, busy: int = 1, out_dir: str | Path = "runs/bench_threads"
) -> list[dict[str, Any]]:
    """Rows: for each condition (alone, beside ``busy`` spinning processes) and setting (the kit's choice, each
    fixed count up to the mask), samples/s over ``rounds`` and the ratio to the best fixed count there."""
    from dlscale.runtime.threads import affinity_cpus

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = list(range(1, affinity_cpus() + 1))
    settings: dict[str, int | None] = {"the kit's choice": None, **{f"{n} thread(s)": n for n in counts}}
    rows = []
    for condition, neighbours in (("alone", 0), (f"beside {busy} busy process(es)", busy)):
        with busy_neighbours(neighbours):
            spreads = measure_rounds(
                {name: (lambda n=n: _train_rate(config, steps, n, out)) for name, n in settings.items()}, rounds
            )
        best = max((spreads[name] for name in settings if settings[name] is not None), key=lambda s: s.median)
        for name, spread in spreads.items():
            rows.append(
                {
                    "condition": condition,
                    "setting": name,
                    "samples_per_s": spread.median,
                    "low": spread.low,
                    "high": spread.high,
                    "vs_best_fixed": spread.median / best.median,
                }
            )
    alone = next(r for r in rows if r["condition"] == "alone" and r["setting"] == "the kit's choice")
    for row in rows:
        row["vs_kit_alone"] = row["samples_per_s"] / alone["samples_per_s"]
    return rows


def format_threads(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table, the CPU named above it."""
    from dlscale.reporting.tables import markdown_table
    from dlscale.runtime.devices import cpu_name

    table = markdown_table(
        ["condition", "threads", "samples/s (rounds)", "vs the best fixed count there", "vs the kit's choice alone"],
        [
            (
                r["condition"],
                r["setting"],
                f"{r['samples_per_s']:,.0f} ({r['low']:,.0f}-{r['high']:,.0f})",
                f"{r['vs_best_fixed']:.2f}x",
                f"{r['vs_kit_alone']:.2f}x",
            )
            for r in rows
        ],
    )
    return f"{cpu_name()}, {os.cpu_count()} CPUs\n\n{table}"
