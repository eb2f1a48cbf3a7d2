"""The large-batch experiment of lesson 07: which recipes keep accuracy as the batch grows.

A baseline batch ``B0`` trains with a tuned LR. Then each multiple ``k·B0`` trains for
the *same number of epochs* (so ``k`` times fewer steps) with each recipe:

=================  ===========================================================
no scaling         SGD at the baseline LR
sqrt               SGD at ``lr·sqrt(k)``
linear             SGD at ``lr·k`` (Goyal et al.), no warmup
linear + warmup    SGD at ``lr·k``, warming up from ``lr`` over the first epoch(s)
LARS + warmup      LARS (its own LR scale), linear scaling, warmup
LAMB + warmup      LAMB, square-root scaling, warmup
=================  ===========================================================

The baseline run also measures the gradient noise scale ``B_simple`` (averaged over the
first half of its training, where the gradient is still large), which predicts roughly
where larger batches stop paying. Every run is an ordinary ``dlscale.train`` run
with its own run directory; the table and the figure are written next to them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dlscale.config import load_config
from dlscale.errors import importable
from dlscale.metrics.noise_scale import noise_scale_of_rows
from dlscale.metrics.steplog import DivergedError
from dlscale.metrics.tracking import NOISE_FILE, read_rows
from dlscale.optim.schedules import scale_lr
from dlscale.reporting.plots import NotebookFigure
from dlscale.reporting.tables import markdown_table

#: What each recipe changes, on top of the experiment's base settings.
RECIPES: dict[str, dict[str, Any]] = {
    "no scaling": {"optimizer": "sgd", "lr_scaling": "none"},
    "sqrt": {"optimizer": "sgd", "lr_scaling": "sqrt"},
    "linear": {"optimizer": "sgd", "lr_scaling": "linear"},
    "linear + warmup": {"optimizer": "sgd", "lr_scaling": "linear", "warmup": True},
    "LARS + warmup": {"optimizer": "lars", "lr_scaling": "linear", "warmup": True, "lr_key": "lars_lr"},
    "LAMB + warmup": {"optimizer": "lamb", "lr_scaling": "sqrt", "warmup": True, "lr_key": "lamb_lr"},
}


@dataclass
class SweepSize:
    """The sizes of one sweep: ``ci`` runs in minutes on 2 CPU cores, ``full`` is for one GPU, ``smoke`` only
    runs every step of the lesson (in seconds)."""

    base_config: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)
    base_batch: int = 16
    multiples: tuple[int, ...] = (8, 32, 128)
    epochs: int = 4
    sgd_lr: float = 0.02
    lars_lr: float = 0.05
    lars_trust: float = 0.01
    lamb_lr: float = 0.003
    warmup_epochs: float = 1.0


SIZES = {
    "ci": SweepSize(overrides={"train_samples": 8192, "val_samples": 1024, "shard_size": 2048}),
    # every cell of lesson 07 in seconds (the tests' size); its numbers are too few to tell the story. On the base
    # config's own data set (tiny's 1,024 maps), which the lesson's stage has already made: no second set to write
    "smoke": SweepSize(epochs=2),
    "full": SweepSize(
        base_config="gpu", overrides={"channels_last": True}, base_batch=32, epochs=10, multiples=(8, 32, 128)
    ),
}


def _run(
    name: str, out_dir: Path, size: SweepSize, batch: int, recipe: dict[str, Any] | None, extra: dict[str, Any]
) -> dict[str, Any]:
    from dlscale.training.loop import train_quietly

    recipe = recipe or {"optimizer": "sgd", "lr_scaling": "none"}
    lr = getattr(size, recipe.get("lr_key", "sgd_lr"))
    overrides = {
        **size.overrides,
        "name": name,
        "run_dir": str(out_dir / name),
        "epochs": size.epochs,
        "global_batch_size": batch,
        "base_batch": size.base_batch,
        "lr": lr,
        "optimizer": recipe["optimizer"],
        "lr_scaling": recipe["lr_scaling"],
        "warmup_steps": 0,
        "warmup_epochs": size.warmup_epochs if recipe.get("warmup") else 0.0,
        "decay": "cosine",
        "checkpoint_every": 0,
        "keep_checkpoints": 1,
        "progress": False,
        "plot": False,
        **extra,
    }
    if recipe["optimizer"] == "lars":
        overrides["trust_coefficient"] = size.lars_trust
    cfg = load_config(size.base_config, overrides)
    try:
        result = train_quietly(cfg)
    except DivergedError as err:
        # A recipe that diverges is a finding of the sweep, not a failure of it: the table says "diverged".
        return {
            "batch": batch,
            "steps": err.step,
            "optimizer": recipe["optimizer"],
            "peak_lr": scale_lr(cfg.lr, cfg.base_batch, cfg.global_batch_size, cfg.lr_scaling),
            "val_mse": math.nan,
            "val_r2": math.nan,
            "noise_scale": math.nan,
        }
    rows = read_rows(result.run_dir / NOISE_FILE)
    return {
        "batch": batch,
        "steps": result.steps_done,
        "optimizer": recipe["optimizer"],
        "peak_lr": result.peak_lr,
        "val_mse": result.final.get("mse", math.nan),
        "val_r2": result.final.get("r2", math.nan),
        "noise_scale": noise_scale_of_rows(rows, until_step=result.total_steps / 2),
    }


def large_batch_sweep(
    out_dir: str | Path = "runs/large_batch",
    size: str | SweepSize = "ci",
    recipes: list[str] | None = None,
    multiples: tuple[int, ...] | None = None,
    progress: bool = True,
    tracking: str = "csv",
    wandb_project: str = "dlscale-sweep",
) -> list[dict[str, Any]]:
    """Run the sweep; return its rows and write ``table.csv``, ``table.md`` and ``sweep.png`` in ``out_dir``.

    With ``tracking="wandb"`` every run also logs to Weights & Biases (offline unless
    ``WANDB_MODE`` says otherwise) in ``wandb_project``, one W&B run per sweep run, named as its folder;
    without wandb installed the sweep says so and logs to CSV only.
    """
    if tracking == "wandb" and not importable("wandb"):
        print("wandb is not installed (pip install -e '.[tracking]'): the sweep logs to CSV only")
        tracking = "csv"
    size = SIZES[size] if isinstance(size, str) else size
    out_dir = Path(out_dir)
    recipes = list(RECIPES) if recipes is None else recipes
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        raise ValueError(f"unknown recipe(s) {unknown}; choose from {list(RECIPES)}")
    multiples = multiples or size.multiples
    jobs = [("baseline", size.base_batch, None)] + [
        (r, k * size.base_batch, RECIPES[r]) for k in multiples for r in recipes
    ]
    rows = []
    for recipe_name, batch, recipe in tqdm(jobs, desc="large-batch sweep", unit="run", disable=not progress):
        slug = recipe_name.replace(" + ", "-").replace(" ", "-").lower()
        extra = {"noise_scale_every": 5} if recipe is None else {}
        if tracking != "csv":
            extra.update(tracking=tracking, wandb_project=wandb_project)
        row = _run(f"b{batch}-{slug}", out_dir, size, batch, recipe, extra)
        rows.append({"recipe": recipe_name, "multiple": batch // size.base_batch, **row})
    write_table(rows, out_dir)
    sweep_figure(rows).savefig(out_dir / "sweep.png", dpi=120)
    return rows


def write_table(rows: list[dict[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "table.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out_dir / "table.md").write_text(format_table(rows) + "\n")
    (out_dir / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")


def format_table(rows: list[dict[str, Any]]) -> str:
    """Validation R² per recipe (rows) and batch (columns), with the baseline and its noise scale."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    batches = sorted({r["batch"] for r in rows if r["recipe"] != "baseline"})

    def cell(recipe: str, batch: int) -> str:
        row = next((r for r in rows if r["recipe"] == recipe and r["batch"] == batch), None)
        if row is None:
            return ""
        if not math.isfinite(row["val_r2"]) or row["val_r2"] < -1:
            return "diverged"
        return f"R² {row['val_r2']:.3f}, MSE {row['val_mse']:.4f}"

    recipes = dict.fromkeys(r["recipe"] for r in rows if r["recipe"] != "baseline")
    table = markdown_table(
        ["recipe", *(f"batch {b} ({b // baseline['batch']}×)" for b in batches)],
        [(recipe, *(cell(recipe, b) for b in batches)) for recipe in recipes],
    )
    return (
        f"baseline: batch {baseline['batch']}, {baseline['steps']} steps, validation R² {baseline['val_r2']:.3f} "
        f"(MSE {baseline['val_mse']:.4f}); measured noise scale B_simple ≈ {baseline['noise_scale']:.0f}\n\n"
        f"{table}"
    )


