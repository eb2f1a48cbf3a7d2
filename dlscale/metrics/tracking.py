"""Metrics of a run: always CSV files in the run directory, Weights & Biases when asked.

``metrics.csv`` has one row per optimizer step (step, epoch, loss, lr, samples_per_s: its block of 10 steps' rate);
``validation.csv`` one row per epoch (epoch, step, mse, r2 and r2 per target);
``noise_scale.csv`` (when measured) the gradient noise scale estimates;
``trust_ratios.csv`` (LARS, LARC, LAMB) the trust ratio of every tensor each 10 steps. All are
plain files a notebook reads with the csv module or pandas. With ``tracking=wandb`` the
same rows also go to Weights & Biases, offline by default (``wandb sync`` uploads later);
the ``WANDB_MODE`` environment variable wins over the config. Only the main process
writes. On resume, rows logged after the checkpoint are dropped, since the resumed run
logs those steps again.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Sequence

from dlscale.config.train_config import LoggingSection
from dlscale.errors import DlscaleError, import_optional

TRAIN_FILE = "metrics.csv"
VAL_FILE = "validation.csv"
NOISE_FILE = "noise_scale.csv"
TRUST_FILE = "trust_ratios.csv"
TRAIN_COLUMNS = ["step", "epoch", "loss", "lr", "samples_per_s"]


class TrackingError(DlscaleError):
    """Tracking was asked for but cannot run; the message says what to install."""


def read_rows(path: str | Path) -> list[dict[str, float]]:
    """Rows of a metrics CSV with every value as a float (an absent file gives no rows)."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _truncate(path: Path, last_step: int) -> None:
    """Keep only the rows logged at or before ``last_step``."""
    if not path.is_file():
        return
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        columns, rows = reader.fieldnames, [r for r in reader if float(r["step"]) <= last_step]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _start_wandb(logging: LoggingSection, run_dir: Path, run_name: str, config: dict[str, Any]):
    wandb = import_optional("wandb", "tracking", "tracking=wandb", TrackingError, "or set tracking=csv")
    mode = os.environ.get("WANDB_MODE", logging.wandb_mode)
    run = wandb.init(
        project=logging.wandb_project,
        name=run_name,
        dir=str(run_dir),
        mode=mode,
        config=config,
        reinit="finish_previous",
    )
    # Step rows arrive in blocks of 10, after the noise-scale and validation rows of the same steps, and
    # W&B drops a row whose step= is below one already logged. So every row carries the optimizer step
    # as an ordinary value, and each series is plotted against it.
    run.define_metric("step")
    for prefix in WANDB_PREFIXES:
        run.define_metric(f"{prefix}/*", step_metric="step")
    return run


#: The W&B series: step rows, validation rows, noise-scale rows (trust ratios stay in their CSV file).
WANDB_PREFIXES = ("train", "val", "noise")


class MetricsLogger:
    """Writes the step and validation rows of one run (no-op on ranks other than the main one).

    It is given the config's logging section; W&B also records the run's name and its whole config.
    """

    def __init__(
        self,
        logging: LoggingSection,
        run_dir: str | Path,
        run_name: str = "",
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
        is_main: bool = True,
        val_columns: Sequence[str] = (),
    ):
        self.run_dir = Path(run_dir)
        self.enabled = is_main
        self.val_columns = ["epoch", "step", *val_columns]
        self._wandb = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (TRAIN_FILE, VAL_FILE, NOISE_FILE, TRUST_FILE):
            if resume_step is None:
                (self.run_dir / name).unlink(missing_ok=True)
            else:
                _truncate(self.run_dir / name, resume_step)
        self._train = open(self.run_dir / TRAIN_FILE, "a", newline="")
        self._train_csv = csv.DictWriter(self._train, fieldnames=TRAIN_COLUMNS)
        if self._train.tell() == 0:
            self._train_csv.writeheader()
        if logging.tracking == "wandb":
            self._wandb = _start_wandb(logging, self.run_dir, run_name, config or {})

    def log_steps(self, rows: list[dict[str, Any]]) -> None:
        """Append step rows (keys of ``TRAIN_COLUMNS``)."""
        if not self.enabled or not rows:
            return
        self._train_csv.writerows(rows)
        self._train.flush()
        if self._wandb is not None:
            for row in rows:
                self._log_wandb("train", row)

    def _append(self, name: str, columns: Sequence[str], row: dict[str, Any], prefix: str | None) -> None:
        """Append a row to one of the per-event CSV files (and to wandb under ``prefix/``, unless None)."""
        if not self.enabled:
            return
        path = self.run_dir / name
        new = not path.is_file() or path.stat().st_size == 0
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            if new:
                writer.writeheader()
            writer.writerow(row)
        if self._wandb is not None and prefix is not None:
            self._log_wandb(prefix, row)

    def _log_wandb(self, prefix: str, row: dict[str, Any]) -> None:
        self._wandb.log({"step": int(row["step"]), **{f"{prefix}/{k}": v for k, v in row.items() if k != "step"}})

    def log_validation(self, row: dict[str, Any]) -> None:
        """Append one validation row (``epoch``, ``step`` and the metric columns)."""
        self._append(VAL_FILE, self.val_columns, row, "val")

    def log_trust_ratios(self, columns: Sequence[str], row: dict[str, Any]) -> None:
        """Append the trust ratio of every parameter tensor (one column each) at ``step``."""
        self._append(TRUST_FILE, ["step", *columns], row, None)  # not to wandb: hundreds of series drown the rest

    def log_noise_scale(self, row: dict[str, Any]) -> None:
        """Append one noise-scale row: ``step``, this measurement's ``g2`` and ``trace``, the running ``b_simple``."""
        self._append(NOISE_FILE, ["step", "g2", "trace", "b_simple"], row, "noise")

    def summary(self, values: dict[str, Any]) -> None:
        if self._wandb is not None:
            self._wandb.summary.update(values)

    def close(self) -> None:
        if not self.enabled:
            return
        self._train.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def offline_wandb_runs(folder: str | Path) -> list[Path]:
    """The offline Weights & Biases runs under the run folders of ``folder`` (``tracking=wandb``, offline mode)."""
    return sorted(Path(folder).glob("*/wandb/offline-run-*"))


def wandb_sync_command(runs: list[Path], shown: int = 2) -> str:
    """The ``wandb sync`` line that uploads offline runs later (from a node with internet), the first few named."""
    return "wandb sync " + " ".join(map(str, runs[:shown])) + (" ..." if len(runs) > shown else "")
