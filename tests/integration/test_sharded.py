"""Beyond data parallel: the tests that launch ranks, engines or runs beside them (tests/unit/test_sharded.py
has the rest)."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from dlscale.checkpoint import checkpoint_dir, list_checkpoints, load_model
from dlscale.config import load_config
from dlscale.distributed import free_port
from dlscale.metrics.memory import estimate_bytes
from dlscale.metrics.tracking import read_rows
from dlscale.models import build_model, count_parameters

from ..conftest import SAME_STEPS_FP64

# float64 for the equivalence runs: honest differences are then ~1e-13 (conftest's bound is 1e-9),
# while a wrong shard, average or norm moves the weights by 1e-4 or more.
SETTINGS = ["vit-tiny", "progress=false", "plot=false", "max_steps=12", "checkpoint_every=6", "keep_checkpoints=5"]
FP64 = ["precision=fp64"]


def _single(cwd, *extra):
    return subprocess.run(
        [sys.executable, "-m", "dlscale.train", *SETTINGS, *extra], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _torchrun(cwd, *extra, ranks=2):
    done = subprocess.run(
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
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_a_rank_with_no_validation_map_does_not_leave_the_others_waiting(tmp_path):
    """One map to validate on and two ranks: rank 1's share is empty, and it used to skip the reduction that rank 0
    then waited in until dist_timeout_s (then the job failed)."""
    done = _torchrun(tmp_path, "val_samples=1", "max_steps=2", "checkpoint_every=0", "dist_timeout_s=60")
    assert "validation: mse" in done.stdout


def _difference(one, other):
    """The largest difference between two runs' final weights, each read back whole in this process."""
    expected, got = load_model(one).state_dict(), load_model(other).state_dict()
    assert expected.keys() == got.keys()
    assert all(v.dtype == torch.float64 for v in got.values())
    return max(float((expected[k] - got[k]).abs().max()) for k in expected)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process, AdamW and LAMB with clipping: the references (and LAMB's differs from AdamW's)."""
    folder = tmp_path_factory.mktemp("sharded")
    for name, extra in {"adamw": [], "lamb": ["optimizer=lamb", "lr=0.01", "grad_clip=0.5"]}.items():
        done = _single(folder, f"run_dir=runs/one-{name}", *FP64, *extra)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _difference(folder / "runs/one-adamw", folder / "runs/one-lamb") > 1e-3
    return folder


def test_fsdp_on_two_ranks_equals_one_process_and_writes_a_sharded_checkpoint(one_process):
    done = _torchrun(one_process, "run_dir=runs/fsdp", "data_parallel=fsdp", *FP64)
    assert "(fsdp)" in done.stdout
    assert _difference(one_process / "runs/one-adamw", one_process / "runs/fsdp") < SAME_STEPS_FP64
    newest = list_checkpoints(one_process / "runs/fsdp")[-1]
    assert newest.is_dir() and sorted(p.name for p in newest.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    summary = json.loads((one_process / "runs/fsdp/summary.json").read_text())
    assert summary["applied"]["fsdp"] and summary["applied"]["data_parallel_ranks"] == 2


def test_tensor_parallel_on_two_ranks_equals_one_process(one_process):
    done = _torchrun(one_process, "run_dir=runs/tp", "tensor_parallel=2", *FP64)
    assert "tensor parallel over 2" in done.stdout
    assert _difference(one_process / "runs/one-adamw", one_process / "runs/tp") < SAME_STEPS_FP64


def test_fsdp_times_tensor_parallel_with_lamb_and_clipping_equals_one_process(one_process):
    """DP 2 × TP 2: LAMB's trust ratios and the clipping norm need the norms of whole tensors, not of shards."""
    done = _torchrun(
        one_process,
        "run_dir=runs/2d",
        "tensor_parallel=2",
        "optimizer=lamb",
        "lr=0.01",
        "grad_clip=0.5",
        *FP64,
        ranks=4,
    )
    assert "fsdp over 2 × tensor parallel over 2" in done.stdout
    assert _difference(one_process / "runs/one-lamb", one_process / "runs/2d") < SAME_STEPS_FP64
    val_one = read_rows(one_process / "runs/one-lamb/validation.csv")[-1]
    val_2d = read_rows(one_process / "runs/2d/validation.csv")[-1]
    assert val_2d["r2"] == pytest.approx(val_one["r2"], abs=1e-9)  # the two tensor-parallel ranks count once


@pytest.mark.parametrize("optimizer", ["lars", "larc"])
def test_layerwise_optimizers_on_tensor_parallel_shards_equal_one_process(in_tmp, optimizer):
    """A trust ratio from the norm of a local shard would differ on each rank and from one process."""
    done = _single(in_tmp, "run_dir=runs/one", f"optimizer={optimizer}", "lr=0.01", *FP64)
    assert done.returncode == 0, done.stderr[-3000:]
    _torchrun(in_tmp, "run_dir=runs/tp", "tensor_parallel=2", f"optimizer={optimizer}", "lr=0.01", *FP64)
    assert _difference(in_tmp / "runs/one", in_tmp / "runs/tp") < SAME_STEPS_FP64


def test_fsdp_with_lamb_equals_one_process(one_process):
    _torchrun(
        one_process, "run_dir=runs/fsdp-lamb", "data_parallel=fsdp", "optimizer=lamb", "lr=0.01", "grad_clip=0.5", *FP64
    )
    assert _difference(one_process / "runs/one-lamb", one_process / "runs/fsdp-lamb") < SAME_STEPS_FP64


