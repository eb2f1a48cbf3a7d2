"""Data-parallel training: launcher detection, 2 ranks equal 1, a dead rank stops the job, resume."""

import logging
import os
import sys
from pathlib import Path

import pytest
import torch

from dlscale.distributed import DistEnv, DistributedError, detect, detect_launcher, expand_nodelist


def test_slurm_node_lists_expand():
    assert expand_nodelist("nid[001234-001237,001240]") == [
        "nid001234",
        "nid001235",
        "nid001236",
        "nid001237",
        "nid001240",
    ]
    assert expand_nodelist("login01") == ["login01"]
    assert expand_nodelist("gpu[7-8],cpu03") == ["gpu7", "gpu8", "cpu03"]


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, DistEnv()),
        (
            {
                "RANK": "3",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "8",
                "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "nid001",
                "MASTER_PORT": "29600",
                "TORCHELASTIC_RUN_ID": "x",
            },
            DistEnv(3, 1, 8, 4, "torchrun", "nid001", 29600),
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS": "16",
                "SLURM_NTASKS_PER_NODE": "4",
                "SLURM_JOB_NODELIST": "nid[001234-001237]",
                "SLURM_JOB_ID": "42",
            },
            DistEnv(5, 1, 16, 4, "slurm", "nid001234", 29500),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "MASTER_ADDR": "node7",
            },
            DistEnv(1, 1, 2, 2, "mpi", "node7", 29500),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h1"},
            DistEnv(2, 0, 4, 2, "mpi", "h1", 29500),
        ),
        # Polaris's mpiexec (PALS) on 2 nodes of 4 GPUs: 4 ranks per node, not 8 (which no GPU count would fit)
        (
            {
                "PMI_RANK": "5",
                "PMI_SIZE": "8",
                "PMI_LOCAL_RANK": "1",
                "PMI_LOCAL_SIZE": "4",
                "PALS_RANKID": "5",
                "PALS_LOCAL_RANKID": "1",
                "PALS_LOCAL_SIZE": "4",
                "MASTER_ADDR": "x3002",
            },
            DistEnv(5, 1, 8, 4, "mpi", "x3002", 29500),
        ),
    ],
)
def test_detect_reads_each_launchers_variables(environ, expected):
    assert detect(environ) == expected


def test_a_slurm_allocation_alone_is_one_process_and_missing_variables_are_clear():
    assert detect_launcher({"SLURM_JOB_ID": "1", "SLURM_NNODES": "2"}) == "single"
    with pytest.raises(DistributedError, match="SLURM_JOB_NODELIST is not set"):
        detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


def test_the_setup_group_connects_lazily_and_leaves_the_environment_as_it_was(monkeypatch):
    """A full mesh would open a socket to every rank on every rank of a large job; the monitored barrier needs
    rank 0's links only. torch reads TORCH_GLOO_LAZY_INIT when it makes a gloo group."""
    import datetime

    import torch.distributed as dist

    from dlscale.distributed import process_group

    seen = []
    monkeypatch.setattr(dist, "new_group", lambda **kw: seen.append((os.environ.get("TORCH_GLOO_LAZY_INIT"), kw)))
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT", raising=False)
    process_group._lazy_gloo_group(datetime.timedelta(seconds=60))
    assert seen[0][0] == "1" and seen[0][1]["backend"] == "gloo" and "TORCH_GLOO_LAZY_INIT" not in os.environ
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")  # a user's own choice is kept for their groups
    process_group._lazy_gloo_group(datetime.timedelta(seconds=60))
    assert seen[1][0] == "1" and os.environ["TORCH_GLOO_LAZY_INIT"] == "0"


def test_free_ports_lie_outside_the_range_outgoing_connections_take_and_ignore_the_random_seed(tmp_path, monkeypatch):
    """A port from the ephemeral range can become some connection's source port before the master listens on it
    (EADDRINUSE in CI); two processes that seeded ``random`` alike must not try the same ports."""
    import random
    import socket

    from dlscale.distributed import ports

    low, high = ports.ephemeral_range()
    chosen = ports.free_ports(9)
    assert len(set(chosen)) == 9 and all(not low <= port <= high for port in chosen)
    for port in chosen:  # (free now: each binds)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    random.seed(0)
    first = ports.free_ports(3)
    random.seed(0)
    assert ports.free_ports(3) != first

    kernel_range = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", kernel_range)
    kernel_range.write_text("10000\t60999\n")  # nothing below: the ports above it
    assert all(port > 60999 for port in ports.free_ports(4))
    kernel_range.write_text("1024\t65535\n")  # no room outside: the kernel chooses
    assert ports.candidate_ports() == range(0) and len(set(ports.free_ports(4))) == 4


