"""What a study found: the trials as a table, the best value against node-hours spent, the plots.

Each trial is an ordinary run folder (``trials/trial-NNNN``), so ``dlscale report`` reads them
like any sweep; this module adds what only the study knows: which trials were pruned or
retried, what each cost, and Optuna's own plots (history, parallel coordinates, importances).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from dlscale.hpo.study import StudyError, open_study, trial_folder
from dlscale.metrics.tracking import VAL_FILE, read_rows


def trial_rows(study_dir: str | Path) -> list[dict[str, Any]]:
    """One row per trial, in the order they finished: state, parameters, value, epochs, seconds, node-hours."""
    study, _ = open_study(study_dir)
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                **t.params,
                "value": t.value if t.value is not None else math.nan,
                "epochs": attrs.get("epochs", 0),
                "seconds": attrs.get("seconds", math.nan),
                "node_hours": attrs.get("node_hours", 0.0),
                "retry_of": t.system_attrs.get("failed_trial"),
                "why": attrs.get("failed_because", ""),
                "run_dir": str(trial_folder(study_dir, attrs["run_dir"])) if attrs.get("run_dir") else "",
                "finished": t.datetime_complete.timestamp() if t.datetime_complete else math.inf,
            }
        )
    return sorted(rows, key=lambda r: (r["finished"], r["trial"]))


def best_by_budget(rows: list[dict[str, Any]], maximize: bool = True) -> list[tuple[float, float]]:
    """(node-hours spent so far, best value so far) after each finished trial: the search's progress per cost."""
    spent, best, points = 0.0, -math.inf if maximize else math.inf, []
    for row in rows:
        spent += row["node_hours"] or 0.0
        if row["state"] == "complete" and math.isfinite(row["value"]):
            best = max(best, row["value"]) if maximize else min(best, row["value"])
        if row["state"] in ("complete", "pruned", "fail"):
            points.append((spent, best))
    return points


def curves(rows: list[dict[str, Any]], metric: str = "r2") -> dict[int, tuple[list[int], list[float], str]]:
    """Each trial's validation metric by epoch, read from its run folder, with the trial's state."""
    out = {}
    for row in rows:
        history = read_rows(Path(row["run_dir"]) / VAL_FILE) if row["run_dir"] else []
        if history:
            out[row["trial"]] = ([int(h["epoch"]) for h in history], [float(h[metric]) for h in history], row["state"])
    return out


def best_trial(study_dir: str | Path) -> dict[str, Any]:
    """The best complete trial's number, parameters, value and run folder."""
    from optuna.trial import TrialState

    study, _ = open_study(study_dir)
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        raise StudyError(
            f"the study in {study_dir} has no complete trial yet: start workers on it "
            f"(`dlscale hpo worker --dir {study_dir}`), or wait for them"
        )
    best = study.best_trial
    return {
        "trial": best.number,
        "params": dict(best.params),
        "value": best.value,
        "run_dir": str(trial_folder(study_dir, best.user_attrs["run_dir"])) if best.user_attrs.get("run_dir") else "",
    }


def save_optuna_plots(study_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Optuna's matplotlib plots of the study as PNGs: history, parallel coordinates, parameter importances."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots
    from optuna.exceptions import ExperimentalWarning

    study, _ = open_study(study_dir)
    out_dir = Path(out_dir or study_dir)
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        for name, plot in (
            ("history", plots.plot_optimization_history),
            ("parallel_coordinates", plots.plot_parallel_coordinate),
            ("importances", plots.plot_param_importances),
        ):
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as err:  # e.g. importances need two complete trials
                print(f"(no {name} plot: {err})")
                continue
            figure = getattr(axes, "figure", None) or axes.flat[0].figure
            path = out_dir / f"{name}.png"
            figure.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(figure)
            written.append(path)
    return written


def importances(study_dirs: list[str | Path]) -> tuple[dict[str, list[float]], list[int]]:
    """Optuna's parameter importances (fANOVA) of each study, a column per study: {parameter: [importance...]}, and
    how many complete trials each rests on. Studies of the same space and sampler run with other seeds show how far
    the importances of a few trials move with the draw."""
    import optuna
    from optuna.exceptions import ExperimentalWarning
    from optuna.trial import TrialState

    table: dict[str, list[float]] = {}
    counts = []
    for column, study_dir in enumerate(study_dirs):
        study, _ = open_study(study_dir)
        counts.append(len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            try:
                found = optuna.importance.get_param_importances(study)
            except (ValueError, RuntimeError):  # fewer than two complete trials
                found = {}
        for name, value in found.items():
            table.setdefault(name, [math.nan] * len(study_dirs))[column] = value
    return table, counts


def format_trials(rows: list[dict[str, Any]], metric: str = "r2") -> str:
    """The trials as a Markdown table: state, parameters, value, epochs and node-hours."""
    from dlscale.reporting.tables import markdown_table

    fixed = {"trial", "state", "value", "epochs", "seconds", "node_hours", "retry_of", "why", "run_dir", "finished"}
    names = sorted({k for row in rows for k in row} - fixed)

    def cell(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    table = [
        [
            row["trial"],
            row["state"] + (f" (retry of {row['retry_of']})" if row["retry_of"] is not None else ""),
            *(cell(row.get(n, "")) for n in names),
            cell(row["value"]),
            row["epochs"],
            f"{row['node_hours']:.2e}",
        ]
        for row in rows
    ]
    return markdown_table(["trial", "state", *names, metric, "epochs", "node-hours"], table)
