"""Data-parallel training: the tests that launch ranks, engines or runs beside them (tests/unit/test_distributed.py
has the rest).

The tests that only compare results share one launch (:func:`two_ranks`): a script that joins the process group
first, then trains each run in turn (``train`` leaves up a group it did not start), because starting ranks costs
more on this machine than their few steps: each process of a launch (torchrun's agent too) pays torch's import, and
each rank its first calls. The one-process runs they are held to train in this process (:func:`one_process`). The
tests about a launch itself (a rank killed, torchrun killed, a shutdown, the waits for rank 0's data, Intel MPI, the
engines) keep launches of their own, as small as their assertions allow.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dlscale.checkpoint import list_checkpoints
from dlscale.config import load_config
from dlscale.distributed import free_port
from dlscale.metrics.tracking import read_rows
from dlscale.train import train

from ..conftest import SAME_STEPS_FP64

# -- real processes over gloo ----------------------------------------------------------------------

# float64, so that two ways of computing the same steps agree to rounding on any CPU (conftest).
SETTINGS = [
    "tiny",
    "norm=group",
    "progress=false",
    "plot=false",
    "epochs=2",
    "checkpoint_every=16",
    "keep_checkpoints=10",
    "precision=fp64",
]
#: The gradient accumulation runs: 16 SGD steps (40 before: the suite's budget; 16 steps still move).
ACCUMULATION = [*SETTINGS, "optimizer=sgd", "lr=0.05", "max_steps=16"]


def _train_here(folder, arguments):
    """``dlscale train ARGUMENTS`` in this process, from ``folder`` (no launch to pay for), on one thread as each
    rank has (torchrun's default)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        train(load_config(arguments[0], [*arguments[1:], "threads=1"]))  # (what `dlscale train` does with them)
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process runs the ranks are held to, trained once for the module in this process; the data set they
    write to ``data/`` serves the ranks launched from the same folder, and is copied for the others (:func:`_data`)."""
    folder = tmp_path_factory.mktemp("distributed")
    _train_here(folder, [*SETTINGS, "run_dir=runs/one"])
    _train_here(folder, [*ACCUMULATION, "run_dir=runs/sgd"])
    _train_here(folder, [*ACCUMULATION, "run_dir=runs/sgd-acc4", "grad_accumulation=4"])
    return folder


def _data(one_process, folder):
    """The module's data set in ``folder`` too: rank 0 does not spend seconds writing it again."""
    shutil.copytree(one_process / "data", folder / "data")


#: Every run of the shared launch: its name (it trains into runs/NAME), then its `dlscale train` arguments.
RUNS = {
    "two": SETTINGS,
    "sgd-acc2": [*ACCUMULATION, "grad_accumulation=2"],
}

RANKS = """
import contextlib, json, sys
from dlscale import distributed
from dlscale.config import load_config
from dlscale.train import train

env = distributed.init("cpu", timeout_s=120)  # (the group outlives each run: train leaves up a group it did not start)
for name, arguments in json.loads(sys.argv[1]).items():
    # each run's lines in a file per rank, as the test reads them (torchrun's output would mix the runs)
    with open(f"{name}.rank{env.rank}.txt", "w") as out, contextlib.redirect_stdout(out):
        train(load_config(arguments[0], [*arguments[1:], f"run_dir=runs/{name}"]))
distributed.shutdown()
"""


@pytest.fixture(scope="module")
def two_ranks(one_process):
    """Two ranks under torchrun, launched once for the module, train every run of :data:`RUNS` beside the
    one-process runs; returns the folder and what both ranks printed during each run."""
    (one_process / "ranks.py").write_text(RANKS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            "ranks.py",
            json.dumps(RUNS),
        ],
        cwd=one_process,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    printed = {name: "".join((one_process / f"{name}.rank{rank}.txt").read_text() for rank in (0, 1)) for name in RUNS}
    return one_process, printed


def _rank_env(rank, port):
    """The variables torchrun gives rank ``rank`` of 2 on this machine (one thread each unless set, as it does): the
    tests about the ranks rather than the launcher start them without its agent, one import of torch less."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _two_ranks_of(command, cwd, timeout):
    """Run ``command`` as ranks 0 and 1 from ``cwd``; each one's (exit status, output), its output through a file
    (a full pipe would stall a rank). Past ``timeout`` both are killed and it raises, as ``subprocess.run`` does."""
    port, procs = free_port(), []
    for rank in range(2):
        with open(cwd / f"rank{rank}.log", "w") as log:
            procs.append(
                subprocess.Popen(command, cwd=cwd, env=_rank_env(rank, port), stdout=log, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [(proc.returncode, (cwd / f"rank{rank}.log").read_text()) for rank, proc in enumerate(procs)]


def _weights(run_dir):
    return torch.load(list_checkpoints(run_dir)[-1], weights_only=True)["model"]


def _assert_same_weights(reference, other):
    """The final weights of two float64 runs agree to SAME_STEPS_FP64 (see conftest for the bound)."""
    expected, got = _weights(reference), _weights(other)
    for key, value in expected.items():
        assert value.dtype == torch.float64, key
        difference = float((value - got[key]).abs().max()) if value.numel() else 0.0
        assert difference < SAME_STEPS_FP64, (key, difference)


def test_two_ranks_under_torchrun_equal_one_process_and_only_rank0_writes(two_ranks):
    folder, printed = two_ranks
    two = printed["two"]  # (both ranks' lines)
    assert "rank 0/2" in two and "via torchrun, gloo" in two
    _assert_same_weights(folder / "runs/one", folder / "runs/two")
    steps_one, steps_two = read_rows(folder / "runs/one/metrics.csv"), read_rows(folder / "runs/two/metrics.csv")
    assert [r["step"] for r in steps_two] == [r["step"] for r in steps_one]  # one writer: each step once
    # (the logged loss is reduced in float32, so it agrees to float32's rounding)
    assert [r["loss"] for r in steps_two] == pytest.approx([r["loss"] for r in steps_one], rel=1e-6)
    val_one, val_two = read_rows(folder / "runs/one/validation.csv"), read_rows(folder / "runs/two/validation.csv")
    assert val_two[-1]["r2"] == pytest.approx(val_one[-1]["r2"], abs=1e-9)  # reduced over both ranks' slices
    assert two.count("run tiny finished") == 1  # only rank 0 reports


def _torchrun_popen(cwd, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            "-m",
            "dlscale.train",
            *SETTINGS,
            *extra,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_job(proc):
    """SIGKILL torchrun and its ranks at once, as a node failure would (the ranks run in sessions of their own)."""
    import psutil

    tree = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    psutil.wait_procs([p for p in map(_process_or_none, tree) if p], timeout=30)


def _process_or_none(pid):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_two_ranks_killed_twice_resume_bit_for_bit(two_ranks, in_tmp):
    """A 2-rank job killed after step 48 of 64, resumed, killed again right after every rank has loaded, resumed.

    The first kill is staged: the shared launch's uninterrupted run, copied, with its checkpoint after the last
    (step 64) removed, leaves what a kill between steps 48 and 64 leaves; its last 16 steps are all the resumes train.
    The second run is given 1000 epochs and no checkpoint before its end, so the kill, sent as soon as it says where
    it resumed from, lands long before it could write one, however busy the machine is.
    """
    folder, _ = two_ranks
    shutil.copytree(folder / "runs/two", in_tmp / "runs/two")
    _data(folder, in_tmp)
    trajectory = lambda: [(r["step"], r["loss"], r["lr"]) for r in read_rows(in_tmp / "runs/two/metrics.csv")]  # noqa: E731
    reference = trajectory()
    assert reference[-1][0] == 64  # (the uninterrupted run's steps)
    for path in list_checkpoints(in_tmp / "runs/two"):
        if int(path.name[5:13]) > 48:
            path.unlink()

    proc = _torchrun_popen(in_tmp, "run_dir=runs/two", "resume=true", "epochs=1000", "checkpoint_every=0")
    for line in proc.stdout:
        if "resuming from" in line:
            _kill_job(proc)
            break
    else:
        raise AssertionError("the resumed run never said where it resumed from")
    assert list_checkpoints(in_tmp / "runs/two")[-1].name == "ckpt-00000048.pt"  # still there

    # (the job that resumes is any 2 ranks: started without torchrun's agent)
    (status0, out0), (status1, out1) = _two_ranks_of(
        [sys.executable, "-m", "dlscale.train", *SETTINGS, "run_dir=runs/two", "resume=true"], in_tmp, timeout=300
    )
    assert status0 == status1 == 0, out0[-3000:] + out1[-3000:]
    assert "resuming from ckpt-00000048.pt" in out0
    assert trajectory() == reference  # bit for bit


def test_a_dead_rank_stops_the_other_with_a_clear_message(one_process, in_tmp):
    _data(one_process, in_tmp)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dlscale.train", *SETTINGS, "epochs=50", "dist_timeout_s=30", "run_dir=runs/dead"],
            cwd=in_tmp,
            env=_rank_env(rank, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    deadline = time.time() + 120
    # killed once its first block of steps is logged (rows come in blocks of 10): the ranks are then well into training
    while time.time() < deadline and len(read_rows(in_tmp / "runs/dead/metrics.csv")) < 10:
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()
        time.sleep(0.05)
    killed_at = time.time()
    procs[1].send_signal(signal.SIGKILL)
    _, stderr = procs[0].communicate(timeout=90)
    procs[1].communicate()
    assert time.time() - killed_at < 60  # well within the 30 s timeout plus shutdown
    assert procs[0].returncode == 2, stderr[-2000:]
    assert "rank 0 of 2 stopped: a collective operation failed" in stderr and "Another rank probably died" in stderr
    assert "Traceback" not in stderr


LEAVING = """
import sys, time
from dlscale import distributed
env = distributed.init("cpu")
distributed.broadcast_object("last words" if env.is_main else None)
if env.rank == 1:
    time.sleep(5)  # the late rank
    print(f"rank 1 woke at {time.time():.6f}", flush=True)
distributed.shutdown(drain=sys.argv[1] == "drain")
if env.rank == 0:
    print(f"rank 0 left at {time.time():.6f}", flush=True)
"""


@pytest.mark.parametrize("mode", ["drain", "no-drain"])
def test_a_normal_shutdown_waits_for_every_rank_and_a_failed_one_does_not(in_tmp, mode):
    # Waiting lets gloo's worker threads release the last collective before the interpreter
    # exits (otherwise an occasional SIGABRT at exit); after a failure it must not wait.
    # The test compares the order of two events on one clock, not durations, so load cannot sway it.
    (in_tmp / "leave.py").write_text(LEAVING)
    (status0, out0), (status1, out1) = _two_ranks_of([sys.executable, "leave.py", mode], in_tmp, timeout=120)
    assert status0 == status1 == 0, out0[-2000:] + out1[-2000:]
    left = float(out0.split("rank 0 left at ")[1].split()[0])
    woke = float(out1.split("rank 1 woke at ")[1].split()[0])
    if mode == "drain":
        assert left > woke  # rank 0 waited for the late rank
    else:
        assert left < woke  # it did not


SETUP_WAIT = """
import datetime, sys, time
import torch.distributed as dist
from dlscale import distributed

# The ranks first meet with all the time a loaded machine needs to start them (a start is no part of the test); the
# timings below count from that meeting, and each differs from the one it races by 2 s or more.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
dist.barrier()
rank, mode = dist.get_rank(), sys.argv[1]
if mode == "plain":  # a group whose dist_timeout_s is sized for one collective (1 s)
    short = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=1))
    if rank == 0:
        time.sleep(3)  # rank 0 writes the data set for everyone
