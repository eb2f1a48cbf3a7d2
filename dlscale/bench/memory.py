"""``dlscale bench memory``: what each rank holds under DDP, FSDP and tensor parallelism, side by side.

The same model trains a few steps in each layout on this machine (torchrun for the
multi-rank ones; with ``on_engines`` the notebook's ipyparallel engines, as lesson 10 runs it); each
run's ``summary.json`` carries every rank's parameter, gradient
and optimizer-state bytes counted from the tensors it holds, its peak memory and the
step time (:mod:`dlscale.metrics.memory`). The table puts each layout beside DDP on as many ranks:
FSDP divides the first three by the number of ranks (ZeRO-3), tensor parallelism divides
the blocks' share, DDP copies everything everywhere. Lesson 10 reads this table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlscale.reporting.tables import markdown_table

#: (name, processes, overrides): the layouts the table compares, DDP first at each size.
LAYOUTS: list[tuple[str, int, list[str]]] = [
    ("1 process", 1, []),
    ("DDP 2", 2, ["data_parallel=ddp"]),
    ("FSDP 2", 2, ["data_parallel=fsdp"]),
    ("DDP 4", 4, ["data_parallel=ddp"]),
    ("FSDP 4", 4, ["data_parallel=fsdp"]),
    ("FSDP 4 + activation checkpointing", 4, ["data_parallel=fsdp", "activation_checkpointing=true"]),
    ("FSDP 2 × TP 2", 4, ["data_parallel=fsdp", "tensor_parallel=2"]),
]

_BYTES = ("parameters", "gradients", "optimizer_state")


def bench_memory(
    cfg,
    steps: int = 10,
    out_dir: str | Path = "runs/memory",
    layouts: list | None = None,
    progress: bool = True,
    threads: int | None = None,
    on_engines: bool = False,
) -> list[dict[str, Any]]:
    """Train ``steps`` steps of ``cfg`` in each layout and return one row per layout (the largest rank's figures).

    ``on_engines``: each layout on the notebook's ipyparallel engines, kept up between runs (a notebook's own ranks,
    :func:`~dlscale.jobs.notebook_engines.run_on_engines`), instead of new processes under torchrun for each: the
    same training, counted and timed the same way (the peak since the model was laid out), without starting Python
    and torch again for every layout."""
    from tqdm.auto import tqdm

    from dlscale.bench.scaling import QUIET, run_training
    from dlscale.jobs.notebook_engines import run_on_engines, train_rank
    from dlscale.runtime.threads import fair_threads

    if steps < 7:  # the throughput meter leaves out the first 5 steps (allocation, warm-up)
        raise ValueError(f"bench memory needs steps >= 7 to time some steps after the warm-up; got {steps}")
    layouts = LAYOUTS if layouts is None else layouts
    threads = threads or fair_threads(max(n for _, n, _ in layouts))
    out_dir = Path(out_dir)
    rows = []
    for name, processes, overrides in tqdm(layouts, desc="memory", unit="run", disable=not progress):
        run_dir = out_dir / name.replace(" ", "").replace("×", "x").replace("+", "-")
        settings = [*overrides, f"max_steps={steps}", "epochs=1000000", "val_samples=64"]
        if on_engines:  # (quiet, as under torchrun: the table says what each run did)
            changes = dict(setting.split("=", 1) for setting in settings)
            done = run_on_engines(
                train_rank, processes, cfg, **changes, **QUIET, threads=threads, run_dir=str(run_dir), show=False
            )
            summary = json.loads((Path(done[0]["run_dir"]) / "summary.json").read_text())
        else:
            summary = run_training(cfg, processes, run_dir, settings, threads, f"memory run '{name}'")
        ranks = summary["memory_per_rank"]
        row = {
            "layout": name,
            "processes": processes,
            **{key: max(r[key] for r in ranks) for key in _BYTES},
            "peak": max(r["peak"] for r in ranks),
            "step_s": summary["global_batch_size"] / summary["samples_per_s"],
        }
        row["held"] = sum(row[key] for key in _BYTES)
        rows.append(row)
    for row in rows:
        ddp = next((r for r in rows if r["layout"] == f"DDP {row['processes']}"), rows[0])
        row["held_vs_ddp"] = row["held"] / ddp["held"]
        row["step_vs_ddp"] = row["step_s"] / ddp["step_s"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "memory.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def _mib(value: float) -> str:
    return f"{value / 2**20:,.2f}"


def format_memory(rows: list[dict[str, Any]]) -> str:
    """The table: per rank (the largest), MiB; ratios against DDP on as many ranks (1 process: itself)."""
    return markdown_table(
        [
            "layout",
            "ranks",
            "parameters MiB",
            "gradients MiB",
            "optimizer MiB",
            "held vs DDP",
            "peak MiB",
            "step ms",
            "step vs DDP",
        ],
        [
            (
                r["layout"],
                r["processes"],
                _mib(r["parameters"]),
                _mib(r["gradients"]),
                _mib(r["optimizer_state"]),
                f"{r['held_vs_ddp']:.2f}",
                _mib(r["peak"]),
                f"{1000 * r['step_s']:.0f}",
                f"{r['step_vs_ddp']:.2f}",
            )
            for r in rows
        ],
    )