def test_ports_an_engine_holds_are_refused_to_every_other_choice_but_taken_by_the_stores_listener():
    """The engines choose a call's ports up to a minute before its last group listens: another process choosing
    meanwhile must not take them, and torch's store must still listen on them."""
    import datetime
    import socket

    from torch.distributed import TCPStore

    from dlscale.distributed import ports

    held = ports.hold_ports(20)
    try:
        assert not set(held) & set(ports.free_ports(200))
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", held[0]))
        store = TCPStore("127.0.0.1", held[0], 1, True, timeout=datetime.timedelta(seconds=10))
        store.set("key", "up")
        assert store.get("key") == b"up"
        del store
    finally:
        ports.release_ports()
    with socket.socket() as other:  # (let go)
        other.bind(("127.0.0.1", held[1]))


def test_bus_bandwidth_is_the_nccl_tests_formula():
    from dlscale.bench.allreduce import bus_bandwidth

    assert bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1e9)  # 2·(2−1)/2 = 1
    assert bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75e9)  # 2·7/8
    assert bus_bandwidth(1e9, 0.5, 4) == pytest.approx(3e9)


def test_rank_environments_group_engines_by_host():
    from dlscale.jobs.notebook_engines import rank_environments

    one_host = rank_environments(["a", "a"], 4000)
    assert [e["LOCAL_RANK"] for e in one_host] == ["0", "1"] and one_host[0]["MASTER_ADDR"] == "127.0.0.1"
    two_hosts = rank_environments(["n1", "n1", "n2", "n2"], 4000)
    assert [e["LOCAL_RANK"] for e in two_hosts] == ["0", "1", "0", "1"]
    assert {e["MASTER_ADDR"] for e in two_hosts} == {"n1"} and two_hosts[3]["WORLD_SIZE"] == "4"


def test_engine_log_cleanup_race_stays_out_of_the_notebook(caplog):
    """ipyparallel's harmless "Failed to remove" error is dropped; its other errors still show."""
    import ipyparallel as ipp

    from dlscale.jobs.notebook_engines import _NoCleanupRace

    cluster = ipp.Cluster(n=1, log_level=40)
    cluster.log.addFilter(_NoCleanupRace())
    with caplog.at_level(logging.ERROR, logger=cluster.log.name):
        cluster.log.error("Failed to remove /root/.ipython/profile_default/log/ipengine-1.log: [Errno 2] gone")
        cluster.log.error("Engine set failed to start")
    assert [r.getMessage() for r in caplog.records] == ["Engine set failed to start"]


def test_the_benchmarks_timing_reductions_run_on_its_device(monkeypatch):
    """Under NCCL a CPU tensor in a collective is an error: the timings travel on the benchmark's device.

    No GPU here, so the collective is stood in for and records where its tensor lives ("meta" plays
    the GPU: any device other than the CPU shows the same mistake).
    """
    from dlscale import distributed
    from dlscale.bench import allreduce

    seen = []
    monkeypatch.setattr(distributed, "all_reduce_max", lambda tensor: seen.append(tensor.device) or torch.tensor(0.5))
    assert allreduce.slowest_rank(0.5, torch.device("meta")) == 0.5
    assert seen == [torch.device("meta")]


