"""Data-parallel training: the tests that launch ranks, engines or runs beside them (tests/unit/test_distributed.py
has the rest)."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dlscale.checkpoint import list_checkpoints
from dlscale.distributed import free_port
from dlscale.metrics.tracking import read_rows

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


def _single(cwd, *extra):
    return subprocess.run(
        [sys.executable, "-m", "dlscale.train", *SETTINGS, *extra], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _torchrun(cwd, *extra, ranks=2):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={free_port()}",
            "-m",
            "dlscale.train",
            *SETTINGS,
            *extra,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _weights(run_dir):
    return torch.load(list_checkpoints(run_dir)[-1], weights_only=True)["model"]


def _assert_same_weights(reference, other):
    """The final weights of two float64 runs agree to SAME_STEPS_FP64 (see conftest for the bound)."""
    expected, got = _weights(reference), _weights(other)
    for key, value in expected.items():
        assert value.dtype == torch.float64, key
        difference = float((value - got[key]).abs().max()) if value.numel() else 0.0
        assert difference < SAME_STEPS_FP64, (key, difference)


def test_two_ranks_under_torchrun_equal_one_process_and_only_rank0_writes(in_tmp):
    one = _single(in_tmp, "run_dir=runs/one")
    assert one.returncode == 0, one.stderr
    two = _torchrun(in_tmp, "run_dir=runs/two")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0/2" in two.stdout and "via torchrun, gloo" in two.stdout
    _assert_same_weights(in_tmp / "runs/one", in_tmp / "runs/two")
    steps_one, steps_two = read_rows(in_tmp / "runs/one/metrics.csv"), read_rows(in_tmp / "runs/two/metrics.csv")
    assert [r["step"] for r in steps_two] == [r["step"] for r in steps_one]  # one writer: each step once
    # (the logged loss is reduced in float32, so it agrees to float32's rounding)
    assert [r["loss"] for r in steps_two] == pytest.approx([r["loss"] for r in steps_one], rel=1e-6)
    val_one, val_two = read_rows(in_tmp / "runs/one/validation.csv"), read_rows(in_tmp / "runs/two/validation.csv")
    assert val_two[-1]["r2"] == pytest.approx(val_one[-1]["r2"], abs=1e-9)  # reduced over both ranks' slices
    assert two.stdout.count("run tiny finished") == 1  # only rank 0 reports


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


def test_two_ranks_killed_twice_resume_bit_for_bit(in_tmp):
    """A 2-rank job killed after step 32, resumed, killed again right after every rank has loaded, resumed.

    The first kill is staged (an uninterrupted run's later checkpoints removed). The second run
    is given 1000 epochs and no checkpoint before its end, so the kill, sent as soon as it says
    where it resumed from, lands long before it could write one, however busy the machine is.
    """
    full = _torchrun(in_tmp, "run_dir=runs/r")
    assert full.returncode == 0, full.stderr[-3000:]
    trajectory = lambda: [(r["step"], r["loss"], r["lr"]) for r in read_rows(in_tmp / "runs/r/metrics.csv")]  # noqa: E731
    reference = trajectory()
    for path in list_checkpoints(in_tmp / "runs/r"):
        if int(path.name[5:13]) > 32:
            path.unlink()

    proc = _torchrun_popen(in_tmp, "run_dir=runs/r", "resume=true", "epochs=1000", "checkpoint_every=0")
    for line in proc.stdout:
        if "resuming from" in line:
            _kill_job(proc)
            break
    else:
        raise AssertionError("the resumed run never said where it resumed from")
    assert list_checkpoints(in_tmp / "runs/r")[-1].name == "ckpt-00000032.pt"  # still there

    again = _torchrun(in_tmp, "run_dir=runs/r", "resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from ckpt-00000032.pt" in again.stdout
    assert trajectory() == reference  # bit for bit


def test_a_dead_rank_stops_the_other_with_a_clear_message(in_tmp):
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dlscale.train",
                    *SETTINGS,
                    "epochs=50",
                    "dist_timeout_s=30",
                    "run_dir=runs/dead",
                ],
                cwd=in_tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.time() + 120
    while time.time() < deadline and len(read_rows(in_tmp / "runs/dead/metrics.csv")) < 20:
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()
        time.sleep(0.05)
    killed_at = time.time()
    procs[1].send_signal(signal.SIGKILL)
    _, stderr = procs[0].communicate(timeout=90)
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            "leave.py",
            mode,
        ],
        cwd=in_tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    left = float(done.stdout.split("rank 0 left at ")[1].split()[0])
    woke = float(done.stdout.split("rank 1 woke at ")[1].split()[0])
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            str(script),
            mode,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    if mode == "setup":
        assert lines == ["rank 0 passed", "rank 1 passed"], done.stdout + done.stderr[-2000:]
    elif mode == "plain":  # what the data's wait did before: rank 1 gives up after the group's 1 s
        assert any(line.startswith("rank 1 failed") for line in lines), done.stdout + done.stderr[-2000:]
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

    rows = bench_scaling(tiny(), procs=(1, 2), steps=12, out_dir="scaling", progress=False)
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
    from dlscale.train import train

    probe = _as_if_in_a_notebook(PROBE, "probe")
    stop_engines()  # none kept from an earlier test: this one starts its own
    results = run_on_engines(
        train, 2, "tiny", norm="group", epochs=1, progress=False, plot=False, run_dir=str(in_tmp / "runs/engines")
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
    assert engines_alive() == []


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


def test_two_ranks_under_intel_mpi_equal_one_process(in_tmp):
    """mpirun from the impi-rt wheel; no MASTER_ADDR, so rank 0's host is broadcast with mpi4py."""
    bin_dir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    one = _single(in_tmp, "run_dir=runs/one")
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [
            os.path.join(bin_dir, "mpirun"),
            "-n",
            "2",
            sys.executable,
            "-m",
            "dlscale.train",
            *SETTINGS,
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
    _assert_same_weights(in_tmp / "runs/one", in_tmp / "runs/mpi")


def test_gradient_accumulation_takes_the_same_steps(in_tmp):
    common = ("optimizer=sgd", "lr=0.05", "max_steps=16")  # (40 before: the suite's budget; 16 steps still move)
    one = _single(in_tmp, "run_dir=runs/one", *common)
    accumulated = _single(in_tmp, "run_dir=runs/acc", *common, "grad_accumulation=4")
    ranks = _torchrun(in_tmp, "run_dir=runs/acc2", *common, "grad_accumulation=2")
    for done in (one, accumulated, ranks):
        assert done.returncode == 0, done.stderr[-2000:]
    for run in ("acc", "acc2"):
        _assert_same_weights(in_tmp / "runs/one", in_tmp / "runs" / run)
    assert [r["step"] for r in read_rows(in_tmp / "runs/acc/metrics.csv")] == list(range(1, 17))
    assert read_rows(in_tmp / "runs/acc/metrics.csv")[0]["loss"] == pytest.approx(
        read_rows(in_tmp / "runs/one/metrics.csv")[0]["loss"], rel=1e-6
    )  # the logged loss is the whole batch's
