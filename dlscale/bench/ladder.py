"""``dlscale bench ladder``: lesson 04's optimization ladder, every rung trained and timed in the same run.

Each rung adds one change (loader workers and pinned memory, channels_last, mixed precision,
a fused optimizer, torch.compile, CUDA graphs); rungs take turns over rounds and the median
is reported.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from dlscale.reporting.tables import markdown_table


def ladder_rungs(device: torch.device) -> list[tuple[str, dict, str | None]]:
    """(rung, the settings it adds, why it is skipped or None), each rung on top of the previous ones."""
    workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    cuda = device.type == "cuda"
    return [
        (
            "fp32 baseline",
            {
                "precision": "fp32",
                "num_workers": 0,
                "pin_memory": False,
                "channels_last": False,
                "optimizer": "adamw",
                "optimizer_impl": "loop",
                "compile": False,
                "cuda_graphs": False,
            },
            None,
        ),
        ("+ loader workers, pinned memory", {"num_workers": workers, "pin_memory": True}, None),
        ("+ channels_last", {"channels_last": True}, None),
        ("+ mixed precision", {"precision": "auto" if cuda else "bf16"}, None),
        ("+ fused optimizer", {"optimizer_impl": "fused"}, None),
        ("+ torch.compile", {"compile": True}, None),
        ("+ CUDA graphs", {"cuda_graphs": True}, None if cuda else "CUDA graphs need a GPU"),
    ]


def bench_ladder(
    cfg, steps: int = 60, out_dir: str | Path | None = None, progress: bool = True, rounds: int = 1
) -> list[dict]:
    """Train ``steps`` steps per rung of the ladder, in one run, and report samples/s and speedups.

    With ``rounds > 1`` every rung is trained once per round, the rungs taking turns, and its
    median is reported: on a shared machine one run's noise can exceed a rung's effect.
    Writes ``ladder.json`` and ``ladder.png`` into ``out_dir`` (default ``runs/ladder``).
    """
    from tqdm.auto import tqdm

    from dlscale.runtime.devices import resolve_device
    from dlscale.training.loop import train_quietly

    device = resolve_device(cfg.device)
    out_dir = Path(out_dir or "runs/ladder")
    settings: dict = {}
    rows: list[dict] = []
    configs = []
    for index, (rung, adds, skipped) in enumerate(ladder_rungs(device)):
        rows.append({"rung": rung, "skipped": skipped} if skipped else {"rung": rung, "rates": []})
        if not skipped:
            settings.update(adds)
            configs.append(
                (
                    rows[-1],
                    cfg.override(
                        {
                            **settings,
                            "name": f"ladder-{index}",
                            "run_dir": str(out_dir / f"rung{index}"),
                            "max_steps": steps,
                            "epochs": 10**6,
                            "checkpoint_every": 0,
                            "plot": False,
                            "progress": False,
                            "warmup_steps": 0,
                        }
                    ),
                )
            )
    with tqdm(total=rounds * len(configs), desc="ladder", unit="run", disable=not progress) as bar:
        for _ in range(rounds):
            for row, run_cfg in configs:
                result = train_quietly(run_cfg)
                row["rates"].append(result.samples_per_s)
                row.update(applied=result.applied, mfu=result.mfu)
                bar.update()
    for row, _ in configs:
        row["samples_per_s"] = statistics.median(row["rates"])
    measured = [r for r in rows if "samples_per_s" in r]
    for row in measured:
        row["speedup"] = row["samples_per_s"] / measured[0]["samples_per_s"]
    for previous, row in zip(measured, measured[1:]):
        row["vs_previous"] = row["samples_per_s"] / previous["samples_per_s"]
    measured[0]["vs_previous"] = 1.0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ladder.json").write_text(
        json.dumps({"device": str(device), "steps": steps, "rows": rows}, indent=1, default=str) + "\n"
    )
    ladder_chart(rows, f"optimization ladder on {device}").savefig(out_dir / "ladder.png", dpi=120)
    return rows


def ladder_chart(rows: list[dict], title: str = "optimization ladder"):
    """The measured rungs as bars at their median with the range of their rounds."""
    from dlscale.bench.repeats import Spread
    from dlscale.reporting.plots import spread_chart

    return spread_chart({r["rung"]: Spread(r["rates"]) for r in rows if "rates" in r}, "samples / s", title)


def format_ladder(rows: list[dict]) -> str:
    """The ladder as a Markdown table."""
    return markdown_table(
        ["rung", "samples/s (median)", "rounds: lowest-highest", "× baseline", "× previous"],
        [
            (row["rung"], f"skipped: {row['skipped']}", "", "", "")
            if "skipped" in row
            else (
                row["rung"],
                f"{row['samples_per_s']:,.0f}",
                f"{min(row['rates']):,.0f}-{max(row['rates']):,.0f}",
                f"{row['speedup']:.2f}",
                f"{row['vs_previous']:.2f}",
            )
            for row in rows
        ],
    )