def test_collectives_of_plain_numbers_use_the_groups_device(monkeypatch):
    from dlscale.distributed import process_group

    monkeypatch.setattr(process_group.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(process_group.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(process_group.torch.cuda, "current_device", lambda: 3)
    assert process_group.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(process_group.dist, "get_backend", lambda *a: "gloo")
    assert process_group.collective_device() == torch.device("cpu")


def test_one_runner_starts_local_processes_and_a_failure_carries_their_own_words(tmp_path):
    # the benchmarks, dlscale kmeans, a study's workers and re-runs, and bench allreduce --nproc all start processes
    # through it: threads each, this environment's programs first, and one error with the start and end of stderr
    from dlscale.jobs.local_ranks import LaunchError, run_local, start_local

    script = (
        "import os, sys; print(os.environ.get('OMP_NUM_THREADS'), os.environ['PATH'].split(os.pathsep)[0]); "
        "sys.stderr.write('the rank failed: first words\\n' + 'x\\n' * 3000 + 'the launcher: last words\\n'); "
        "sys.exit(int(sys.argv[1]))"
    )
    done = run_local([sys.executable, "-c", script, "0"], "a probe", threads=3)
    assert done.stdout.split() == ["3", str(Path(sys.executable).parent)]
    with pytest.raises(LaunchError) as err:
        run_local([sys.executable, "-c", script, "4"], "a probe", threads=1)
    message = str(err.value)
    assert message.startswith("a probe failed (exit status 4):\nthe rank failed: first words")
    assert message.endswith("the launcher: last words") and len(message) < 4200  # the middle is cut, not the ends
    assert run_local([sys.executable, "-c", script, "5"], "a probe", capture=False).returncode == 5
    with open(tmp_path / "log", "ab") as log:
        process = start_local([sys.executable, "-c", script, "0"], log, threads=2, env={"EXTRA": "1"})
    assert process.wait(timeout=60) == 0 and (tmp_path / "log").read_text().startswith("2 ")


class _Timeout(Exception):
    pass


def _fake_engines(monkeypatch, stuck: set) -> dict:
    """ipyparallel faked for run_on_engines: each engine set a name ("cluster 1", "cluster 2", …); a call of a function
    in ``stuck`` (with the set's name: only then) times out. What was waited for, started and stopped is recorded."""
    from types import SimpleNamespace

    from dlscale.jobs import notebook_engines

    seen = {"waits": [], "started": [], "stopped": []}

    def start(*args):
        name = f"cluster {len(seen['started']) + 1}"
        seen["started"].append(name)

        class Task:
            def __init__(self, function):
                self.function = function

            def get(self, timeout=None):
                seen["waits"].append((self.function.__name__, timeout))
                if (self.function.__name__, name) in stuck:
                    raise _Timeout
                return self.function.__name__  # (a rank's answer)

        view = SimpleNamespace(apply_async=lambda function, *args: Task(function))
        return name, type("Client", (), {"ids": [0, 1], "__getitem__": lambda self, ids: view})()

    ipp = SimpleNamespace(
        error=SimpleNamespace(TimeoutError=_Timeout, RemoteError=RuntimeError, NoEnginesRegistered=LookupError)
    )
    monkeypatch.setattr(notebook_engines, "import_optional", lambda *args: ipp)
    monkeypatch.setattr(notebook_engines, "_start", start)
    monkeypatch.setattr(notebook_engines, "_stop", seen["stopped"].append)
    monkeypatch.setattr(notebook_engines, "_kept", None)
    return seen


def test_engines_stuck_leaving_the_process_group_are_stopped_and_the_answers_kept(monkeypatch):
    """CI once waited 600 s for an engine stuck destroying the group a call had left up (nothing bounded the wait):
    now the wait is bounded, the ranks' answers, all in, are returned, and those engines are stopped, not kept for
    the next call (whose first answer they would hold up)."""
    from dlscale.jobs import notebook_engines

    seen = _fake_engines(monkeypatch, stuck={("_leave_no_group", "cluster 1")})
    with pytest.warns(RuntimeWarning, match=r"could not leave the job's process group \(_Timeout\).*results are kept"):
        answers = notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    assert answers == ["_run_as_rank", "_run_as_rank"]
    assert ("_leave_no_group", notebook_engines.LEAVE_TIMEOUT_S) in seen["waits"]
    assert seen["stopped"] == ["cluster 1"] and notebook_engines._kept is None
    # engines that left their group are kept for the next call from here, which starts none
    notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    assert seen["started"] == ["cluster 1", "cluster 2"] and seen["stopped"] == ["cluster 1"]
    assert notebook_engines._kept[1] == "cluster 2"


def test_kept_engines_that_do_not_answer_are_replaced_after_seconds_not_minutes(monkeypatch):
    """Once in a fresh-clone run a call's kept engines never answered and it waited the 300 s fresh engines get for
    their first answer (their imports): kept engines get KEPT_ANSWER_S, then a fresh set runs the call; a fresh set
    that does not answer is stopped and named in one line."""
    from dlscale.jobs import notebook_engines

    stuck: set = set()
    seen = _fake_engines(monkeypatch, stuck)
    notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    assert seen["started"] == ["cluster 1"] and notebook_engines._kept[1] == "cluster 1"
    stuck.add(("_engine_facts", "cluster 1"))  # (its controller gone, say)
    seen["waits"].clear()
    answers = notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    assert answers == ["_run_as_rank", "_run_as_rank"]
    facts_waits = [timeout for name, timeout in seen["waits"] if name == "_engine_facts"]
    assert facts_waits == [notebook_engines.KEPT_ANSWER_S, notebook_engines.ANSWER_TIMEOUT_S]
    assert notebook_engines.KEPT_ANSWER_S <= 60
    assert seen["started"] == ["cluster 1", "cluster 2"] and seen["stopped"] == ["cluster 1"]
    assert notebook_engines._kept[1] == "cluster 2"
    notebook_engines.stop_engines()
    stuck.add(("_engine_facts", "cluster 3"))
    with pytest.raises(notebook_engines.EngineError, match=r"^the engines did not answer within 300 s \(stopped"):
        notebook_engines.run_on_engines(print, 2, timeout=5, as_ranks=False, show=False)
    assert seen["stopped"] == ["cluster 1", "cluster 2", "cluster 3"] and notebook_engines._kept is None


def test_ranks_agree_no_when_a_peer_never_answers(monkeypatch):
    """The switch runs' agreement (dlscale.distributed.agreement): rank 0 of two, its peer gone, answers no once its
    time is up, not never (the engines' test has the ranks that answer)."""
    import time

    from dlscale.distributed import free_port
    from dlscale.distributed.agreement import every_rank_says_yes

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    started = time.monotonic()
    assert every_rank_says_yes(True, free_port(), timeout_s=1.0) is False
    assert 0.9 < time.monotonic() - started < 10
