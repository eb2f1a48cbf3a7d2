"""Dead workers' trials: a heartbeat file per running trial, and the rule that fails and retries a silent one.

Optuna keeps heartbeats only in its database storage; the journal file, the default here,
has none. So each worker touches ``heartbeats/<trial number>`` in the study folder every
``heartbeat_s`` while its trial runs (from a thread: a long epoch does not silence it), and
before asking for a new trial every worker looks for RUNNING trials whose file is older
than ``grace_s``. The first worker to see one marks it FAIL (storage updates are atomic, so
only one of them succeeds) and hands it to Optuna's retry callback (:mod:`~dlscale.hpo.optuna_api`), which
queues the same parameters as a new trial. The failed trial's folder stays as it was.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from dlscale.hpo import optuna_api
from dlscale.hpo.study import finished_trial_error

HEARTBEAT_DIR = "heartbeats"


class Heartbeat:
    """Context manager: while active, a thread touches the trial's heartbeat file every ``interval_s``."""

    def __init__(self, study_dir: str | Path, trial_number: int, interval_s: float) -> None:
        self.path = Path(study_dir) / HEARTBEAT_DIR / str(trial_number)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_number}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.path.touch()

    def __enter__(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"{socket.gethostname()} {os.getpid()}\n")  # which worker runs it
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)


def last_beat(study_dir: str | Path, trial: Any) -> float:
    """When the trial last said it was alive: its heartbeat file's time, else when it started."""
    try:
        return (Path(study_dir) / HEARTBEAT_DIR / str(trial.number)).stat().st_mtime
    except FileNotFoundError:
        return trial.datetime_start.timestamp() if trial.datetime_start else time.time()


def stale_trials(study: Any, study_dir: str | Path, grace_s: float, now: float | None = None) -> list[Any]:
    """RUNNING trials silent for more than ``grace_s`` seconds: their worker died."""
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [t for t in running if now - last_beat(study_dir, t) > grace_s]


def fail_stale_trials(study: Any, study_dir: str | Path, grace_s: float, max_retry: int) -> list[int]:
    """Fail each stale trial and queue its retry (once, whoever sees it first); returns the failed numbers."""
    failed = []
    for trial in stale_trials(study, study_dir, grace_s):
        try:  # (the reason first: a finished trial takes no more attributes)
            optuna_api.record(study, trial, "failed_because", f"no heartbeat for {grace_s:g} s: its worker died")
            claimed = optuna_api.claim_failed(study, trial)
        except finished_trial_error():
            continue  # another worker failed it first, or its own worker finished it just now
        if not claimed:
            continue
        optuna_api.retry(study, trial, max_retry)
        (Path(study_dir) / HEARTBEAT_DIR / str(trial.number)).unlink(missing_ok=True)
        failed.append(trial.number)
    return failed


def running_trials(study_dir: str | Path) -> dict[int, tuple[str, int]]:
    """The trials running now and who runs them: {trial number: (host, worker pid)}."""
    running = {}
    for path in (Path(study_dir) / HEARTBEAT_DIR).glob("*"):
        try:
            fields = path.read_text().split()
        except FileNotFoundError:  # it just ended
            continue
        if len(fields) == 2 and path.name.isdigit():
            running[int(path.name)] = (fields[0], int(fields[1]))
    return running


def wait_for_running(study_dir: str | Path, count: int = 1, timeout: float = 180.0) -> dict[int, tuple[str, int]]:
    """:func:`running_trials` once at least ``count`` trials run (to stop a worker mid-trial, as a lesson does)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        running = running_trials(study_dir)
        if len(running) >= count:
            return running
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {count} trials of {study_dir} were running after {timeout:.0f} s")