try:
    if mode == "plain":
        dist.barrier(group=short)
    else:
        with distributed.setup_waits(60 if mode == "setup" else 2) as wait:
            if rank == 0:
                time.sleep(3)  # rank 0 writes the data set for everyone
            if rank == 0 or mode == "setup":  # (missing: rank 1 never comes)
                wait("the data set's generation (rank 0)")
    said = f"rank {rank} passed"
except Exception as err:
    said = f"rank {rank} failed: {type(err).__name__}: {err}"
open(f"rank{rank}.txt", "w").write(said)  # (one file each: torchrun interleaves the ranks' output)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("mode", ["plain", "setup", "missing"])
def test_ranks_wait_for_rank_0s_data_as_long_as_setup_timeout_s_not_dist_timeout_s(mode, tmp_path):
    """The barrier behind rank 0's data generation had the group's timeout (120 s in the gpu config): a data set
    that took longer to write ended the job. The setup's own wait outlasts it, and names a rank that never came."""
    script = tmp_path / "setup_wait.py"
    script.write_text(SETUP_WAIT)
    (_, out0), (_, out1) = _two_ranks_of([sys.executable, str(script), mode], tmp_path, timeout=120)
    logs = out0[-2000:] + out1[-2000:]
    lines = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    if mode == "setup":
        assert lines == ["rank 0 passed", "rank 1 passed"], logs
    elif mode == "plain":  # what the data's wait did before: rank 1 gives up after the group's 1 s
        assert any(line.startswith("rank 1 failed") for line in lines), logs
    else:
        assert lines[0].startswith(
            "rank 0 failed: DistributedError: rank 0: not every rank finished the data set's "
            "generation (rank 0) within setup_timeout_s=2 s"
        ), lines
        assert "1" in lines[0].split("(", 2)[2]  # gloo's monitored barrier names the rank that did not come


