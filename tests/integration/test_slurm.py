"""The submit scripts in slurm/: on a real one-node Slurm cluster that the tests start, and rendered per site.

The cluster needs Debian's slurmctld, slurmd, slurm-client and munge (``make slurm-packages``;
``.ci/run`` installs them). Without them these tests skip, which fails CI.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dlscale.config import load_config
from dlscale.errors import DlscaleError
from dlscale.jobs.local_slurm import LocalSlurm, missing_programs, multi_node_unavailable
from dlscale.metrics.tracking import read_rows

from ..conftest import ROOT, run_cli

SCRIPTS = sorted(
    [
        *ROOT.glob("slurm/*.sh"),
        *ROOT.glob("slurm/*/*.sbatch"),
        ROOT / "slurm/summit/train.lsf",
        *ROOT.glob("slurm/sites/*.env"),
        *ROOT.glob("recipes/*.sbatch"),
        *ROOT.glob("recipes/jobs/*"),
        *ROOT.glob("scripts/*.sh"),
    ]
)
TRAIN = ["tiny", "norm=group", "progress=false", "plot=false"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if missing_programs():
        pytest.skip(f"Slurm is not installed here ({', '.join(missing_programs())}): sudo make slurm-packages")
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield slurm
    slurm.stop()
    assert all(process.poll() is not None for process in slurm.processes) or not slurm.processes


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two slurmds, each in its own UTS and mount namespace (hostnames node1 and node2)."""
    if missing_programs():
        pytest.skip(f"Slurm is not installed here ({', '.join(missing_programs())}): sudo make slurm-packages")
    if multi_node_unavailable():
        pytest.skip(multi_node_unavailable())
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm2"), nodes=2).start()
    yield slurm
    slurm.stop()


def test_a_cluster_in_temporary_folders_of_its_own_removes_them_when_it_stops():
    """A lesson's LocalSlurm() left a dlscale-slurm-* folder in the system's temporary folder at every run."""
    if missing_programs():
        pytest.skip(f"Slurm is not installed here ({', '.join(missing_programs())}): sudo make slurm-packages")
    cluster = LocalSlurm().start()
    folders = [cluster.root, cluster.sockets]
    assert all(folder.is_dir() for folder in folders)
    cluster.stop()
    assert not any(folder.exists() for folder in folders)


def _env(cluster):
    from dlscale.jobs.queue import job_environ

    return cluster.environ(job_environ(ROOT))


def _sbatch(cluster, cwd, script, *args, wait=True, flags=()):
    """``sbatch --parsable``; with ``wait``, return once the job has ended, with returncode 0 only if it COMPLETED.

    The wait polls every half second: ``sbatch --wait`` backs off to a poll every 10 s, seconds lost per job.
    """
    command = ["sbatch", "--parsable", f"--chdir={cwd}", *flags, str(ROOT / "slurm" / script), *args]
    done = subprocess.run(command, env=_env(cluster), capture_output=True, text=True, timeout=600)
    if wait and done.returncode == 0:
        _wait_for_job(cluster, done)
    return done


def _wait_for_job(cluster, done):
    """Wait for the job ``done`` (sbatch's CompletedProcess) submitted; a job that failed sets its returncode."""
    from dlscale.jobs.slurm_jobs import JobFailedError, wait_for_jobs

    try:
        wait_for_jobs([done.stdout.strip()], _env(cluster), timeout=600, poll=0.5)
    except JobFailedError as err:
        done.returncode, done.stderr = 1, str(err)


def _job_state(cluster, job):
    from dlscale.jobs.slurm_jobs import job_info

    fields = job_info(job, _env(cluster))
    return fields.get("JobState"), int(fields.get("Restarts") or 0)


def _wait_for_rows(metrics, count, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline and len(read_rows(metrics)) < count:
        time.sleep(0.2)


def _preempt_and_finish(cluster, tmp_path, settings, flags=()):
    """Submit, send SIGUSR1 to the batch shell after 25 steps (what Slurm sends before the time limit,
    --signal=B:USR1@60; the ranks get no signal, as in a podman-hpc --mpi container), and wait until the job has
    checkpointed, been requeued by launch.sh, and finished; returns the job id."""
    submitted = _sbatch(cluster, tmp_path, "local/train.sbatch", *settings, wait=False, flags=flags)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    _wait_for_rows(tmp_path / "runs/preempted/metrics.csv", 25)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=_env(cluster), check=True)
    assert _wait_for_state(cluster, job, "PENDING") == 1  # requeued by launch.sh after the checkpoint
    # Slurm holds a requeued job back for 2 minutes (BeginTime); the administrator of this test cluster shortens
    # that to the next second (not 0: within the second the first run ended, slurmd still refuses its revoked
    # credential; PENDING shows once it has ended on every node, COMPLETING before)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+1"], env=_env(cluster), check=True)
    assert _wait_for_state(cluster, job, "COMPLETED") == 1
    return job


