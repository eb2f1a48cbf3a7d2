"""Horovod behind the same training loop: horovodrun --gloo against one process, resume, errors.

Horovod is built by ``make horovod`` (scripts/build_horovod.sh), which ``make test`` runs;
without it these tests skip, and in CI a skip fails the run.

The trainings share two launches of the same 2 ranks (the module fixture :func:`launched`): starting them costs
each rank its imports of torch and Horovod's start (~6 CPU-s), more than the few steps it then trains. The first
launch is ``horovodrun --gloo python -m dlscale.train`` as a user types it; the second is the notebooks' launcher,
:func:`dlscale.distributed.horovod_backend.run`, with one function that runs on each rank every other training in
turn (Horovod stays up between them: ``train`` leaves it up), resumes the first launch's run (a fresh launch, as a
requeued job) and runs the exercise check's wrong loops. The one-process references train in this process. Each
test keeps its assertions and reads what the launches left; the tests that start something of their own (the bench
command, srun's tasks) still do.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from multiprocessing import resource_tracker
from types import SimpleNamespace

import pytest
import torch

from dlscale import distributed
from dlscale.checkpoint import list_checkpoints
from dlscale.distributed import DistEnv, DistributedError, detect, horovod_backend, resolve_data_parallel
from dlscale.metrics.tracking import read_rows
from dlscale.train import train

from ..conftest import ROOT, SAME_STEPS_FP64

needs_horovod = pytest.mark.skipif(not horovod_backend.available(), reason="Horovod is not built (make horovod)")
# float64, so that Horovod's summation order and one process agree to rounding on any CPU (conftest).
SETTINGS = {"norm": "group", "progress": False, "plot": False, "precision": "fp64"}
LARC = {"optimizer": "larc", "lr": 0.05, "max_steps": 20}
# The command-line run: 20 steps, a checkpoint every 10 (the resume test resumes it from the first).
CLI_RUN = {"max_steps": 20, "checkpoint_every": 10, "keep_checkpoints": 10}
# (steps, lr): what check_horovod_loop (lesson06) passes the loop it checks; the shared launch runs the wrong loops
# with them ahead of the check.
CHECK_ARGS = (10, 0.1)


def _as_arguments(settings):
    """``key=value`` words for ``python -m dlscale.train``."""
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in settings.items()]


def _horovodrun(cwd, *extra, ranks=2):
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            os.path.join(bin_dir, "horovodrun"),
            "-np",
            str(ranks),
            "--gloo",
            "-H",
            f"localhost:{ranks}",
            sys.executable,
            "-m",
            "dlscale.train",
            "tiny",
            *_as_arguments(SETTINGS),
            *extra,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _why(proc):
    """What a failed run printed, from the start: a rank killed in C++ says why first ("what(): ...").

    The tail alone is horovodrun's own traceback and the interpreter's list of extension modules.
    """
    kept = [line for line in proc.stderr.splitlines() if "Extension modules:" not in line]
    return "\n".join(kept)[:4000]


def _weights(run_dir):
    return torch.load(list_checkpoints(run_dir)[-1], weights_only=True)["model"]


def _max_difference(a, b):
    one, two = _weights(a), _weights(b)
    return max(float((one[k] - two[k]).abs().max()) for k in one)


def _no_broadcast(steps, lr=0.1):
    """06.1's loop without hvd.broadcast_parameters: each rank starts from its own model."""
    import horovod.torch as hvd
    import torch

    from dlscale.lessons.lesson_tools import regression_problem

    hvd.init()
    x, y = regression_problem()
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), named_parameters=model.named_parameters()
    )
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return {"samples": len(x), "weight": model.weight.detach().clone()}


def _every_sample_everywhere(steps, lr=0.1):
    """06.1's loop without sharding: each rank trains on all the data."""
    import horovod.torch as hvd

    from dlscale.lessons.lesson06 import _one_process_loop
    from dlscale.lessons.lesson_tools import regression_problem

    hvd.init()
    return {"samples": len(regression_problem()[0]), "weight": _one_process_loop(steps, lr).weight.detach()}