def test_bench_allreduce_runs_on_two_local_ranks(in_tmp):
    from ..conftest import run_cli

    done = run_cli("bench", "allreduce", "--nproc", "2", "--max-mib", "0.25", "--out", "ar", cwd=in_tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all-reduce, 2 ranks, gloo" in done.stdout
    for size in ("4 KiB", "16 KiB", "64 KiB", "256 KiB"):
        assert f"| {size} |" in done.stdout
    import json

    rows = json.loads((in_tmp / "ar/allreduce.json").read_text())
    assert [r["bytes"] for r in rows] == [4096, 16384, 65536, 262144]
    assert all(r["busbw_gbs"] == pytest.approx(r["algbw_gbs"]) for r in rows)  # two ranks: bus = algorithm bw
    alone = run_cli("bench", "allreduce", "--nproc", "1", cwd=in_tmp)
    assert alone.returncode == 2 and "needs several ranks" in alone.stderr


@pytest.mark.slow
def test_weak_and_strong_scaling_runs_report_efficiency(tiny, in_tmp):
    from dlscale.bench.scaling import bench_scaling, format_scaling

    # (a quarter of tiny's maps: the first run writes them in a second; the runs only time 12 steps)
    rows = bench_scaling(
        tiny(train_samples=256, val_samples=64), procs=(1, 2), steps=12, out_dir="scaling", progress=False
    )
    assert [(r["mode"], r["processes"], r["global_batch"]) for r in rows] == [
        ("strong", 1, 32),
        ("strong", 2, 32),
        ("weak", 1, 32),
        ("weak", 2, 64),
    ]
    for row in rows:
        assert row["samples_per_s"] > 0
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["processes"])
    # An efficiency above 100% cannot come from the single process having had other threads than
    # each rank: every run's own summary reports the same per-process threads, those of the largest run.
    from dlscale.runtime.threads import fair_threads

    assert {row["threads_per_process"] for row in rows} == {fair_threads(2)}
    assert (in_tmp / "scaling/scaling.png").is_file()
    assert f"| weak | 2 | {fair_threads(2)} | 64 |" in format_scaling(rows)


