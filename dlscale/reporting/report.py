"""``dlscale report``: the run directories of a scaling sweep as one table and one plot.

Each run directory holds ``summary.json``, ``config.yaml``, ``metrics.csv`` and
``validation.csv`` (written by rank 0 of ``dlscale.train``). Runs are grouped by their
directory name without its size suffix (``weak-n4`` → ``weak``, as ``slurm/sweep.sh`` names
them), and each group's efficiency is the throughput per rank relative to the group's
smallest run — for weak and strong scaling alike. The time to target is the training time
(validation and checkpoints excluded) until the validation R² first reaches the target.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from dlscale.errors import DlscaleError
from dlscale.metrics.tracking import TRAIN_FILE, VAL_FILE, read_rows
from dlscale.reporting.tables import markdown_table


class ReportError(DlscaleError):
    """No run directories where the report looked; the message says where that was."""


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories (those with a ``summary.json``) at or below each path, sorted."""
    runs = set()
    for path in map(Path, paths):
        if (path / "summary.json").is_file():
            runs.add(path)
        elif path.is_dir():
            runs.update(summary.parent for summary in path.rglob("summary.json"))
            # (rglob does not enter linked folders: a sweep's strong-n1 is a link to weak-n1, the same run)
            runs.update(summary.parent for summary in path.glob("*/summary.json"))
        else:
            raise ReportError(f"{path} is not a folder")
    if not runs:
        raise ReportError(
            f"no run directories (with a summary.json) under {', '.join(map(str, paths))}: "
            f"let the jobs finish, or point at the folder the sweep wrote"
        )
    return sorted(runs)


def _group(name: str) -> str:
    return re.sub(r"-n?\d+$", "", name) or name


def time_to_target(run: Path, target_r2: float) -> float | None:
    """Training seconds until the validation R² first reached ``target_r2`` (None if it never did)."""
    reached = next(
        (row["step"] for row in read_rows(run / VAL_FILE) if row.get("r2", float("-inf")) >= target_r2), None
    )
    if reached is None:
        return None
    summary = read_summary(run)
    batch = summary.get("global_batch_size")
    seconds = 0.0
    for row in read_rows(run / TRAIN_FILE):
        if row["step"] > reached:
            break
        if row.get("samples_per_s", 0) > 0 and batch:
            seconds += batch / row["samples_per_s"]
    return seconds


def read_summary(run: Path) -> dict:
    """A run's ``summary.json``, checked: ranks and nodes whole numbers of at least 1, samples/s a number >= 0.

    A file cut short (a run killed while writing it) or edited by hand is one :class:`ReportError` naming it.
    """
    path = Path(run) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"{path} cannot be read ({err}): re-run that run, or leave its folder out") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path} is not a run summary (a JSON object): re-run that run, or leave its folder out")
    for key in ("world_size", "nodes"):
        value = summary.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ReportError(f"{path}: {key} must be a whole number of at least 1, not {value!r}")
    speed = summary.get("samples_per_s")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed < 0:
        raise ReportError(f"{path}: samples_per_s must be a number of at least 0, not {speed!r}")
    return summary


def collect(paths: list[str | Path], target_r2: float = 0.9) -> list[dict]:
    """One row per run: group, nodes, ranks, global batch, samples/s, efficiency, R², time to target."""
    rows = []
    for run in find_runs(paths):
        summary = read_summary(run)
        ranks = int(summary.get("world_size", 1))
        rows.append(
            {
                "run": run.name,
                "group": _group(run.name),
                "path": str(run),
                "nodes": int(summary.get("nodes", 1)),
                "ranks": ranks,
                "device": summary.get("device", ""),
                "global_batch_size": summary.get("global_batch_size"),
                "samples_per_s": float(summary["samples_per_s"]),
                "r2": summary.get("r2"),
                "seconds": summary.get("seconds"),
                "time_to_target_s": time_to_target(run, target_r2),
            }
        )
    for row in rows:
        first = min((r for r in rows if r["group"] == row["group"]), key=lambda r: (r["ranks"], r["run"]))
        per_rank, first_per_rank = row["samples_per_s"] / row["ranks"], first["samples_per_s"] / first["ranks"]
        row["efficiency"] = per_rank / first_per_rank if first_per_rank > 0 else None
    return sorted(rows, key=lambda r: (r["group"], r["ranks"], r["run"]))


def format_report(rows: list[dict], target_r2: float = 0.9) -> str:
    return markdown_table(
        ["run", "nodes", "ranks", "global batch", "samples/s", "efficiency", "R²", f"time to R² {target_r2:g}"],
        [
            (
                r["run"],
                r["nodes"],
                r["ranks"],
                r["global_batch_size"],
                f"{r['samples_per_s']:,.0f}",
                f"{r['efficiency']:.0%}" if r["efficiency"] is not None else "",
                f"{r['r2']:.3f}" if r["r2"] is not None else "",
                f"{r['time_to_target_s']:.1f} s" if r["time_to_target_s"] is not None else "not reached",
            )
            for r in rows
        ],
    )


def write_report(rows: list[dict], out_dir: str | Path) -> Path:
    """``report.csv`` and ``report.png`` (throughput and efficiency against ranks, per group) in ``out_dir``."""
    from dlscale.reporting.plots import scaling_curves

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "report.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    curves = [
        {
            "mode": r["group"],
            "processes": r["ranks"],
            "samples_per_s": r["samples_per_s"],
            "efficiency": r["efficiency"] or 0.0,
        }
        for r in rows
    ]
    scaling_curves(curves).savefig(out_dir / "report.png", dpi=120)
    return out_dir
