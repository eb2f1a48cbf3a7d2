"""Check of lesson 12's exercise: a search space that beats the config's defaults within a budget of trials.

The check loads the learner's space (a mistake in it gets the space's own message), trains the
defaults once, runs a TPE search with pruning on worker processes, and re-runs the best trial:
on a CPU a trial's result is a property of its settings, so the re-run must give the same value,
and that value must beat the defaults.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dlscale.hpo import SearchSpaceError, load_space
from dlscale.hpo.launch import rerun_best, search


def baseline_value(space: Any, run_dir: str | Path) -> float:
    """The space's metric for its base config with only the fixed overrides: what a search must beat."""
    from dlscale.training.loop import train_quietly

    result = train_quietly(space.config({}, run_dir=str(run_dir), progress=False, plot=False))
    return float(result.final[space.metric])


def check_space(space: dict[str, Any], budget: int = 8, workers: int = 2,
                study_dir: str | Path = "runs/exercise12") -> dict[str, float]:
    """12.1: search ``space`` with ``budget`` trials; the best must re-run to the same value and beat the defaults."""
    if not isinstance(space, dict):
        raise AssertionError(f"return the space as a dict (base, fixed, parameters), got {type(space).__name__}")
    try:
        loaded = load_space(space)
    except SearchSpaceError as err:
        raise AssertionError(f"the space is refused: {err}") from None
    if loaded.metric != "r2" or loaded.direction != "maximize":
        raise AssertionError("search for the highest validation R² (metric: r2, direction: maximize)")
    if set(loaded.fixed) - {"epochs", "checkpoint_every", "keep_checkpoints", "progress", "plot"} \
            or loaded.fixed.get("epochs", 6) > 6:
        raise AssertionError("keep the data and the budget as given: fixed may set epochs (at most 6) and the "
                             "checkpoint settings only; a bigger dataset or more epochs is not a better setting")
    study_dir = Path(study_dir)
    shutil.rmtree(study_dir, ignore_errors=True)  # each check searches afresh
    baseline = baseline_value(loaded, study_dir / "defaults")
    search(study_dir, loaded, trials=budget, workers=workers, sampler="tpe", pruner="hyperband")
    best, again = rerun_best(study_dir)
    if again != best:
        raise AssertionError(f"the best trial gave R² {best:.6f} in the search but {again:.6f} when re-run: "
                             f"something in the space changes between runs (a seed?)")
    if best <= baseline:
        raise AssertionError(f"the best of {budget} trials reached R² {best:.4f}, not above the defaults' "
                             f"{baseline:.4f}. Search what matters most (the learning rate, log-uniform over a "
                             f"decade or two, and the batch), and leave out parameters that only spread the budget thin")
    print(f"Exercise 12.1 passed ✓ best R² {best:.4f} (re-run: {again:.4f}) against the defaults' {baseline:.4f}")
    return {"best": best, "rerun": again, "baseline": baseline}