COUNT_REDUCE_SCATTERS = """
import json, os, sys
import torch.distributed as dist
from dlscale.train import train

calls = []
original = dist.reduce_scatter_single  # what FSDP2's gradient reduction calls, once per unit per backward
dist.reduce_scatter_single = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
result = train("vit-tiny", progress=False, plot=False, max_steps=2, checkpoint_every=0, data_parallel="fsdp",
               grad_accumulation=4, run_dir="runs/acc")
if os.environ["RANK"] == "0":  # one rank prints, so two ranks' lines cannot interleave (train ended the group)
    print("COUNTED " + json.dumps({"reduce_scatters": len(calls), "units": len(result.model.blocks) + 1}), flush=True)
"""


def test_fsdp_with_accumulation_reduce_scatters_only_on_the_last_micro_batch(in_tmp):
    """Four micro-batches per step, yet one reduce-scatter per FSDP unit per step: the inner ones stay local."""
    (in_tmp / "count.py").write_text(COUNT_REDUCE_SCATTERS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            "count.py",
        ],
        cwd=in_tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counted = json.loads(re.search(r"^COUNTED (\{.*?\})$", done.stdout, re.MULTILINE).group(1))
    assert counted["reduce_scatters"] == 2 * counted["units"]  # (without the skip: 4 times as many)


def test_fsdp_holds_half_the_parameter_and_optimizer_bytes_of_ddp(in_tmp):
    _torchrun(in_tmp, "run_dir=runs/ddp", "max_steps=2")
    _torchrun(in_tmp, "run_dir=runs/fsdp", "max_steps=2", "data_parallel=fsdp")
    per_rank, parallel = {}, {}
    for name in ("ddp", "fsdp"):
        summary = json.loads((in_tmp / f"runs/{name}/summary.json").read_text())
        per_rank[name] = [row["parameters"] + row["optimizer_state"] for row in summary["memory_per_rank"]]
        parallel[name] = summary["parallel"]
    whole = per_rank["ddp"][0]
    # what dlscale plan prices (#63): the whole gradient under both, and the layout
    assert (
        parallel["fsdp"]["gradient_bytes"]
        == parallel["ddp"]["gradient_bytes"]
        == 4 * count_parameters(build_model(load_config("vit-tiny")))
    )
    assert (parallel["ddp"]["data_parallel"], parallel["fsdp"]["data_parallel"]) == ("ddp", "fsdp")
    assert per_rank["ddp"] == [whole, whole]  # every DDP rank holds everything
    parameters = count_parameters(build_model(load_config("vit-tiny")))
    predicted = estimate_bytes(parameters, "adamw")  # lesson 10's formula: 4 + 8 bytes per parameter here
    assert whole == predicted["parameters"] + predicted["optimizer_state"]
    assert sum(per_rank["fsdp"]) == whole  # the shards add up to the model, nothing held twice
    assert all(0.45 < held / whole < 0.55 for held in per_rank["fsdp"])


def test_a_sharded_run_resumes_exactly_and_reshards_from_four_ranks_to_two(in_tmp):
    common = ["run_dir=runs/r", "data_parallel=fsdp", "max_steps=24", "checkpoint_every=12"]
    _torchrun(in_tmp, *common, ranks=4)
    full = read_rows(in_tmp / "runs/r/metrics.csv")
    shutil.copytree(in_tmp / "runs/r", in_tmp / "runs/r2")
    for run in ("r", "r2"):
        shutil.rmtree(checkpoint_dir(in_tmp / f"runs/{run}") / "ckpt-00000024")
        # a folder a killed job was writing: never read, replaced when that step is written again
        (checkpoint_dir(in_tmp / f"runs/{run}") / ".ckpt-00000024.tmp").mkdir()
    again = _torchrun(in_tmp, *common, "resume=true", ranks=4)
    assert "resuming from ckpt-00000012 at step 12" in again.stdout
    assert [r["loss"] for r in read_rows(in_tmp / "runs/r/metrics.csv")] == [r["loss"] for r in full]  # bit for bit
    assert not list(checkpoint_dir(in_tmp / "runs/r").glob(".ckpt-*"))
    fewer = _torchrun(in_tmp, *common[1:], "run_dir=runs/r2", "resume=true", ranks=2)
    assert "resuming from ckpt-00000012 at step 12" in fewer.stdout and "rank 0/2" in fewer.stdout
    resharded = read_rows(in_tmp / "runs/r2/metrics.csv")
    assert [r["step"] for r in resharded] == [r["step"] for r in full]
    # the same samples and weights; only the order of the sums changed
    assert [r["loss"] for r in resharded[12:]] == pytest.approx([r["loss"] for r in full[12:]], rel=1e-5)


def test_export_writes_the_whole_model_of_a_sharded_run(in_tmp):
    _torchrun(in_tmp, "run_dir=runs/tp", "tensor_parallel=2", "max_steps=6")
    done = subprocess.run(
        [sys.executable, "-m", "dlscale", "export", "runs/tp", "model.pt"],
        cwd=in_tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    exported = torch.load(in_tmp / "model.pt", weights_only=True)
    model = load_model(in_tmp / "runs/tp")
    assert exported["model"]["blocks.0.attention.wq.weight"].shape == (32, 32)  # whole, not a half
    assert all(torch.equal(exported["model"][k], v) for k, v in model.state_dict().items())
    assert exported["config"]["tensor_parallel"] == 2
