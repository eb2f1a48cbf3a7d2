"""A worker of a study: ask for a trial, train it on the one engine, tell the result; again until done.

Any number of workers share a study through its folder (:mod:`dlscale.hpo.study`): processes
started by ``dlscale hpo start``, tasks of a Slurm job array (``slurm/*/hpo.sbatch``) or
notebook engines. Each trial is an ordinary ``dlscale.train`` run in ``trials/trial-NNNN``.
Pruning uses the engine's stop path: after each epoch the trial reports the validation
metric, and when the pruner says stop the run checkpoints and ends as on a signal.

A worker launched with several ranks (``torchrun``, ``srun`` with ``DLSCALE_TRIAL_RANKS=all``)
trains each trial data-parallel over all of them: rank 0 talks to the study and hands the
trial's settings to the others.

Why ask and tell by hand, where the plain recipe (``recipes/12_optuna.py``) has
``study.optimize`` with a ``MaxTrialsCallback``: before each ask a worker fails the trials of
dead workers (a callback runs only after a trial, too late for a worker's first); when the last
trials run elsewhere it waits rather than stops, in case one of them dies and its retry needs a
worker (``MaxTrialsCallback`` counts finished trials, so idle workers would leave); and with
several ranks only rank 0 may ask, while every rank trains.
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from dlscale import distributed
from dlscale.config import parse_overrides
from dlscale.errors import DlscaleError
from dlscale.hpo import optuna_api
from dlscale.hpo.heartbeat import Heartbeat, fail_stale_trials
from dlscale.hpo.study import TRIALS_DIR, StudySettings, finished_trial_error, load_optuna, open_study, read_settings
from dlscale.metrics.steplog import DivergedError
from dlscale.runtime.threads import choose_threads

WORKERS_DIR = "workers"


class _Pruning:
    """The engine's epoch callback: report the metric to the trial, stop when the pruner says so."""

    name = "the search's pruner"

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.metric, self.pruned = trial, metric, False

    def __call__(self, epoch: int, metrics: dict[str, float]) -> bool:
        value = metrics.get(self.metric, math.nan)
        try:
            if math.isfinite(value):
                self.trial.report(value, epoch)
            self.pruned = self.trial.should_prune()
        except finished_trial_error():  # failed as silent by another worker (this one was stalled): stop
            return True
        return self.pruned


def claim_worker_number(study_dir: str | Path) -> int:
    """The lowest worker number no other worker of this study took (a folder made atomically)."""
    folder = Path(study_dir) / WORKERS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    while True:
        try:
            (folder / str(number)).mkdir()
        except FileExistsError:
            number += 1
            continue
        (folder / str(number) / "where").write_text(f"{socket.gethostname()} pid {os.getpid()}\n")
        return number


def counts(study: Any) -> tuple[int, int]:
    """(trials finished, complete or pruned; trials running now)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    return done, sum(t.state == TrialState.RUNNING for t in trials)


def run_worker(
    study_dir: str | Path, extra: list[str] | tuple[str, ...] = (), max_trials: int | None = None, quiet: bool = True
) -> list[int]:
    """Work on the study in ``study_dir`` until it has its trials (or this worker ran ``max_trials``).

    ``extra`` are ``key=value`` overrides for every trial of this worker (``device=cuda``).
    Returns the numbers of the trials this worker ran.
    """
    optuna = load_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    env = distributed.detect()
    if env.distributed:
        env = distributed.init(timeout_s=600.0)
    study_dir = Path(study_dir)
    ran: list[int] = []
    finished = False
    try:
        if env.is_main:
            read_settings(study_dir)  # (no study there: say so before a worker folder is made)
            study, settings = open_study(study_dir, claim_worker_number(study_dir))
            overrides_for_all = parse_overrides([*settings.extra, *extra])
            _check_overrides(settings, overrides_for_all)  # (before a trial starts: a bad one would fail them all)
        failures = _FailureStreak()
        stopping = False
        while True:
            task = (
                None
                if stopping or not env.is_main
                else _next_trial(study, settings, study_dir, ran, max_trials, overrides_for_all)
            )
            overrides = task[1] if task else None
            if env.distributed:  # rank 0 asked; every rank trains the same trial
                overrides = distributed.broadcast_object(overrides)
            if overrides is None:
                break
            if not env.is_main:
                _train(overrides, None, None, quiet)
                continue
            trial = task[0]
            with Heartbeat(study_dir, trial.number, settings.heartbeat_s):
                value, state, stopping = _train(overrides, trial, settings, quiet)
            study.tell(trial, value, state=state, skip_if_finished=True)
            stopping = failures.add(trial.user_attrs.get("refused_because")) or stopping
            ran.append(trial.number)
            if not quiet:
                print(
                    f"trial {trial.number}: {state.name.lower()}"
                    + (f", {settings.search_space.metric} {value:.4f}" if value is not None else ""),
                    flush=True,
                )
        finished = True
        if env.is_main and failures.stopped:
            raise WorkerError(failures.stopped)
    finally:
        if env.distributed:
            # drained at a normal end (a barrier, then a pause: else a rank can die of SIGABRT at exit, see
            # distributed.shutdown); after a failure a peer may be gone, so no barrier
            distributed.shutdown(drain=finished)
    return ran


class WorkerError(DlscaleError):
    """A worker that stopped: every trial it ran failed the same way."""


#: Trials in a row that fail for the same reason before a worker stops (the reason is the same setting's fault).
FAILURES_IN_A_ROW = 3


class _FailureStreak:
    """Counts the trials in a row that the engine refused for one reason (a divergence is a finding, and does not
    count); ``stopped`` says why the worker should stop."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.count = 0
        self.stopped: str | None = None

    def add(self, reason: str | None) -> bool:
        """Record a trial's failure reason (None: it did not fail); True when the worker must stop."""
        self.count = self.count + 1 if reason is not None and reason == self.reason else int(reason is not None)
        self.reason = reason
        if self.count >= FAILURES_IN_A_ROW:
            self.stopped = (
                f"{self.count} trials in a row failed the same way, so this worker stopped: {reason}. "
                f"Fix the setting, then `dlscale hpo start --dir` again resumes the study"
            )
        return self.stopped is not None