#: Run on an engine: who, where, and whether a process group was up; then it leaves one up on purpose.
PROBE = """
def probe():
    import os

    import torch.distributed as dist
    was_up = dist.is_initialized()
    dist.init_process_group("gloo")
    return os.getpid(), os.getcwd(), was_up
"""


def _as_if_in_a_notebook(source: str, name: str):
    """The function ``name`` defined in ``__main__``, as a notebook cell defines it: engines get it by value
    (one defined in this module would have them import ``tests``, which they cannot from a test's folder)."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace[name]


def _cmdline(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # it ended meanwhile
        return ""


def engines_alive():
    """This process's engines: its children (other tests, or other suites, may run engines beside)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if "ipyparallel.engine" in _cmdline(p)]


def test_ipyparallel_engines_run_one_job_and_return_every_rank(in_tmp, monkeypatch):
    """One job on two engines; the engines stay up for the next call from the same folder, which finds no process
    group left up; a call from another folder gets engines started there, the others stop; a failed call stops its."""
    from dlscale.jobs.notebook_engines import EngineError, run_on_engines, stop_engines

    probe = _as_if_in_a_notebook(PROBE, "probe")
    stop_engines()  # none kept from an earlier test: this one starts its own
    # (engines a kernel of this process keeps up, the lessons' shared kernel's, are not this test's)
    beside = {p.pid for p in engines_alive()}
    results = run_on_engines(  # (a quarter of tiny's maps: 8 steps, and rank 0 writes them in a second)
        train,
        2,
        "tiny",
        norm="group",
        epochs=1,
        train_samples=256,
        val_samples=64,
        progress=False,
        plot=False,
        run_dir=str(in_tmp / "runs/engines"),
    )
    assert len(results) == 2
    assert [r.applied["launcher"] for r in results] == ["ipyparallel", "ipyparallel"]
    assert all(r.applied["world_size"] == 2 and r.applied["ddp"] for r in results)
    assert results[0].final["r2"] == pytest.approx(results[1].final["r2"])  # metrics are reduced over ranks
    first = run_on_engines(probe, 2)
    again = run_on_engines(probe, 2)
    assert [pid for pid, _, _ in again] == [pid for pid, _, _ in first]  # the same engines, not new ones
    assert [was_up for _, _, was_up in again] == [False, False]  # the group the first probe left up is gone
    (in_tmp / "elsewhere").mkdir()
    monkeypatch.chdir(in_tmp / "elsewhere")
    moved = run_on_engines(probe, 2)
    assert [folder for _, folder, _ in moved] == [str(in_tmp / "elsewhere")] * 2
    assert _left_running({pid for pid, _, _ in first}) == set(), "the first set was kept beside the second"
    with pytest.raises(EngineError, match=r"rank 0: DeviceError.*rank 1: DeviceError"):
        run_on_engines(train, 2, "tiny", device="cuda:7", progress=False)
    assert _left_running({pid for pid, _, _ in moved}) == set(), "engines left running after a failed call"
    assert [p for p in engines_alive() if p.pid not in beside] == []