def sweep_figure(rows: list[dict[str, Any]]) -> NotebookFigure:
    """Validation R² against the global batch, one line per recipe, the baseline and B_simple marked."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    fig = NotebookFigure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    floor = -0.2
    for recipe in dict.fromkeys(r["recipe"] for r in rows if r["recipe"] != "baseline"):
        points = sorted((r["batch"], r["val_r2"]) for r in rows if r["recipe"] == recipe)
        # a diverged run (NaN, or R² far below 0) is drawn as a cross on the floor of the plot
        shown = [(b, v if math.isfinite(v) and v > floor else floor + 0.03) for b, v in points]
        (line,) = ax.plot(*zip(*shown), "o-", label=recipe)
        failed = [(b, floor + 0.03) for b, v in points if not (math.isfinite(v) and v > floor)]
        if failed:
            ax.plot(*zip(*failed), "x", color=line.get_color(), markersize=10, markeredgewidth=2)
    ax.axhline(
        baseline["val_r2"], color="black", linestyle="--", linewidth=1, label=f"baseline (batch {baseline['batch']})"
    )
    if math.isfinite(baseline["noise_scale"]) and baseline["noise_scale"] > 0:
        ax.axvline(baseline["noise_scale"], color="grey", linestyle=":", label="noise scale B_simple")
    ax.set(
        xscale="log",
        xlabel="global batch size (same number of epochs)",
        ylabel="validation R²",
        title="large-batch training: which recipes keep up? (✕: diverged)",
        ylim=(floor, 1.0),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return fig
