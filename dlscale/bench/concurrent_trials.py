"""Concurrent trials or wider trials: the same devices spent on several searches at once, or on one at a time.

With ``workers`` devices a search can run ``workers`` trials at once, one device each, or one
trial at a time data-parallel over all of them (the per-device batch kept, so the global batch
grows). The first finishes more trials per hour whenever scaling is below 100% efficient; the
second finishes each trial sooner, which matters when the search waits for results (TPE learns
from them), until the wider trial's batch passes the gradient noise scale and it needs more
epochs for the same R² (lesson 07).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from dlscale.config import TrainConfig
from dlscale.jobs.notebook_engines import run_on_engines, train_rank


def train_in_own_folder(cfg: TrainConfig, folder: str) -> dict[str, Any]:
    """On an engine: train ``cfg`` alone in a folder of this process's own (several engines share ``folder``)."""
    return train_rank(cfg, run_dir=str(Path(folder) / f"engine-{os.getpid()}"))


def concurrent_or_wide(cfg: TrainConfig, workers: int, out_dir: str | Path) -> dict[str, Any]:
    """Measure both ways on ``workers`` notebook engines: wall time, trials per hour, R² and (wide) B_simple."""
    out_dir = Path(out_dir)
    quiet = {"progress": False, "plot": False, "threads": 1}  # one core per rank either way
    started = time.perf_counter()
    alone = run_on_engines(
        train_in_own_folder, workers, cfg.override(quiet), str(out_dir / "concurrent"), as_ranks=False
    )
    concurrent_s = time.perf_counter() - started
    wide_cfg = cfg.override(
        {
            **quiet,
            "global_batch_size": cfg.global_batch_size * workers,
            "run_dir": str(out_dir / "wide"),
            "noise_scale_every": 5,
        }
    )
    started = time.perf_counter()
    wide = run_on_engines(train_rank, workers, wide_cfg)
    wide_s = time.perf_counter() - started
    summary = json.loads((out_dir / "wide/summary.json").read_text())
    return {
        "workers": workers,
        "concurrent": {
            "seconds": concurrent_s,
            "trials_per_hour": workers * 3600 / concurrent_s,
            "r2": statistics.fmean(r["r2"] for r in alone),
            "global_batch": cfg.global_batch_size,
        },
        "wide": {
            "seconds": wide_s,
            "trials_per_hour": 3600 / wide_s,
            "r2": wide[0]["r2"],
            "global_batch": wide_cfg.global_batch_size,
            "noise_scale": summary.get("noise_scale"),
        },
    }