def _check_overrides(settings: StudySettings, extra: dict[str, Any]) -> None:
    """The overrides every trial of this worker shares, on the study's base: known keys of the right type, and a
    device this node has (a config error or a DeviceError, before any trial runs)."""
    from dlscale.runtime.devices import resolve_device

    resolve_device(settings.search_space.config({}, **extra).device)


def _next_trial(
    study: Any, settings: StudySettings, study_dir: Path, ran: list[int], max_trials: int | None, extra: dict[str, Any]
) -> tuple[Any, dict[str, Any]] | None:
    """The next trial to train and its overrides (``extra``'s last), or None when the study (or this worker) is
    done."""
    while max_trials is None or len(ran) < max_trials:
        fail_stale_trials(study, study_dir, settings.grace_s, settings.max_retry)
        done, running = counts(study)
        if done >= settings.trials:
            return None
        if done + running >= settings.trials:  # the last trials are running elsewhere: wait, in case one dies
            time.sleep(settings.heartbeat_s)
            continue
        trial = study.ask()
        space = settings.search_space
        run_dir = study_dir / TRIALS_DIR / f"trial-{trial.number:04d}"
        # the thread count is fixed in each trial's config, so that a re-run of it computes in the same order
        threads = settings.threads or choose_threads().count
        overrides = {
            **space.overrides(trial),
            "name": run_dir.name,
            "run_dir": str(run_dir),
            "progress": False,
            "plot": False,
            "threads": threads,
            **extra,
            "_base": space.base,
        }
        trial.set_user_attr("run_dir", run_dir.relative_to(study_dir).as_posix())  # (the study may move)
        trial.set_user_attr("host", socket.gethostname())
        return trial, overrides
    return None


def _train(
    overrides: dict[str, Any], trial: Any, settings: StudySettings | None, quiet: bool
) -> tuple[float | None, Any, bool]:
    """Train one trial; returns (value, state, whether this worker must stop)."""
    from optuna.trial import TrialState

    from dlscale.training.loop import train, train_quietly

    overrides = dict(overrides)
    base = overrides.pop("_base")
    pruning = _Pruning(trial, settings.search_space.metric) if trial is not None else None
    started = time.perf_counter()
    try:
        result = (train_quietly if quiet else train)(base, on_epoch=pruning, **overrides)
    except DlscaleError as err:  # diverged, or settings the engine refuses: a finding, and the search goes on
        if trial is not None:
            trial.set_user_attr("failed_because", str(err).splitlines()[0][:300])
            if not isinstance(err, DivergedError):  # (refused, not diverged: the same refusal again stops the worker)
                trial.set_user_attr("refused_because", str(err).splitlines()[0][:300])
            trial.set_user_attr("node_hours", (time.perf_counter() - started) / max(1, settings.ranks_per_node) / 3600)
        return None, TrialState.FAIL, False
    if trial is None:
        return None, TrialState.COMPLETE, False
    try:
        return _outcome(result, trial, settings, time.perf_counter() - started, pruning.pruned)
    except finished_trial_error():  # another worker failed it as silent meanwhile: it is retried there
        return None, TrialState.FAIL, False


def _outcome(
    result: Any, trial: Any, settings: StudySettings, seconds: float, pruned: bool
) -> tuple[float | None, Any, bool]:
    """Record what the trial cost; its (value, state, whether this worker must stop)."""
    from optuna.trial import TrialState

    ranks = distributed.detect().world_size
    trial.set_user_attr("seconds", seconds)
    trial.set_user_attr("ranks", ranks)
    trial.set_user_attr("node_hours", seconds * ranks / max(1, settings.ranks_per_node) / 3600)
    trial.set_user_attr("epochs", len(result.history))
    if pruned:
        return None, TrialState.PRUNED, False
    if result.preempted:  # a stop signal (scancel, the time limit): give the trial back and end this worker
        trial.set_user_attr("failed_because", "its worker was stopped by a signal")
        study = trial.study
        study.tell(trial, state=TrialState.FAIL)
        optuna_api.retry(study, trial, settings.max_retry)
        return None, TrialState.FAIL, True
    value = result.final.get(settings.search_space.metric, math.nan)
    if not math.isfinite(value):
        trial.set_user_attr("failed_because", f"the final {settings.search_space.metric} is {value}")
        return None, TrialState.FAIL, False
    return float(value), TrialState.COMPLETE, False
