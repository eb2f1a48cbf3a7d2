"""Horovod behind the same training loop: horovodrun --gloo against one process, resume, errors.

Horovod is built by ``make horovod`` (scripts/build_horovod.sh), which ``make test`` runs;
without it these tests skip, and in CI a skip fails the run.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from dlscale import distributed
from dlscale.checkpoint import list_checkpoints
from dlscale.distributed import DistEnv, DistributedError, detect, horovod_backend, resolve_data_parallel
from dlscale.metrics.tracking import read_rows

from ..conftest import ROOT, SAME_STEPS_FP64

needs_horovod = pytest.mark.skipif(not horovod_backend.available(), reason="Horovod is not built (make horovod)")
# float64, so that Horovod's summation order and one process agree to rounding on any CPU (conftest).
SETTINGS = ["tiny", "norm=group", "progress=false", "plot=false", "precision=fp64"]


def _single(cwd, *extra):
    return subprocess.run(
        [sys.executable, "-m", "dlscale.train", *SETTINGS, *extra], cwd=cwd, capture_output=True, text=True, timeout=300
    )


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
            *SETTINGS,
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
def test_two_ranks_under_horovodrun_equal_one_process_and_only_rank0_writes(in_tmp):
    one = _single(in_tmp, "run_dir=runs/one", "max_steps=20")
    assert one.returncode == 0, _why(one)
    two = _horovodrun(in_tmp, "run_dir=runs/hvd", "max_steps=20")
    assert two.returncode == 0, (two.stdout[-2000:], _why(two))
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
def test_larc_with_accumulation_under_horovod_equals_one_process(in_tmp):
    """LARC wraps the optimizer Horovod makes distributed; backward_passes_per_step = grad_accumulation."""
    common = ("optimizer=larc", "lr=0.05", "max_steps=20")
    one = _single(in_tmp, "run_dir=runs/one", *common)
    two = _horovodrun(in_tmp, "run_dir=runs/hvd", *common, "grad_accumulation=2")
    assert one.returncode == 0 and two.returncode == 0, _why(two)
    assert _max_difference(in_tmp / "runs/one", in_tmp / "runs/hvd") < SAME_STEPS_FP64
    ratios = read_rows(in_tmp / "runs/hvd/trust_ratios.csv")
    assert ratios and ratios[-1]["step"] == 20  # the distributed LARC still reports its trust ratios


@needs_horovod
def test_fp16_compression_rounds_the_gradients_a_little(in_tmp):
    common = ("optimizer=larc", "lr=0.05", "max_steps=20")
    exact = _horovodrun(in_tmp, "run_dir=runs/fp32", *common)
    rounded = _horovodrun(in_tmp, "run_dir=runs/fp16", *common, "horovod_fp16_compression=true")
    assert exact.returncode == 0 and rounded.returncode == 0, _why(rounded)
    difference = _max_difference(in_tmp / "runs/fp32", in_tmp / "runs/fp16")
    assert 1e-5 < difference < 1e-2  # the gradients really travelled as fp16, and it cost little
    loss = lambda run: read_rows(in_tmp / f"runs/{run}/metrics.csv")[-1]["loss"]  # noqa: E731
    assert loss("fp16") == pytest.approx(loss("fp32"), rel=0.02)


@needs_horovod
def test_a_two_rank_horovod_run_resumes_exactly(in_tmp):
    common = ("max_steps=40", "checkpoint_every=10", "keep_checkpoints=10")
    full = _horovodrun(in_tmp, "run_dir=runs/r", *common)
    assert full.returncode == 0, _why(full)
    losses = [r["loss"] for r in read_rows(in_tmp / "runs/r/metrics.csv")]
    for path in list_checkpoints(in_tmp / "runs/r"):
        if int(path.name[5:13]) > 20:
            path.unlink()
    again = _horovodrun(in_tmp, "run_dir=runs/r", *common, "resume=true")
    assert again.returncode == 0, _why(again)
    assert "resuming from ckpt-00000020.pt" in again.stdout
    assert [r["loss"] for r in read_rows(in_tmp / "runs/r/metrics.csv")] == losses


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
def test_the_notebook_launcher_gives_its_ranks_the_engines_gloo_timeout(monkeypatch):
    # Horovod's own 30 s, not the engine's dist_timeout_s, once ended lesson 06's stage in CI
    monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)

    def timeout_seen():
        return os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")

    assert horovod_backend.run(timeout_seen, 2) == [str(horovod_backend.COLLECTIVE_TIMEOUT_S)] * 2
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in os.environ  # the notebook's own environment as it was
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "45")  # a user's choice stands
    with horovod_backend._environment(HOROVOD_GLOO_TIMEOUT_SECONDS="300"):
        assert os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"


@needs_horovod
def test_the_horovod_exercise_check_rejects_a_loop_without_broadcast_or_sharding():
    from dlscale.lessons.lesson06 import check_horovod_loop

    def no_broadcast(steps, lr=0.1):
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

    def every_sample_everywhere(steps, lr=0.1):
        import horovod.torch as hvd

        from dlscale.lessons.lesson06 import _one_process_loop
        from dlscale.lessons.lesson_tools import regression_problem

        hvd.init()
        return {"samples": len(regression_problem()[0]), "weight": _one_process_loop(steps, lr).weight.detach()}

    with pytest.raises(AssertionError, match="broadcast rank 0's parameters"):
        check_horovod_loop(no_broadcast)
    with pytest.raises(AssertionError, match="its own half"):
        check_horovod_loop(every_sample_everywhere)


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
