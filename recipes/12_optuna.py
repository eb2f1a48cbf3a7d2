# recipes/12_optuna.py
"""Hyperparameter search in plain Optuna: stage 03's training as the objective, pruned after each epoch.

The study lives in a journal file that every worker appends to (no database server), so one worker or
many at once (a Slurm job array: recipes/jobs/12_search.sbatch) share it. Each worker asks for a
trial, trains it one epoch at a time (stage 03 resuming the trial's own checkpoint), reports the
validation R² after each epoch, stops a trial that trails the others (the median pruner), and stops
asking once the study holds --trials finished trials (MaxTrialsCallback):

    python recipes/12_optuna.py --trials 8 --epochs 4
    sbatch --array=0-3 recipes/jobs/12_search.sbatch --trials 32 --epochs 8
"""
import importlib.util
import os

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from training_tools import parse_args

HERE = os.path.dirname(os.path.abspath(__file__))


def load_stage(file: str):
    """A stage of this folder as a module (its name starts with a digit, so `import` cannot name it)."""
    spec = importlib.util.spec_from_file_location(file[:-3].replace("-", "_"), os.path.join(HERE, file))
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    return stage


def objective(trial: optuna.Trial, epochs: int, folder: str, **fixed) -> float:
    """Train stage 03 with the trial's settings; its score is the last epoch's validation R²."""
    settings = {"lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True),
                "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
                "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64])}
    train = load_stage("03_mixed_precision.py").main
    checkpoint = os.path.join(folder, f"trial-{trial.number}.pt")
    for epoch in range(epochs):  # one more epoch each time, from the trial's checkpoint: a report after each
        r2 = train(epochs=epoch + 1, resume=True, checkpoint=checkpoint, **settings, **fixed)["r2"][-1]
        trial.report(r2, epoch)
        if trial.should_prune():  # below the median of the earlier trials at this epoch
            raise optuna.TrialPruned()
    return r2


def main(study: str = "recipe-search", storage: str = "search.journal", trials: int = 8, epochs: int = 4,
         seed: int = 0, config: str = "tiny", precision: str = "bf16", workers: int = 2) -> dict:
    # a worker's seed (e.g. its array task) makes its sampler's first, random trials differ from the others'
    journal = JournalStorage(JournalFileBackend(storage))  # appended under a file lock: workers may share it
    search = optuna.create_study(study_name=study, storage=journal, direction="maximize", load_if_exists=True,
                                 sampler=optuna.samplers.TPESampler(seed=seed),
                                 pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))
    folder = os.path.join(os.path.dirname(os.path.abspath(storage)), f"{study}-trials")
    os.makedirs(folder, exist_ok=True)
    done = MaxTrialsCallback(trials, states=(TrialState.COMPLETE, TrialState.PRUNED))  # counted over all workers
    search.optimize(lambda trial: objective(trial, epochs, folder, config=config, precision=precision,
                                            workers=workers, log_every=1000), callbacks=[done])
    finished = search.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    best = search.best_trial
    print(f"{len(finished)} trials finished; the best, trial {best.number}: R² {best.value:.4f} with {best.params}")
    return {"finished": len(finished), "best": best.params, "r2": best.value}


if __name__ == "__main__":
    main(**parse_args(main))
