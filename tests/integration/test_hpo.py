"""Hyperparameter search (dlscale.hpo): the tests that launch ranks, engines or runs beside them (tests/unit/test_hpo.py
has the rest)."""

import contextlib
import os
import signal
from pathlib import Path

import pytest

from dlscale.hpo import create_study, open_study
from tests.unit.test_hpo import _space

optuna = pytest.importorskip("optuna")


def _heartbeats(study_dir, count):
    """(trial number, worker pid) of ``count`` running trials, once their workers have said they run them."""
    from dlscale.hpo.heartbeat import wait_for_running

    return [(number, pid) for number, (_, pid) in sorted(wait_for_running(study_dir, count).items())][:count]


def test_a_killed_worker_is_retried_a_killed_study_resumes_and_the_best_reruns_the_same(in_tmp):
    from dlscale.hpo.local_search import rerun_best, run_search, start_workers, wait_for_workers
    from dlscale.hpo.results import trial_rows

    TrialState = optuna.trial.TrialState
    run_search("study", _space(), trials=4, workers=0, grace_s=6.0, heartbeat_s=0.3, pruner="none")
    workers = start_workers("study", 2)
    [(killed, pid)] = _heartbeats("study", 1)
    os.kill(pid, signal.SIGKILL)  # mid-trial: its trial stays RUNNING, and silent
    statuses = sorted(wait_for_workers(workers, timeout=300))
    assert statuses == [-signal.SIGKILL, 0]
    study, _ = open_study("study")
    dead = study.trials[killed]
    assert dead.state == TrialState.FAIL and "no heartbeat" in dead.user_attrs["failed_because"]
    [retry] = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 4
    kept = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}

    # every worker killed mid-study: started again, the study carries on from where it stood
    run_search("study", trials=6, workers=0)
    workers = start_workers("study", 2)
    for _, pid in _heartbeats("study", 2):
        os.kill(pid, signal.SIGKILL)
    wait_for_workers(workers, timeout=60)
    run_search("study", workers=1)
    study, _ = open_study("study")
    complete = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}
    assert len(complete) == 6 and all(complete[n] == v for n, v in kept.items())  # nothing lost, nothing redone
    assert sum(t.state == TrialState.FAIL for t in study.trials) == 3  # the three killed trials, each retried
    rows = trial_rows("study")
    assert all(Path(r["run_dir"], "summary.json").is_file() for r in rows if r["state"] == "complete")
    stored, again = rerun_best("study")
    assert again == stored  # CPU runs are deterministic: the best trial's R² is its settings', not luck's


def test_a_worker_of_two_ranks_trains_each_trial_data_parallel(in_tmp):
    """Under torchrun (or srun with DLSCALE_TRIAL_RANKS=all) rank 0 asks and both ranks train the trial, with the
    worker's own key=value overrides."""
    import subprocess
    import sys

    from dlscale.distributed import free_port

    create_study(_space(), "study", trials=1, pruner="none", ranks_per_node=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DLSCALE_LAUNCHER", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            "-m",
            "dlscale",
            "hpo",
            "worker",
            "--dir",
            "study",
            "epochs=1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [trial] = open_study("study")[0].trials
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.user_attrs["ranks"] == 2
    summary = (Path("study") / trial.user_attrs["run_dir"] / "summary.json").read_text()
    assert '"world_size": 2' in summary
    assert trial.user_attrs["epochs"] == 1  # the worker's own overrides (as launch.sh passes device=cuda) apply
    assert trial.user_attrs["node_hours"] == pytest.approx(trial.user_attrs["seconds"] / 3600)  # 2 ranks of 2 a node


def _children(process, count: int, timeout: float = 60.0) -> list:
    """The first ``count`` child processes of ``process`` (a psutil.Process), once it has started them."""
    import time

    deadline = time.monotonic() + timeout
    while len(children := process.children()) < count:
        assert time.monotonic() < deadline, f"{process.pid} started fewer than {count} processes in {timeout:.0f} s"
        time.sleep(0.02)
    return children[:count]


def test_a_stopped_search_stops_its_workers_and_says_so_in_one_line(in_tmp):
    """SIGTERM to `dlscale hpo start` used to end it at once, silently, while its two workers ran every trial to the
    end. Stopped, it sends them SIGTERM (a trial mid-way checkpoints and goes back to the study, as on a scancel),
    waits a bounded time, kills what is left, and says so."""
    import subprocess
    import sys

    import psutil

    create_study(_space(), "study", trials=40, pruner="none")
    search = subprocess.Popen(
        [sys.executable, "-m", "dlscale", "hpo", "start", "--dir", "study"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    workers = []
    try:
        workers = _children(psutil.Process(search.pid), 2)
        search.send_signal(signal.SIGTERM)
        out, err = search.communicate(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=10)
    finally:
        for process in [*workers, *psutil.Process().children(recursive=True)]:  # (what the code before the fix left)
            with contextlib.suppress(psutil.Error):
                process.kill()
        search.kill()
    assert alive == [], "a stopped search left its workers running"
    assert search.returncode == 128 + signal.SIGTERM and out == ""
    assert err.count("\n") == 1 and err.startswith("dlscale: search stopped by SIGTERM: its 2 workers were stopped")
