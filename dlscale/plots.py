"""Figures shared by the notebooks and the reports, built with matplotlib's object API.

Functions return a :class:`matplotlib.figure.Figure` without touching pyplot's global
state, so they work the same in a notebook (the figure displays itself), in a batch
job with no display, and inside the training loop that saves ``loss_curve.png``.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .tracking import TRAIN_FILE, VAL_FILE, read_rows


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_curves(run_dir: str | Path, title: str | None = None) -> Figure:
    """Training loss per step (raw and smoothed) with validation MSE, and validation R² per epoch."""
    run_dir = Path(run_dir)
    train, val = read_rows(run_dir / TRAIN_FILE), read_rows(run_dir / VAL_FILE)
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, r2_ax = fig.subplots(1, 2)
    if train:
        steps, losses = [r["step"] for r in train], [r["loss"] for r in train]
        loss_ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="train (per step)")
        loss_ax.plot(steps, _smooth(losses, max(1, len(losses) // 50)), color="tab:blue", label="train (smoothed)")
    if val:
        loss_ax.plot([r["step"] for r in val], [r["mse"] for r in val], "o-", color="tab:orange", label="validation")
        r2_ax.plot([r["epoch"] for r in val], [r["r2"] for r in val], "o-", color="tab:green", label="mean")
        for key in (k for k in val[0] if k.startswith("r2_")):
            r2_ax.plot([r["epoch"] for r in val], [r[key] for r in val], ".--", alpha=0.7, label=key[3:])
    loss_ax.set(xlabel="optimizer step", ylabel="MSE (normalised targets)", yscale="log", title="loss")
    r2_ax.set(xlabel="epoch", ylabel="R²", title="validation R²", ylim=(min(0.0, *(r["r2"] for r in val)) if val else 0, 1))
    for ax in (loss_ax, r2_ax):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    fig.suptitle(title or run_dir.name)
    return fig