def _wait_for_state(cluster, job, state, timeout=300):
    """Poll every quarter second (a ``scontrol show job``, milliseconds): a job is seen in ``state`` at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        current, restarts = _job_state(cluster, job)
        if current == state:
            return restarts
        time.sleep(0.25)
    raise AssertionError(f"job {job} still {current} after {timeout} s")


def test_a_two_task_training_job_runs_through_srun_and_only_rank0_writes(cluster, tmp_path):
    done = _sbatch(cluster, tmp_path, "local/train.sbatch", *TRAIN, "max_steps=30")
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    output = (tmp_path / f"slurm-dlscale-train-{job}.out").read_text()
    assert "rank 0/2 (local 0/2) via slurm, gloo" in output  # SLURM_* variables, not torchrun's
    assert output.count("run tiny finished") == 1
    run = tmp_path / f"runs/dlscale-train-{job}"
    assert [row["step"] for row in read_rows(run / "metrics.csv")] == list(range(1, 31))  # each step once
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["applied"]["launcher"] == "slurm"


def test_the_recipe_job_runs_the_ddp_stage_under_srun_on_two_ranks(cluster, tmp_path):
    """recipes/09_job.sbatch: srun's variables make the plain-PyTorch recipe two ranks of one job."""
    bin_dir = os.path.dirname(sys.executable)
    command = [
        "sbatch",
        "--parsable",
        f"--chdir={tmp_path}",
        "--ntasks=2",
        "--cpus-per-task=1",
        str(ROOT / "recipes/09_job.sbatch"),
        "--epochs",
        "1",
        "--workers",
        "0",
        "--precision",
        "fp32",
        "--no-compile",
    ]
    env = cluster.environ({**os.environ, "RECIPES": str(ROOT / "recipes"), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    _wait_for_job(cluster, done)
    output = (tmp_path / f"recipe-{done.stdout.strip()}.out").read_text()
    assert done.returncode == 0, output
    assert output.count("epoch 1: training loss") == 1, output  # rank 0 prints, rank 1 does not
    assert (tmp_path / "checkpoint.pt").is_file()


def test_the_plain_optuna_recipe_runs_two_array_workers_to_the_studys_count(cluster, tmp_path):
    """recipes/jobs/12_search.sbatch: two array tasks share one journal and stop once 4 trials have finished."""
    optuna = pytest.importorskip("optuna")
    bin_dir = os.path.dirname(sys.executable)
    command = [
        "sbatch",
        "--parsable",
        f"--chdir={tmp_path}",
        "--array=0-1",
        "--cpus-per-task=1",
        str(ROOT / "recipes/jobs/12_search.sbatch"),
        "--trials",
        "4",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--workers",
        "0",
    ]
    env = cluster.environ({**os.environ, "RECIPES": str(ROOT / "recipes"), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    for task in (0, 1):
        _wait_for_state(cluster, f"{job}_{task}", "COMPLETED")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name="recipe-search", storage=JournalStorage(JournalFileBackend(str(tmp_path / "search.journal")))
    )
    finished = [t for t in study.trials if t.state.is_finished()]
    assert 4 <= len(finished) <= 5  # (a trial the other worker had begun may end after the fourth)
    outputs = [(tmp_path / f"search-{job}_{task}.out").read_text() for task in (0, 1)]
    assert all("trials finished; the best" in text for text in outputs), outputs
    assert len({t.params["lr"] for t in study.trials}) == len(study.trials)  # the workers' seeds differ


# float64, so that the two-node job and one process agree to rounding (as in test_distributed)
FP64 = [*TRAIN, "checkpoint_every=16", "keep_checkpoints=10", "precision=fp64"]


def _final_weights(run_dir):
    import torch

    from dlscale.checkpoint import list_checkpoints

    return torch.load(list_checkpoints(run_dir)[-1], weights_only=True)["model"]


@contextlib.contextmanager
def _meanwhile(argv, cwd, log):
    """Run ``argv`` in the background while the body runs, its output into ``log``; killed if the body ends first
    (a failed assertion), so that nothing outlives the test."""
    with open(log, "w") as out:
        process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_preempted_two_node_job_has_four_ranks_on_two_hosts_and_equals_one_process(two_nodes, tmp_path):
    """Four ranks on two hosts, signalled, checkpointed, requeued and resumed on both nodes, end where one process
    ends: float64, compared to rounding, as in test_distributed (with 4 ranks the order in which DDP sums a gradient
    element can change when a resumed job rebuilds its buckets)."""
    from ..conftest import SAME_STEPS_FP64

    # 12 epochs (384 steps) and the signal after 25 of them: it lands long before the end, however fast the machine
    # (rank 0 looks for the stop file every 5 s: on 2 busy cores it stops near step 130)
    settings = [*FP64, "epochs=12"]
    stage = two_nodes.node_local / "stage"
    # the one process to compare with trains meanwhile, on the machine itself: it needs nothing of the job, and its
    # steps take the cores the job leaves idle (its ranks' start, the requeue, the 5 s hold) instead of coming after
    one = [sys.executable, "-m", "dlscale.train", *settings, "run_dir=runs/one"]
    with _meanwhile(one, tmp_path, tmp_path / "one.log") as alone:
        job = _preempt_and_finish(
            two_nodes,
            tmp_path,
            [*settings, "run_dir=runs/preempted", f"stage_dir={stage}"],
            ("--nodes=2", "--ntasks-per-node=2"),
        )
        assert alone.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()[-3000:]
    output = (tmp_path / f"slurm-dlscale-train-{job}.out").read_text()
    assert output.count("on 2 node(s), 4 task(s), master node1:") == 2  # the first node of the job, by its name
    assert "rank 0/4 (local 0/2) via slurm" in output
    assert "requeueing job" in output and "resuming from ckpt-" in output
    summary = json.loads((tmp_path / "runs/preempted/summary.json").read_text())
    assert summary["world_size"] == 4 and summary["nodes"] == 2
    # each node staged the shards once, into its own node-local folder; the machine's own view stays empty
    shards = len(list((tmp_path / "data").rglob("*.npy")))
    for node in two_nodes.node_names:
        copies = list((two_nodes.node_folder(node) / "stage").iterdir())
        assert len(copies) == 1 and len(list(copies[0].rglob("*.npy"))) == shards, (node, copies)
    assert not list(two_nodes.node_local.iterdir())
    assert summary["applied"]["data_dir"].startswith(str(stage))  # and rank 0 read its node's copy

    resumed, one = read_rows(tmp_path / "runs/preempted/metrics.csv"), read_rows(tmp_path / "runs/one/metrics.csv")
    assert [row["step"] for row in resumed] == [row["step"] for row in one] == list(range(1, 385))  # each step once
    expected, got = _final_weights(tmp_path / "runs/one"), _final_weights(tmp_path / "runs/preempted")
    for key, value in expected.items():
        if value.numel():
            assert float((value - got[key]).abs().max()) < SAME_STEPS_FP64, key


def test_kmeans_across_two_nodes_equals_one_process(two_nodes, tmp_path):
    from sklearn.datasets import make_blobs

    from dlscale.kmeans import KMeans

    x, _ = make_blobs(4000, n_features=3, centers=4, random_state=7)
    np.save(tmp_path / "data.npy", x)
    np.save(tmp_path / "init.npy", x[:4])
    done = _sbatch(
        two_nodes,
        tmp_path,
        "local/kmeans.sbatch",
        "--input",
        "data.npy",
        "--k",
        "4",
        "--init",
        "init.npy",
        "--backend",
        "torch",
        "--device",
        "cpu",
        "--out",
        "km",
        wait=False,
        flags=("--nodes=2", "--ntasks-per-node=1"),
    )
    assert done.returncode == 0, done.stderr
    alone = KMeans(4, init=x[:4], backend="torch", device="cpu").fit(x)  # (while the job runs)
    _wait_for_job(two_nodes, done)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "km/summary.json").read_text())
    assert summary["ranks"] == 2 and summary["launcher"] == "slurm"
    np.testing.assert_allclose(np.load(tmp_path / "km/centers.npy"), alone.cluster_centers_, rtol=1e-9)
    assert summary["inertia"] == pytest.approx(alone.inertia_, rel=1e-9)


#: `dlscale bench allreduce --nproc 2 --max-mib 1` on the 2-vCPU Milan EPYC (gloo over loopback): the rows the plan
#: fits α and β to
RECORDED_ALLREDUCE = [
    {"bytes": size, "ms": ms, "rounds": 20, "world_size": world}
    for world, rows in ((1, ((4096, 0.004), (1048576, 0.05))), (2, ((4096, 0.09), (65536, 0.16), (1048576, 1.1))))
    for size, ms in rows
]


def test_a_breakdown_over_nodes_and_a_plan_from_a_two_node_sweep(two_nodes, tmp_path):
    """dlscale bench breakdown --slurm runs each way as a job of 1 and 2 nodes through the local train.sbatch;
    dlscale plan reads a weak/strong sweep of the same cluster, recommends a run and predicts 4 nodes.

    The two measurements need nothing of one another, so they run at once: the sweep's jobs are queued first and
    Slurm starts the breakdown's beside them wherever a node has a free CPU (its one-task jobs leave one). The plan's
    α and β come from all-reduce rows recorded on this machine (`dlscale bench allreduce --nproc 2` has its own test,
    test_distributed's). (What is asserted are the tables' shapes and sums, which hold whatever else shares the
    cores; the lessons and docs/benchmarks.md measure alone.)"""
    env = _env(two_nodes)
    script = str(ROOT / "slurm/local/train.sbatch")
    # one epoch of a quarter of the tiny set (16, 8 and 16 steps): the plan needs each run's rate and first R²
    small = ["epochs=1", "train_samples=256", "val_samples=64"]
    sweep = subprocess.run(
        ["bash", str(ROOT / "slurm/sweep.sh"), "local", "1 2", "8", *TRAIN, *small],
        cwd=tmp_path,
        env={**env, "DLSCALE_SWEEP_DIR": "runs/sweep"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sweep.returncode == 0, sweep.stderr
    (tmp_path / "ar").mkdir()
    (tmp_path / "ar/allreduce.json").write_text(json.dumps(RECORDED_ALLREDUCE))
    done = run_cli(
        "bench",
        "breakdown",
        *TRAIN,
        "--slurm",
        script,
        "--tasks-per-node",
        "1",
        "--sizes",
        "1,2",
        "--steps",
        "12",
        "--rounds",
        "1",
        "--buckets",
        "",
        "--out",
        "runs/bd",
        cwd=tmp_path,
        env=env,
        timeout=600,  # (its jobs may queue behind the sweep's)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "runs/bd/breakdown.json").read_text())
    one, two = result["rows"]
    assert result["unit"] == "nodes" and (one["nodes"], one["ranks"], two["nodes"], two["ranks"]) == (1, 1, 2, 2)
    assert set(one["ms"]) == {"full", "data in memory"} and "no communication" in two["ms"]
    assert abs(two["io"] + two["communication"] + two["rest"] - two["loss"]) <= result["adds_up_within"]
    assert "| 2 | 2 | 1 |" in done.stdout  # nodes, ranks, threads each

    for job in re.findall(r"job (\d+)", sweep.stdout):
        _wait_for_state(two_nodes, job, "COMPLETED")
    plan = run_cli(
        "plan",
        "runs/sweep",
        "--target-r2",
        "-10",
        "--deadline-hours",
        "1",
        "--allreduce",
        "ar/allreduce.json",
        cwd=tmp_path,
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    saved = json.loads((tmp_path / "runs/sweep/plan.json").read_text())
    runs = {r["run"]: r for r in saved["runs"]}
    assert set(runs) == {"weak-n1", "weak-n2", "strong-n1", "strong-n2"}
    assert (runs["weak-n2"]["nodes"], runs["weak-n2"]["ranks"]) == (2, 4)  # two tasks per node, as the script asks
    assert runs["weak-n2"]["node_hours"] == pytest.approx(2 * runs["weak-n2"]["hours_to_target"])
    assert (
        saved["recommendation"]["run"]
        == min(runs.values(), key=lambda r: (r["node_hours"], r["hours_to_target"]))["run"]
    )
    predicted = saved["prediction"]
    assert (predicted["nodes"], predicted["ranks"], predicted["global_batch_size"]) == (4, 8, 64)
    low, high = predicted["range_hours"]
    assert low <= predicted["hours_to_target"] <= high
    assert "**Next size up, predicted:** 4 nodes" in plan.stdout
    assert (tmp_path / "runs/sweep/plan.png").stat().st_size > 10_000


def test_a_study_runs_as_a_job_array_over_two_nodes_and_survives_a_killed_task(two_nodes, tmp_path):
    """slurm/local/hpo.sbatch: two array tasks, one per node, work on one study; one is killed mid-trial (as a
    node failure would), and the other fails its silent trial, retries it and finishes the study."""
    optuna = pytest.importorskip("optuna")
    small = ["epochs=2", "train_samples=256", "val_samples=128", "shard_size=128", "norm=group"]
    created = run_cli(
        "hpo",
        "start",
        "tiny",
        *small,
        "--dir",
        "study",
        "--trials",
        "4",
        "--workers",
        "0",
        "--grace-s",
        "6",
        "--pruner",
        "hyperband",
        cwd=tmp_path,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    submitted = _sbatch(
        two_nodes,
        tmp_path,
        "local/hpo.sbatch",
        "--dir",
        "study",
        wait=False,
        flags=("--array=0-1", "--cpus-per-task=2"),
    )  # each node has 2 CPUs: one task on each
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    from dlscale.hpo.heartbeat import running_trials

    beats, deadline = {}, time.time() + 180
    while len({host for host, _ in beats.values()}) < 2 and time.time() < deadline:
        beats = running_trials(tmp_path / "study")
        time.sleep(0.05)
    assert {host for host, _ in beats.values()} == {"node1", "node2"}, beats
    killed = max(n for n, (host, _) in beats.items() if host == "node2")
    subprocess.run(["scancel", "--signal=KILL", f"{job}_1"], env=_env(two_nodes), check=True)
    _wait_for_state(two_nodes, f"{job}_0", "COMPLETED")
    from dlscale.hpo import open_study

    study, _ = open_study(tmp_path / "study")
    states = {t.number: t.state for t in study.trials}
    done = [n for n, s in states.items() if s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(done) == 4
    hosts = {t.user_attrs["host"] for t in study.trials}
    assert hosts == {"node1", "node2"}
    assert states[killed] == optuna.trial.TrialState.FAIL
    assert "no heartbeat" in study.trials[killed].user_attrs["failed_because"]
    [retry] = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert retry.user_attrs["host"] == "node1" and retry.params == study.trials[killed].params


def test_a_dead_node_ends_the_job_with_clear_messages_and_an_intact_checkpoint(tmp_path):
    import torch

    from dlscale.checkpoint import list_checkpoints

    if missing_programs() or multi_node_unavailable():
        pytest.skip(multi_node_unavailable() or "Slurm is not installed here: sudo make slurm-packages")
    cluster = LocalSlurm(tmp_path / "slurm", nodes=2)  # its own: this test kills a node
    # how long the controller waits before it declares the silent node2 DOWN; each ping of the dead node takes
    # MessageTimeout to fail, and it takes two (with Slurm's 10 s, node2 was DOWN 25 s after its death, now 7 s).
    # A live slurmd answers in milliseconds, even on busy cores.
    cluster.slurmd_timeout, cluster.message_timeout = 4, 4
    with cluster:
        run = tmp_path / "runs/dead"  # a path no other test's processes name (pgrep below)
        settings = [*TRAIN, "epochs=50", "dist_timeout_s=30", "checkpoint_every=10", f"run_dir={run}"]
        submitted = _sbatch(
            cluster, tmp_path, "local/train.sbatch", *settings, wait=False, flags=("--nodes=2", "--ntasks-per-node=2")
        )
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()
        _wait_for_rows(run / "metrics.csv", 20)
        assert cluster.kill_node("node2") >= 3  # its slurmd, its step daemon and its two ranks
        killed = time.time()
        while _job_state(cluster, job)[0] == "RUNNING" and time.time() - killed < 240:
            time.sleep(0.25)
        # the ranks on node1 stop at once; Slurm ends the job when node2 misses its SlurmdTimeout (4 s here)
        assert time.time() - killed < 30 + cluster.slurmd_timeout + 60
        # srun names the dead node as it ends, which may be after the job has left RUNNING (a busy machine read the
        # file first): the batch step's output is read once that line is there, or 30 s later
        out, written = tmp_path / f"slurm-dlscale-train-{job}.out", time.time()
        while "Node failure on node2" not in out.read_text() and time.time() - written < 30:
            time.sleep(0.25)
        output = out.read_text()
        assert output.count("Another rank probably died or was killed; resume with resume=true") == 2
        assert "Node failure on node2" in output and "Traceback" not in output

        def ranks_left():  # the ranks themselves (the batch step's bash and srun take a moment to be reaped)
            listing = subprocess.run(["pgrep", "-af", f"run_dir={run}"], capture_output=True, text=True).stdout
            return [line for line in listing.splitlines() if "-m dlscale.train" in line and " srun " not in line]

        assert ranks_left() == []
        last = torch.load(list_checkpoints(run)[-1], weights_only=True)
        assert last["position"]["step"] >= 10 and last["model"]  # a whole checkpoint, loadable


def test_a_rank_that_dies_ends_the_job_step_at_once(cluster, tmp_path):
    """With srun --kill-on-bad-exit=0 the other rank waited for the dead one until dist_timeout_s (NCCL's watchdog,
    or forever), burning the allocation; now srun ends the step as soon as a rank exits with an error."""
    from dlscale.training.preemption import STOPPED_MARKER

    assert f"$run_dir/{STOPPED_MARKER}" in (ROOT / "slurm/launch.sh").read_text()  # the marker a stop leaves
    wrapper = tmp_path / "python-rank1-dies"  # rank 1 fails before it joins; rank 0 waits for it in the rendezvous
    wrapper.write_text(
        f'#!/bin/sh\n[ "$SLURM_PROCID" = 1 ] && {{ echo "rank 1: exiting with 3"; exit 3; }}\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    settings = tmp_path / "mine.env"
    settings.write_text(f"DLSCALE_PYTHON={wrapper}\n")
    started = time.time()
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--chdir={tmp_path}",
            str(ROOT / "slurm/local/train.sbatch"),
            *TRAIN,
            "dist_timeout_s=300",
            "run_dir=runs/dies",
        ],
        env={**_env(cluster), "DLSCALE_SITE_ENV": str(settings)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    _wait_for_job(cluster, done)
    assert done.returncode == 1 and time.time() - started < 120  # not the 300 s of dist_timeout_s
    output = (tmp_path / f"slurm-dlscale-train-{done.stdout.strip()}.out").read_text()
    assert "rank 1: exiting with 3" in output and "requeueing" not in output
    assert not (tmp_path / "runs/dies" / STOPPED_MARKER).exists()


def test_each_task_of_a_job_gets_the_cpus_per_task_it_asked_for(cluster, tmp_path, monkeypatch):
    """launch.sh's probe job prints what each task was given; the cluster binds tasks (task/affinity). Submitted by
    Queue.probe, as lesson 09 asks (the lesson's own CI run may leave its probe out: this covers it)."""
    from dlscale.jobs.queue import Queue

    monkeypatch.chdir(tmp_path)  # (its output goes to runs/slurm/ of the working folder)
    output = Queue("local", "local", _env(cluster)).probe(tasks=2)  # (fails if the job does)
    tasks = dict(re.findall(r"^task (\d+)/2 on \S+: 1 cpu\(s\) \[(\d+)\].*SRUN_CPUS_PER_TASK=1 ", output, re.M))
    assert sorted(tasks) == ["0", "1"], output
    assert len(set(tasks.values())) == 2  # each task on its own core
    assert "OMP_NUM_THREADS=1" in output
    assert len(list((tmp_path / "runs/slurm").glob("probe-*.out"))) == 1  # in the runs' folder, not beside a notebook


def test_waiting_for_jobs_fails_with_the_failed_jobs_own_output(cluster, tmp_path, monkeypatch):
    """What lesson 09's cells do: a job that dies (here: a bad config key) fails the wait, and says why."""
    from dlscale.jobs.slurm_jobs import JobFailedError, submit, wait_for_jobs

    monkeypatch.chdir(tmp_path)  # (submit writes the jobs' output to runs/slurm/ of the working folder)
    env = _env(cluster)
    # one task each (the script's two would add nothing here): the two jobs then share the node and run at once
    options = [f"--chdir={tmp_path}", "--ntasks-per-node=1"]
    good = submit(
        ROOT / "slurm/local/train.sbatch",
        ["tiny", "max_steps=2", "progress=false", "plot=false", f"run_dir={tmp_path}/good"],
        options,
        env,
    )
    bad = submit(ROOT / "slurm/local/train.sbatch", ["tiny", "no_such_key=1"], options, env)
    seen = []
    with pytest.raises(JobFailedError, match=rf"(?s)job {bad} .* ended FAILED.*no_such_key"):
        wait_for_jobs([good, bad], env, timeout=300, watch=seen.append, poll=0.5)
    assert wait_for_jobs([good], env, timeout=60)[good]["JobState"] == "COMPLETED"


def test_report_says_where_it_looked_when_there_are_no_runs(tmp_path):
    done = run_cli("report", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and "no run directories" in done.stderr and "Traceback" not in done.stderr


# -- every script, without a cluster ----------------------------------------------------------------


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (sudo make slurm-packages)")
def test_every_script_is_shellcheck_clean():
    done = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def _headers(script: Path) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script.read_text(), re.M))


def _render(tmp_path, script, *args, env=None, hosts=("nid001000", "nid001001"), job_id="42"):
    """Run a submit script with DLSCALE_DRY_RUN=1 and stand-ins for scontrol and module.

    Returns (completed process, the srun line, the environment lines launch.sh printed, the module calls).
    """
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (tmp_path / "hosts.txt").write_text("\n".join(hosts) + "\n")
    (fake / "scontrol").write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts.txt'}\n")
    (fake / "module").write_text('#!/bin/sh\necho "module $*" >> "$FAKE_LOG"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    headers = _headers(ROOT / "slurm" / script)
    nodes = len(hosts)
    tasks = int(headers.get("ntasks-per-node", 1))
    environ = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "DLSCALE_DRY_RUN": "1",
        "DLSCALE_ROOT": str(ROOT),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "t",
        "SLURM_JOB_NODELIST": "nid[001000-001001]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks),
        "SLURM_CPUS_PER_TASK": headers["cpus-per-task"],
        **(env or {}),
    }
    for name in ("MASTER_PORT", "MASTER_ADDR", "SRUN_CPUS_PER_TASK"):
        environ.pop(name, None) if name not in (env or {}) else None
    done = subprocess.run(
        ["bash", str(ROOT / "slurm" / script), *args], cwd=tmp_path, env=environ, capture_output=True, text=True
    )
    lines = done.stdout.strip().splitlines()
    settings = dict(line[5:].split("=", 1) for line in lines if line.startswith("env: "))
    calls = (tmp_path / "calls.log").read_text() if (tmp_path / "calls.log").exists() else ""
    command = shlex.join(shlex.split(lines[-1])) if lines else ""  # printf %q's escapes undone
    return done, command, settings, calls


def test_a_dry_run_outside_an_allocation_renders_the_job_from_its_own_headers(tmp_path):
    """The README's DLSCALE_DRY_RUN on a laptop: no SLURM_* variables, no module, no scontrol, another folder."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DLSCALE_DRY_RUN": "1", "DLSCALE_DRY_RUN_NODES": "2"}
    done = subprocess.run(
        ["bash", str(ROOT / "slurm/perlmutter/train.sbatch"), "gpu", "epochs=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    command = shlex.join(shlex.split(done.stdout.strip().splitlines()[-1]))
    assert command.startswith("srun --kill-on-bad-exit=1 --cpus-per-task=32 ")  # the script's own -c 32
    assert "-m dlscale.train gpu epochs=1 device=cuda run_dir=runs/dlscale-train-0 resume=true" in command
    assert "2 node(s), 8 task(s), master dry-run-node1:10000" in done.stdout
    assert "env: NCCL_NET=AWS Libfabric" in done.stdout  # two nodes: the network plugin is required
    assert "dry run, not run here: module load pytorch" in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.parametrize("site, gpus_per_node", [("perlmutter", 4), ("frontier", 8), ("local", 0)])
def test_each_site_renders_one_task_per_gpu_and_a_world_the_config_splits_over(site, gpus_per_node, tmp_path):
    script = ROOT / f"slurm/{site}/train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    headers = _headers(script)
    tasks = int(headers["ntasks-per-node"])
    assert int(headers.get("gpus-per-node", 0)) == gpus_per_node
    if gpus_per_node:
        assert tasks == gpus_per_node  # one rank per GPU
    (tmp_path / "node-local").mkdir()
    done, command, settings, calls = _render(
        tmp_path, f"{site}/train.sbatch", "gpu", "epochs=1", env={"TMPDIR": str(tmp_path / "node-local")}
    )
    assert done.returncode == 0, done.stderr
    assert "master nid001000:10042" in done.stdout  # the first node; a port from the job id
    assert command.startswith("srun --kill-on-bad-exit=1") and "-m dlscale.train gpu epochs=1" in command
    assert "run_dir=runs/t-42 resume=true" in command
    # srun (Slurm >= 22.05) does not inherit the allocation's CPUs per task: the line and the environment say it
    assert f"--cpus-per-task={headers['cpus-per-task']}" in command.split(" -m ")[0]
    assert settings["SRUN_CPUS_PER_TASK"] == headers["cpus-per-task"]
    # GPU sites ask for the GPU outright (a CPU-only torch stops at once) and, on 2 nodes, for the network plugin
    assert ("device=cuda" in command) == bool(gpus_per_node)
    # (the plugin's name as each site documents it: NERSC's "AWS Libfabric", OLCF's "OFI")
    assert settings.get("NCCL_NET") == {"perlmutter": "AWS Libfabric", "frontier": "OFI"}.get(site)
    if site == "frontier":
        assert "--gpu-bind=closest" in command
        assert headers["network"] == "disable_rdzv_get"  # OLCF's PyTorch guide, with the RCCL network plugin
        # ROCm first, then the plugin built against it (else RCCL talks TCP between nodes)
        assert calls.index("module load rocm") < calls.index("module load rccl-net-plugin")
        assert settings["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
        assert settings["MIOPEN_CUSTOM_CACHE_DIR"] == settings["MIOPEN_USER_DB_PATH"]
        assert settings["MIOPEN_USER_DB_PATH"].startswith(str(tmp_path / "node-local"))  # $TMPDIR: node-local
        assert Path(settings["MIOPEN_USER_DB_PATH"]).is_dir()  # MIOpen does not create it
        # on every node, not the batch node alone (a dry run says so instead)
        # (-n: one task per node, not SLURM_NTASKS's count)
        mkdir = f"srun -n 2 --ntasks-per-node=1 mkdir -p {settings['MIOPEN_USER_DB_PATH']}"
        assert f"not run here: {mkdir}" in done.stderr
    if site == "perlmutter":
        assert "module load pytorch" in calls
        # HPE's settings for NCCL over Slingshot
        assert settings["NCCL_CROSS_NIC"] == "1" and settings["FI_CXI_DEFAULT_CQ_SIZE"] == "131072"
        # each rank picks its GPU from this order; CUDA_VISIBLE_DEVICES is Slurm's to set per task
        assert settings["DLSCALE_GPU_ORDER"] == "3,2,1,0" and "CUDA_VISIBLE_DEVICES" not in settings
    world = len(("nid001000", "nid001001")) * tasks
    load_config("gpu").per_rank_batch(world)  # the gpu config's global batch splits evenly over the world
    assert "#SBATCH --signal=B:USR1@" in script.read_text() and "#SBATCH --requeue" in script.read_text()


@pytest.mark.parametrize("width", ["1", "all"])
def test_perlmutter_search_workers_take_one_gpu_each_or_the_whole_node(width, tmp_path):
    """hpo.sbatch: four workers per node, each seeing only its GPU and training alone, the GPU on its cores' NUMA
    node (--gpus-per-task=1 gave the first cores GPU 0, across the chip); or with DLSCALE_TRIAL_RANKS=all one
    worker whose four ranks train each trial together."""
    done, command, settings, _ = _render(
        tmp_path, "perlmutter/hpo.sbatch", "--dir", "hpo", hosts=("nid001000",), env={"DLSCALE_TRIAL_RANKS": width}
    )
    assert done.returncode == 0, done.stderr
    assert "-m dlscale hpo worker --dir hpo device=cuda" in command
    assert ("--gpu-bind=map_gpu:3,2,1,0" in command) == (width == "1") and "--gpus-per-task" not in command
    # workers of their own are not killed with one that fails; the ranks of one trial are
    assert command.startswith(f"srun --kill-on-bad-exit={0 if width == '1' else 1} ")
    assert "--cpu-bind=cores" in command  # local task i: the i-th block of 32 cores, beside GPU 3 - i
    assert settings.get("DLSCALE_LAUNCHER") == ("single" if width == "1" else None)


@pytest.mark.parametrize("mode", ["module", "conda", "container", "shifter"])
def test_a_search_worker_is_one_trial_per_gpu_in_every_software_mode(mode, tmp_path):
    """In container mode podman-hpc forwarded no DLSCALE_LAUNCHER: each task took itself for one of four ranks."""
    env = {"DLSCALE_ENV": mode, "DLSCALE_IMAGE": "registry/dlscale:1", "BASH_FUNC_conda%%": "() { :; }"}
    done, command, settings, _ = _render(
        tmp_path, "perlmutter/hpo.sbatch", "--dir", "hpo", hosts=("nid001000",), env=env
    )
    assert done.returncode == 0, done.stderr
    assert settings["DLSCALE_LAUNCHER"] == "single"  # in the environment srun starts the tasks with
    if mode == "container":  # and through the container's wall
        assert "-e DLSCALE_LAUNCHER" in command.split(" python ")[0]


def test_one_node_needs_no_network_plugin_and_conda_mode_loads_it(tmp_path):
    done, _, settings, calls = _render(tmp_path, "perlmutter/train.sbatch", "gpu", hosts=("nid001000",))
    assert done.returncode == 0, done.stderr
    assert "NCCL_NET" not in settings  # NVLink inside a node needs no plugin: no failure for lack of one
    (tmp_path / "conda").mkdir()
    done, _, settings, calls = _render(
        tmp_path / "conda",
        "perlmutter/train.sbatch",
        "gpu",
        env={"DLSCALE_ENV": "conda", "BASH_FUNC_conda%%": "() { :; }"},
    )
    assert done.returncode == 0, done.stderr
    assert "module load nccl" in calls and settings["NCCL_NET"] == "AWS Libfabric"


def test_a_first_run_never_resumes_or_clears_a_folder_another_job_left(tmp_path):
    """A reused job id (lesson 09's two clusters once numbered their jobs alike) must not continue a foreign run."""
    (tmp_path / "runs/t-42/checkpoints").mkdir(parents=True)
    (tmp_path / "runs/t-42/checkpoints/ckpt-00000020.pt").write_bytes(b"another job's")
    done, command, _, _ = _render(tmp_path, "local/train.sbatch", "tiny")
    assert done.returncode == 2 and "already holds checkpoints of another job" in done.stderr
    assert not command.startswith("srun")
    done, command, _, _ = _render(tmp_path, "local/train.sbatch", "tiny", env={"SLURM_RESTART_COUNT": "1"})
    assert done.returncode == 0 and "run_dir=runs/t-42 resume=true" in command  # the job's own requeue resumes


def test_each_local_cluster_numbers_its_jobs_in_a_block_of_its_own(tmp_path):
    from dlscale.jobs.local_slurm import JOB_IDS_PER_CLUSTER, first_job_id

    counter = tmp_path / "clusters"
    firsts = [first_job_id(counter) for _ in range(3)]
    assert firsts == [1, 1 + JOB_IDS_PER_CLUSTER, 1 + 2 * JOB_IDS_PER_CLUSTER]


def test_the_master_is_the_first_of_a_long_node_list_and_each_job_has_its_own_port(tmp_path):
    """`scontrol ... | head -n 1` under pipefail dies of SIGPIPE once the list outgrows the pipe's buffer."""
    hosts = [f"nid{i:06d}" for i in range(50_000)]
    done, _, settings, _ = _render(tmp_path, "local/train.sbatch", "tiny", hosts=hosts, job_id="1234567")
    assert done.returncode == 0, done.stderr[-2000:]
    assert settings["MASTER_ADDR"] == "nid000000"
    (tmp_path / "other").mkdir()
    _, _, other, _ = _render(tmp_path / "other", "local/train.sbatch", "tiny", job_id="1234568")
    ports = {int(settings["MASTER_PORT"]), int(other["MASTER_PORT"])}
    assert len(ports) == 2 and all(10000 <= p < 30000 for p in ports)  # unprivileged, below the ephemeral range


def _site_env(tmp_path, text):
    """A DLSCALE_SITE_ENV file (the user's own settings, read after the site's)."""
    path = tmp_path / "mine.env"
    path.write_text(text)
    return {"DLSCALE_SITE_ENV": str(path)}


def test_the_profile_job_makes_its_report_folder_and_leaves_cupti_to_nsys(tmp_path):
    done, command, settings, _ = _render(
        tmp_path,
        "perlmutter/profile.sbatch",
        "gpu",
        "profile_steps=20,30",
        env=_site_env(tmp_path, f"DLSCALE_PYTHON={sys.executable}\n"),
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs/t-42/nsys").is_dir()  # nsys does not create the folder of its --output
    assert "--output=runs/t-42/nsys/rank_%q{SLURM_PROCID}" in command  # one report per rank
    assert settings["DLSCALE_UNDER_NSYS"] == "1"


@pytest.mark.parametrize("mode", ["module", "container", "shifter"])
def test_the_profile_jobs_nsys_line_is_built_by_the_python_that_trains(mode, tmp_path):
    """The nsys line was built on the batch node with the host's Python and named it: a path the container has
    not. Each task's own Python now builds it (inside the container too); the batch shell runs none."""
    done, command, _, _ = _render(
        tmp_path,
        "perlmutter/profile.sbatch",
        "gpu",
        "profile_steps=20,30",
        env={
            "DLSCALE_ENV": mode,
            "DLSCALE_IMAGE": "registry/dlscale:1",
            **_site_env(tmp_path, "DLSCALE_PYTHON=python\n"),
        },
    )
    assert done.returncode == 0, done.stderr
    words = shlex.split(command)
    start = words.index("dlscale.profiling.profile_job") - 2
    assert words[start : start + 6] == [
        "python",
        "-m",
        "dlscale.profiling.profile_job",
        "--output=runs/t-42/nsys/rank_%q{SLURM_PROCID}",
        "gpu",
        "profile_steps=20,30",
    ]
    assert sys.executable not in command
    if mode != "module":  # the job's Python is the one inside the image
        assert any("registry/dlscale:1" in word for word in words[:start])


def test_the_profile_job_becomes_nsys_around_its_own_python(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nsys").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "nsys").chmod(0o755)
    job = [
        sys.executable,
        "-m",
        "dlscale.profiling.profile_job",
        "--output=out/rank_%q{SLURM_PROCID}",
        "gpu",
        "profile_steps=20,30",
        "cuda_graphs=true",
    ]
    # with the stand-in nsys on the task's PATH, and without nsys (one line saying what to load): both at once, each
    # process spends its seconds importing torch
    paths = (f"{fake}:{os.environ['PATH']}", str(Path(sys.executable).parent))
    started = [
        subprocess.Popen(
            job, env={**os.environ, "PATH": path}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for path in paths
    ]
    (out, err), (_, missing) = (process.communicate(timeout=120) for process in started)
    assert started[0].returncode == 0, err
    argv = out.splitlines()
    assert argv[0] == "profile" and "--capture-range=cudaProfilerApi" in argv and "--cuda-graph-trace=node" in argv
    assert argv[-6:] == [sys.executable, "-m", "dlscale.train", "gpu", "profile_steps=20,30", "cuda_graphs=true"]
    assert (
        started[1].returncode == 1 and missing.strip().count("\n") == 0 and "nsys (Nsight Systems) is not on" in missing
    )


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("container", "podman-hpc run --rm --mpi --gpu --nccl"),  # --mpi: SLURM_* and the host network inside
        ("shifter", "shifter --image=registry/dlscale:1 --module=gpu,nccl-plugin"),
    ],
)
def test_perlmutter_containers_see_their_rank(tmp_path, mode, expected):
    done, command, _, _ = _render(
        tmp_path, "perlmutter/train.sbatch", "gpu", env={"DLSCALE_ENV": mode, "DLSCALE_IMAGE": "registry/dlscale:1"}
    )
    assert done.returncode == 0, done.stderr
    assert expected in command and command.index(expected.split()[0]) < command.index("-m dlscale.train")


@pytest.mark.parametrize(
    "site, variables", [("perlmutter", {"DLSCALE_ENV": "conda"}), ("frontier", {"DLSCALE_CONDA_ENV": "dlscale"})]
)
def test_conda_activation_survives_set_u(tmp_path, site, variables):
    """conda's activate scripts read unset variables; under launch.sh's `set -u` that aborted the job."""
    activate = '() { : "$CONDA_SOME_UNSET_VARIABLE"; echo "conda $*" >> "$FAKE_LOG"; }'
    done, command, _, calls = _render(
        tmp_path, f"{site}/train.sbatch", "gpu", env={**variables, "BASH_FUNC_conda%%": activate}
    )
    assert done.returncode == 0, done.stderr
    assert "conda activate dlscale" in calls and "srun" in command


def test_the_summit_lsf_script_asks_for_one_gpu_per_resource_set():
    text = (ROOT / "slurm/summit/train.lsf").read_text()
    subprocess.run(["bash", "-n", str(ROOT / "slurm/summit/train.lsf")], check=True)
    assert "decommissioned in November 2024" in text
    assert re.search(r"--rs_per_host 6 --tasks_per_rs 1 --gpu_per_rs 1", text)


def test_the_site_scripts_pass_fsdp_and_tensor_parallel_through_unchanged(tmp_path):
    """TP inside a Perlmutter node (4 GPUs), FSDP across nodes: only the overrides change, not the script."""
    overrides = ("vit", "data_parallel=fsdp", "tensor_parallel=4")
    done, command, _, _ = _render(tmp_path, "perlmutter/train.sbatch", *overrides)
    assert done.returncode == 0, done.stderr
    assert "-m dlscale.train vit data_parallel=fsdp tensor_parallel=4" in command
    cfg = load_config("vit", list(overrides[1:]))
    tasks_per_node = int(_headers(ROOT / "slurm/perlmutter/train.sbatch")["ntasks-per-node"])
    assert tasks_per_node % cfg.tensor_parallel == 0  # a tensor-parallel group never spans two nodes


def test_at_a_site_the_lesson_submits_to_its_queue_with_the_instructors_account(tmp_path):
    from dlscale.jobs.queue import open_queue

    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not installed here (make slurm-packages)")
    settings = tmp_path / "workshop.env"
    settings.write_text("# the instructor's allocation\nSBATCH_ACCOUNT=ntrain1\nSBATCH_RESERVATION=dl_day1\n")
    at_nersc = {"PATH": os.environ["PATH"], "NERSC_HOST": "perlmutter", "DLSCALE_WORKSHOP_ENV": str(settings)}
    queue = open_queue(ROOT, at_nersc)
    assert (queue.kind, queue.site, queue.cluster) == ("site", "perlmutter", None)  # no private cluster started
    assert queue.script(ROOT) == ROOT / "slurm/perlmutter/train.sbatch" and queue.script(ROOT).is_file()
    assert queue.env["SBATCH_ACCOUNT"] == "ntrain1" and queue.env["SBATCH_RESERVATION"] == "dl_day1"
    assert "ntrain1" in queue.describe() and queue.wrap_options == ["--constraint=gpu"]
    named = open_queue(ROOT, {"PATH": os.environ["PATH"], "DLSCALE_SITE": "frontier"})
    assert (named.kind, named.site) == ("site", "frontier")
    # on a workstation: the local cluster's scripts (not started here); a bad settings line names the file
    assert open_queue(ROOT, {"PATH": os.environ["PATH"]}, start_local=False).site == "local"
    settings.write_text("ACCOUNT=ntrain1\n")
    with pytest.raises(DlscaleError, match=r"workshop.env, line 1: expected one of SBATCH_ACCOUNT"):
        open_queue(ROOT, at_nersc)