def _on_each_rank():
    """The shared launch, on each of its ranks: every training but the command line's, one after another."""
    seen = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")  # (as the launcher set it, before any training here)
    trainings = {
        "larc": {**LARC, "grad_accumulation": 2},  # (backward_passes_per_step = 2)
        "fp32": LARC,
        "fp16": {**LARC, "horovod_fp16_compression": True},
    }
    for name, settings in trainings.items():
        train("tiny", **SETTINGS, **settings, run_dir=f"runs/{name}", data_parallel="horovod")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # (what the resume says is the resume test's to read)
        train("tiny", **SETTINGS, **CLI_RUN, run_dir="runs/resumed", resume=True, data_parallel="horovod")
    loops = {loop.__name__: loop(*CHECK_ARGS) for loop in (_no_broadcast, _every_sample_everywhere)}
    return {"timeout_seen": seen, "resume_printed": printed.getvalue(), "loops": loops}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One folder, two launches of 2 ranks and the one-process references (the module's docstring says why)."""
    folder = tmp_path_factory.mktemp("horovod")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # (data/ and runs/ land here, for this process and the ranks alike)
        patch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)  # (the launcher's own value is under test)
        patch.setenv("OMP_NUM_THREADS", "1")  # the ranks share the cores: one thread each, as under horovodrun
        # one process, here: the references the ranks are held to
        train("tiny", **SETTINGS, max_steps=20, run_dir="runs/one")
        train("tiny", **SETTINGS, **LARC, run_dir="runs/larc_one")
        cli = _horovodrun(folder, "run_dir=runs/hvd", *_as_arguments(CLI_RUN))
        assert cli.returncode == 0, (cli.stdout[-2000:], _why(cli))
        # the command line's run as a job killed after its checkpoint of step 10 left it, resumed by the next launch
        shutil.copytree(folder / "runs/hvd", folder / "runs/resumed")
        for path in list_checkpoints(folder / "runs/resumed"):
            if int(path.name[5:13]) > 10:
                path.unlink()
        import cloudpickle  # (Horovod's: how horovod.run sends the function to its ranks)

        module = sys.modules[__name__]
        cloudpickle.register_pickle_by_value(module)  # by value: the ranks cannot import this test module
        try:
            ranks = horovod_backend.run(_on_each_rank, 2)
        finally:
            cloudpickle.unregister_pickle_by_value(module)
        timeout_left = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")
        # horovod.run's events started multiprocessing's resource tracker in this process: stopped, so that this file
        # run alone does not leave it running at the session's end (the reaper would count it, and fail CI)
        stop_tracker = getattr(resource_tracker._resource_tracker, "_stop", None)  # (Python 3.11.7 and later)
        if stop_tracker:
            stop_tracker()
    return SimpleNamespace(folder=folder, cli=cli, ranks=ranks, timeout_left=timeout_left)