#: Run on an engine: a line halfway, then 3 s more of "training".
HALFWAY = """
def halfway():
    import os, time

    print(f"rank {os.environ['RANK']}: halfway", flush=True)
    time.sleep(3)
    return 1
"""


def test_what_rank_0_prints_on_the_engines_shows_while_it_runs(in_tmp):
    """A cell that trains on the engines printed nothing until every rank was done (40-75 s looking stuck)."""
    import io

    from dlscale.jobs.notebook_engines import run_on_engines, stop_engines

    class Stamped(io.StringIO):  # when each piece of text arrived
        def __init__(self):
            super().__init__()
            self.times: list[tuple[float, str]] = []

        def write(self, text):
            self.times.append((time.monotonic(), text))
            return super().write(text)

    seen = Stamped()
    try:
        with contextlib.redirect_stdout(seen):
            assert run_on_engines(_as_if_in_a_notebook(HALFWAY, "halfway"), 2) == [1, 1]
            returned = time.monotonic()
            run_on_engines(_as_if_in_a_notebook(HALFWAY, "halfway"), 2, show=False)
    finally:
        stop_engines()
    arrivals = [at for at, text in seen.times if "halfway" in text]
    assert seen.getvalue().count("rank 0: halfway") == 1 and "rank 1" not in seen.getvalue()  # rank 0's, once
    assert len(arrivals) == 1 and returned - arrivals[0] > 2  # as it came, not at the end


#: A stage (its record: lesson 05's, one switch run) whose group is made, marked and left referenced, as a DDP model
#: the watch keeps leaves it; ``fail_on``'s rank fails after its group is gone
LEAVES_ITS_STORE = """
import datetime, os

import torch.distributed as dist

KEPT = []


def main(config="tiny", epochs=1, seed=0, checkpoint="c.pt", resume=False, fail_on=-1):
    rank = int(os.environ["RANK"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=20)
    )
    store = dist.distributed_c10d._get_default_store()
    fresh = not store.check([f"run/{rank}"])
    store.set(f"run/{rank}", "done")
    KEPT.append(store)
    dist.barrier()
    dist.destroy_process_group()
    if rank == fail_on:
        raise RuntimeError("this rank failed after its group")
    return {"losses": [], "r2": [], "throughput": [], "fresh": fresh, "port": os.environ["MASTER_PORT"]}
"""

#: Run on an engine: a call that outlasts its time, in a function of its own name
OUTLASTS = """
def outlasts():
    import time

    time.sleep(60)
"""


