"""Starting a study's workers on this machine: processes running ``dlscale hpo worker``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from dlscale.errors import DlscaleError
from dlscale.hpo.space import load_space
from dlscale.hpo.study import STUDY_FILE, StudyError, StudySettings, create_study, read_settings
from dlscale.jobs.local_ranks import run_local, start_local

#: The signals that stop a search (``kill``, ``scancel``; Ctrl-C; a closed terminal): its workers are stopped first.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Seconds stopped workers get to checkpoint their trials and end (as Slurm's KillWait), before they are killed.
STOP_GRACE_S = 30.0
#: How often a search looks at its workers and at a stop signal.
POLL_S = 0.2


class SearchStopped(DlscaleError):
    """A search stopped by a signal, after its workers were stopped; the message says how to resume it."""

    def __init__(self, signum: int, study_dir: Path, workers: int, killed: int) -> None:
        self.signum = signum
        late = f"; {killed} did not end within {STOP_GRACE_S:g} s and were killed" if killed else ""
        super().__init__(
            f"search stopped by {signal.Signals(signum).name}: its {workers} workers were stopped and their running "
            f"trials go back to the study{late}; `dlscale hpo start --dir {study_dir}` resumes it"
        )


def start_workers(study_dir: str | Path, n: int, threads: int = 1) -> list[subprocess.Popen]:
    """``n`` worker processes on the study, each with ``threads`` torch threads; their output goes to
    ``logs/`` in the study folder."""
    study_dir = Path(study_dir)
    (study_dir / "logs").mkdir(parents=True, exist_ok=True)
    workers = []
    for index in range(n):
        with open(study_dir / "logs" / f"worker-{os.getpid()}-{index}.log", "ab") as log:  # (the child keeps it open)
            workers.append(
                start_local(
                    [sys.executable, "-m", "dlscale", "hpo", "worker", "--dir", str(study_dir)],
                    log,
                    threads,
                    {"DLSCALE_LAUNCHER": "single"},
                    own_session=True,  # (a Ctrl-C reaches this process, which stops them so that they checkpoint)
                )
            )
    return workers


def wait_for_workers(workers: list[subprocess.Popen], timeout: float | None = None) -> list[int]:
    """The workers' exit statuses once all have ended; interrupted (Ctrl-C, a notebook's interrupt), it stops them
    first (:func:`stop_workers`)."""
    try:
        return [worker.wait(timeout=timeout) for worker in workers]
    except KeyboardInterrupt:
        stop_workers(workers)
        raise


def stop_workers(workers: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> int:
    """Stop the workers as Slurm stops a job: SIGTERM (a worker mid-trial checkpoints it and gives it back to the
    study, as the engine does on a signal; one between trials ends as a killed worker does), then SIGKILL for those
    still running after ``grace_s``. Returns how many had to be killed."""
    running = [worker for worker in workers if worker.poll() is None]
    for worker in running:
        worker.send_signal(signal.SIGTERM)
    deadline, killed = time.monotonic() + grace_s, 0
    for worker in running:
        try:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            killed += 1
    return killed


class _StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` are recorded (``received``) instead of ending this
    process at once, so that the search stops its workers before it ends. Handlers can only be set from the main
    thread; elsewhere the signals act as before."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _run_workers(study_dir: Path, n: int, threads: int) -> list[int]:
    """Start ``n`` workers and return their exit statuses once all have ended; a stop signal to this process stops
    them first and raises :class:`SearchStopped`."""
    with _StopSignals() as stop:
        processes = start_workers(study_dir, n, threads)
        while stop.received is None and any(process.poll() is None for process in processes):
            time.sleep(POLL_S)
        if stop.received is not None:
            raise SearchStopped(stop.received, study_dir, n, stop_workers(processes))
    return [process.returncode for process in processes]


def run_search(
    study_dir: str | Path,
    space: str | Path | None = None,
    trials: int | None = None,
    workers: int = 2,
    extra: list[str] | tuple[str, ...] = (),
    **settings: Any,
) -> StudySettings:
    """Create the study (or resume the one in ``study_dir``), run ``workers`` worker processes until it has
    its trials, and return its settings; ``workers=0`` only creates it (for a Slurm job array).
    ``settings`` are :class:`StudySettings` fields (sampler, pruner, grace_s, threads ...).

    A worker that fails makes this raise with the end of its log. A stop signal (SIGTERM, Ctrl-C) stops the
    workers and raises :class:`SearchStopped`.
    """
    study_dir = Path(study_dir)
    if space is None or (study_dir / STUDY_FILE).is_file():  # resume the study there, its settings as stored
        held = read_settings(study_dir)
        _check_unchanged(held, study_dir, space, list(extra), settings)
        if trials is not None and trials != held.trials:
            print(f"study {held.name!r} in {study_dir}: {trials} trials to finish (it had {held.trials})", flush=True)
        held_settings = {k: v for k, v in asdict(held).items() if k not in ("name", "space", "trials")}
        chosen = create_study(held.search_space, study_dir, trials or held.trials, name=held.name, **held_settings)
    else:
        chosen = create_study(space, study_dir, trials or 12, extra=list(extra), **settings)
    if workers:
        failed = [status for status in _run_workers(study_dir, workers, chosen.threads or 1) if status != 0]
        if failed:
            raise StudyError(
                f"{len(failed)} of {workers} workers failed (exit status {failed[0]}); "
                f"their logs are in {study_dir / 'logs'}"
            )
    return chosen


def _check_unchanged(
    held: StudySettings, study_dir: Path, space: str | Path | None, extra: list[str], settings: dict[str, Any]
) -> None:
    """Refuse, naming them, settings given for an existing study that differ from those it was created with
    (a resumed study keeps its space, sampler, seeds and per-trial overrides: its trials must stay comparable)."""
    asked = {key: value for key, value in settings.items() if value is not None}
    if extra:
        asked["extra"] = extra
    changed = [
        f"{key} {getattr(held, key)!r} -> {value!r}" for key, value in asked.items() if getattr(held, key) != value
    ]
    if space is not None and load_space(space).to_dict() != held.space:
        changed.insert(0, "the search space")
    if changed:
        raise StudyError(
            f"{study_dir} holds study {held.name!r}, created with other settings: {'; '.join(changed)}. "
            f"Resume it without them (`dlscale hpo start --dir {study_dir}`; --trials may change), or "
            f"start the new search in a new folder"
        )


def rerun_best(study_dir: str | Path, out: str | Path | None = None, in_process: bool = False) -> tuple[float, float]:
    """Train the best trial's config again, in a process of its own, into ``out`` (default ``best-rerun/`` in the
    study); returns (the study's value, the re-run's value). ``in_process`` trains it in this process instead
    (where this process ran the search's trials itself, a new process would only add its start).

    The config records the trial's thread count too, so on a CPU the two agree exactly: a trial's result
    is a property of its settings, not of the search.
    """
    from dlscale.hpo.results import best_trial
    from dlscale.metrics.tracking import VAL_FILE, read_rows

    best = best_trial(study_dir)
    metric = read_settings(study_dir).search_space.metric
    out = Path(out or Path(study_dir) / "best-rerun")
    config = Path(best["run_dir"]) / "config.yaml"
    if in_process:
        from dlscale.training.loop import train_quietly

        train_quietly(str(config), run_dir=str(out), resume=False, checkpoint_every=0)
    else:
        run_local(
            [
                sys.executable,
                "-m",
                "dlscale.train",
                str(config),
                f"run_dir={out}",
                "resume=false",
                "checkpoint_every=0",
            ],
            f"re-running trial {best['trial']}",
            env={"DLSCALE_LAUNCHER": "single"},
        )
    return float(best["value"]), float(read_rows(out / VAL_FILE)[-1][metric])