@pytest.mark.parametrize(
    "cuda, nvcc, expected",
    [
        ("12.4", True, "gloo and NCCL (HOROVOD_GPU_OPERATIONS=NCCL)"),  # a GPU node with the CUDA toolkit
        ("12.4", False, "gloo, CPU tensors only"),  # PyPI's CUDA torch on a laptop without nvcc
        ("none", True, "gloo, CPU tensors only"),  # a CPU-only torch
    ],
)
def test_horovod_is_built_with_nccl_where_torch_and_the_toolkit_have_cuda(cuda, nvcc, expected, tmp_path):
    """Built gloo-only, Horovod crashed at a GPU tensor's first all-reduce (horovod/horovod#2478)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    python = fake / "python"  # answers the script's questions about torch and its NCCL, as a CUDA or CPU build would
    python.write_text(
        f'#!/bin/sh\ncase "$*" in *nvidia.nccl*) echo /wheels/nvidia/nccl ;;\n'
        f'*) echo "2.13.0+{"cu124" if cuda != "none" else "cpu"} {cuda}" ;; esac\n'
    )
    tools = [python] + ([fake / "nvcc"] if nvcc else [])
    for tool in tools:
        tool.write_text(tool.read_text() if tool.exists() else "#!/bin/sh\n")
        tool.chmod(0o755)
    done = subprocess.run(
        ["bash", "scripts/build_horovod.sh", str(python)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BUILD_HOROVOD_PLAN": "1", "PATH": f"{fake}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(expected), done.stdout
    # PyPI's torch brings NCCL in the nvidia-nccl wheel: linked from there, shared, for A100 and H100 (issue 59)
    assert ("NCCL from /wheels/nvidia/nccl (linked shared), CUDA architectures 80,90" in done.stdout) == (
        "NCCL" in expected
    )


def test_horovodrun_variables_are_detected_and_pick_horovod():
    environ = {
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "nid000007",
    }
    assert detect(environ) == DistEnv(1, 1, 4, 2, "horovodrun", "nid000007", 29500)
    assert resolve_data_parallel("auto", "horovodrun") == "horovod"
    assert resolve_data_parallel("auto", "torchrun") == "ddp"
    assert resolve_data_parallel("horovod", "single") == "horovod"
    with pytest.raises(DistributedError, match="use data_parallel=horovod"):
        resolve_data_parallel("ddp", "horovodrun")


def test_a_missing_horovod_says_how_to_build_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)  # import horovod.torch now fails as if not installed
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(horovod_backend.HorovodError, match="make horovod"):
        distributed.init(data_parallel="horovod")
    assert not distributed.uses_horovod()


@needs_horovod
def test_two_ranks_under_horovodrun_equal_one_process_and_only_rank0_writes(launched):
    in_tmp, two = launched.folder, launched.cli  # (horovodrun from the command line, and one process)
    assert "rank 0/2" in two.stdout and "via horovodrun, horovod" in two.stdout
    assert _max_difference(in_tmp / "runs/one", in_tmp / "runs/hvd") < SAME_STEPS_FP64
    rows_one, rows_two = read_rows(in_tmp / "runs/one/metrics.csv"), read_rows(in_tmp / "runs/hvd/metrics.csv")
    assert [r["step"] for r in rows_two] == [r["step"] for r in rows_one]  # one writer: each step once
    # (the logged loss is reduced in float32, so it agrees to float32's rounding)
    assert [r["loss"] for r in rows_two] == pytest.approx([r["loss"] for r in rows_one], rel=1e-6)
    assert two.stdout.count("run tiny finished") == 1
    applied = json.loads((in_tmp / "runs/hvd/summary.json").read_text())["applied"]
    assert applied["horovod"] and not applied["ddp"] and applied["world_size"] == 2


@needs_horovod
def test_larc_with_accumulation_under_horovod_equals_one_process(launched):
    """LARC wraps the optimizer Horovod makes distributed; backward_passes_per_step = grad_accumulation."""
    in_tmp = launched.folder  # (runs/larc: 2 ranks, grad_accumulation=2; runs/larc_one: one process)
    assert _max_difference(in_tmp / "runs/larc_one", in_tmp / "runs/larc") < SAME_STEPS_FP64
    ratios = read_rows(in_tmp / "runs/larc/trust_ratios.csv")
    assert ratios and ratios[-1]["step"] == 20  # the distributed LARC still reports its trust ratios


@needs_horovod
def test_fp16_compression_rounds_the_gradients_a_little(launched):
    in_tmp = launched.folder  # (runs/fp32 and runs/fp16: the same LARC run on 2 ranks, without and with compression)
    difference = _max_difference(in_tmp / "runs/fp32", in_tmp / "runs/fp16")
    assert 1e-5 < difference < 1e-2  # the gradients really travelled as fp16, and it cost little
    loss = lambda run: read_rows(in_tmp / f"runs/{run}/metrics.csv")[-1]["loss"]  # noqa: E731
    assert loss("fp16") == pytest.approx(loss("fp32"), rel=0.02)


@needs_horovod
def test_a_two_rank_horovod_run_resumes_exactly(launched):
    """The command line's run (runs/hvd), copied without its checkpoints after step 10 (runs/resumed), resumed by
    the next launch of the ranks, logs the same losses."""
    in_tmp = launched.folder
    losses = [r["loss"] for r in read_rows(in_tmp / "runs/hvd/metrics.csv")]
    assert len(losses) == CLI_RUN["max_steps"]
    assert "resuming from ckpt-00000010.pt" in launched.ranks[0]["resume_printed"]
    # (steps 11 to 20 trained again after the resume, and logged in place of the copied rows)
    assert [r["loss"] for r in read_rows(in_tmp / "runs/resumed/metrics.csv")] == losses


def test_noise_scale_is_refused_under_horovod():
    from dlscale.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="Horovod"):
        load_config("tiny", {"noise_scale_every": 5, "data_parallel": "horovod"})


@needs_horovod
def test_bench_allreduce_times_horovod_on_two_local_ranks(in_tmp):
    from ..conftest import run_cli

    done = run_cli(
        "bench",
        "allreduce",
        "--nproc",
        "2",
        "--horovod",
        "--max-mib",
        "0.0625",
        "--out",
        "ar",
        cwd=in_tmp,
        env={"PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"},
    )
    assert done.returncode == 0, _why(done)
    assert "all-reduce, 2 ranks, horovod (gloo)" in done.stdout
    rows = json.loads((in_tmp / "ar/allreduce.json").read_text())
    assert [r["bytes"] for r in rows] == [4096, 16384, 65536]
    assert all(r["ms"] > 0 and r["backend"] == "horovod (gloo)" for r in rows)


@needs_horovod
def test_the_notebook_launcher_gives_its_ranks_the_engines_gloo_timeout(launched, monkeypatch):
    # Horovod's own 30 s, not the engine's dist_timeout_s, once ended lesson 06's stage in CI. The shared launch
    # started its ranks without the variable set; each read it before anything else.
    assert [rank["timeout_seen"] for rank in launched.ranks] == [str(horovod_backend.COLLECTIVE_TIMEOUT_S)] * 2
    assert launched.timeout_left is None  # the notebook's own environment as it was
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "45")  # a user's choice stands
    with horovod_backend._environment(HOROVOD_GLOO_TIMEOUT_SECONDS="300"):
        assert os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"


@needs_horovod
def test_the_horovod_exercise_check_rejects_a_loop_without_broadcast_or_sharding(launched, monkeypatch):
    from dlscale.lessons.lesson06 import check_horovod_loop

    def ranks_ran(loop, n, *args, **kwargs):
        """The check's own launch, answered from the shared one, which ran each wrong loop on its 2 ranks with the
        arguments the check passes."""
        assert (n, args, kwargs) == (2, CHECK_ARGS, {}), "check_horovod_loop's launch changed: update CHECK_ARGS"
        return [rank["loops"][loop.__name__] for rank in launched.ranks]

    monkeypatch.setattr(horovod_backend, "run", ranks_ran)
    with pytest.raises(AssertionError, match="broadcast rank 0's parameters"):
        check_horovod_loop(_no_broadcast)
    with pytest.raises(AssertionError, match="its own half"):
        check_horovod_loop(_every_sample_everywhere)


def test_the_compression_check_rejects_fp32_bytes_and_absolute_errors():
    from dlscale.lessons.lesson06 import check_fp16_compression

    def fp32_bytes(grad):
        back = grad.half().float()
        return {"bytes_sent": grad.numel() * 4, "max_relative_error": float(((back - grad).abs() / grad.abs()).max())}

    def absolute(grad):
        return {"bytes_sent": grad.numel() * 2, "max_relative_error": float((grad.half().float() - grad).abs().max())}

    with pytest.raises(AssertionError, match="2 bytes"):
        check_fp16_compression(fp32_bytes)
    with pytest.raises(AssertionError, match="relative"):
        check_fp16_compression(absolute)


@needs_horovod
def test_the_horovod_stage_started_by_srun_stops_with_one_line_instead_of_training_alone(tmp_path):
    """With the gloo build, srun's tasks each became rank 0 of 1, all on GPU 0, overwriting one checkpoint (#59)."""
    environ = {**os.environ, "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "PYTHONPATH": str(ROOT / "recipes")}
    for name in ("HOROVOD_SIZE", "HOROVOD_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        environ.pop(name, None)
    tasks = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "recipes/06_horovod.py"), "--epochs", "1", "--device", "cpu", "--workers", "0"],
            cwd=tmp_path,
            env={**environ, "SLURM_PROCID": str(task)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for task in range(2)
    ]
    for task in tasks:
        _, err = task.communicate(timeout=120)
        assert task.returncode == 1 and err.strip().splitlines()[-1] == (
            "Horovod sees 1 rank(s), but the launcher started 2 tasks: this Horovod cannot join tasks it did not "
            "start. Start the job with horovodrun -np 2"
        ), err
    assert not list(tmp_path.glob("*.pt"))  # refused before any training: no checkpoint written