def test_a_stage_run_again_on_the_engines_meets_a_fresh_group_and_no_call_outlasts_its_time(in_tmp):
    """Lesson 07's stage cell hung 25 minutes in CI: a stage's switch runs made their groups on the lesson run's port,
    where rank 0's store, kept alive, served the last run's keys. Each run now gets a port of its own; the ranks go
    on to the switches together or not at all; and a call that outlasts its time ends, naming the line it waits in."""
    from dlscale.jobs.notebook_engines import EngineError, run_on_engines, stop_engines
    from dlscale.lessons.stage_probes import run_stage

    stage = in_tmp / "my_05_ddp.py"
    stage.write_text(LEAVES_ITS_STORE)
    try:
        ranks = run_on_engines(run_stage, 2, str(stage), show=False, timeout=120)
        assert [r["error"] for r in ranks] == [None, None]
        switches = [run for rank in ranks for run in rank["switches"]]
        assert len(switches) == 2 and [run["error"] for run in switches] == [None, None]
        assert all(run["fresh"] for run in switches), "a switch run met the lesson run's store"
        assert switches[0]["port"] != ranks[0]["port"]
        assert not (in_tmp / "runs/engines").exists()  # (a call that ended leaves no file of its stacks)
        started = time.monotonic()
        ranks = run_on_engines(run_stage, 2, str(stage), fail_on=1, show=False, timeout=120)
        assert ranks[0]["error"] is None and "failed after its group" in ranks[1]["error"]["message"]
        assert ranks[0]["switches"] == ranks[1]["switches"] == []  # rank 0 did not go on alone
        assert time.monotonic() - started < 20  # (alone, its switch run would have waited the stage's 20 s)
        with pytest.raises(EngineError, match=r"rank 0: no result after 6 s, waiting in File .*line 5 in outlasts"):
            run_on_engines(_as_if_in_a_notebook(OUTLASTS, "outlasts"), 2, show=False, timeout=6)
    finally:
        stop_engines()


def _left_running(pids: set[int], wait: float = 20) -> set[int]:
    """Those of ``pids`` still running after up to ``wait`` s (stopped engines take a moment to exit)."""
    deadline = time.time() + wait
    while (alive := pids & {p.pid for p in engines_alive()}) and time.time() < deadline:
        time.sleep(0.2)
    return alive


def test_engines_stop_when_their_kernel_is_killed_instead_of_exiting(tmp_path):
    """A kernel killed (a shutdown that outlasts the kernel manager's wait, a restart, a hub culling it) used to
    leave its controller and engines running, orphaned, each in a process session of its own."""
    from dlscale.jobs.engine_watchdog import _running

    kernel_code = (
        "import os, sys\nfrom dlscale.jobs.notebook_engines import run_on_engines\n"
        "print(*run_on_engines(os.getpid, 2), flush=True)\nsys.stdin.read()\n"
    )
    kernel = subprocess.Popen(
        [sys.executable, "-c", kernel_code], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    engines = [int(pid) for pid in kernel.stdout.readline().split()]
    assert len(engines) == 2 and all(_running(pid) for pid in engines)
    kernel.kill()
    kernel.wait()
    deadline = time.time() + 30
    while any(_running(pid) for pid in engines) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_running(pid) for pid in engines), "the killed kernel's engines are still running"


def test_two_ranks_under_intel_mpi_equal_one_process(one_process, in_tmp):
    """mpirun from the impi-rt wheel; no MASTER_ADDR, so rank 0's host is broadcast with mpi4py. The ranks take the
    16 SGD steps of the module's one-process run ``runs/sgd``: a missing or wrong all-reduce shows in the first."""
    bin_dir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    _data(one_process, in_tmp)
    two = subprocess.run(
        [
            os.path.join(bin_dir, "mpirun"),
            "-n",
            "2",
            sys.executable,
            "-m",
            "dlscale.train",
            *ACCUMULATION,
            "run_dir=runs/mpi",
        ],
        cwd=in_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, (two.stdout[-2000:], two.stderr[-2000:])
    assert "via mpi, gloo" in two.stdout
    _assert_same_weights(one_process / "runs/sgd", in_tmp / "runs/mpi")


def test_gradient_accumulation_takes_the_same_steps(two_ranks):
    folder, _ = two_ranks  # (runs/sgd and runs/sgd-acc4 in one process, runs/sgd-acc2 on two ranks)
    for run in ("sgd-acc4", "sgd-acc2"):
        _assert_same_weights(folder / "runs/sgd", folder / "runs" / run)
    assert [r["step"] for r in read_rows(folder / "runs/sgd-acc4/metrics.csv")] == list(range(1, 17))
    assert read_rows(folder / "runs/sgd-acc4/metrics.csv")[0]["loss"] == pytest.approx(
        read_rows(folder / "runs/sgd/metrics.csv")[0]["loss"], rel=1e-6
    )  # the logged loss is the whole batch's
