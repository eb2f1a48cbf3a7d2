"""Pipeline parallelism and the 3-D mesh: ranks under torchrun against one process, in float64
(tests/unit/test_pipeline.py has the config's checks and the stages in one process).

Each launch runs several trainings in the same ranks (a script that joins the process group first, so that each
``train`` leaves it up for the next): starting ranks costs more on this machine than their few steps.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from dlscale.bench.pipeline import COLUMNS, format_pipeline
from dlscale.checkpoint import checkpoint_dir, load_model
from dlscale.distributed import free_port
from dlscale.train import train

from ..conftest import SAME_STEPS_FP64

# Two steps of the tiny ViT, four blocks deep (two stages of two blocks, or four of one), in float64: honest
# differences are ~1e-15, while a wrong micro-batch scale, stage order, shard or resumed state moves the weights by
# 1e-4 or more. A checkpoint after each step: the reshard tests resume from the first.
SETTINGS = {
    "progress": False,
    "plot": False,
    "precision": "fp64",
    "depth": 4,
    "train_samples": 256,
    "val_samples": 16,
    "max_steps": 2,
    "checkpoint_every": 1,
    "keep_checkpoints": 5,
    "dist_timeout_s": 120,
}


def _reference(folder):
    """The one-process run every layout is held to, in this process (no launch to pay for), from ``folder`` (its
    synthetic maps are written to ``folder/data``, where the ranks then find them)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        train("vit-tiny", **SETTINGS, run_dir="runs/one")
    finally:
        os.chdir(here)
    return folder / "runs/one"


def _difference(one, other):
    """The largest difference between two runs' final weights, each read back whole in this process."""
    expected, got = load_model(one).state_dict(), load_model(other).state_dict()
    assert expected.keys() == got.keys()
    assert all(v.dtype == torch.float64 for v in got.values())
    return max(float((expected[k] - got[k]).abs().max()) for k in expected)


def _launch(folder, script, ranks):
    (folder / "ranks.py").write_text(script)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "ranks.py",
            json.dumps(SETTINGS),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


TWO_STAGES = """
import json, shutil, sys
from dlscale import distributed
from dlscale.checkpoint import checkpoint_dir
from dlscale.bench.pipeline import measure_pipeline
from dlscale.config import load_config
from dlscale.train import train

settings = json.loads(sys.argv[1])
env = distributed.init("cpu", timeout_s=120)  # (the group outlives each run: train leaves up a group it did not start)
train("vit-tiny", **settings, run_dir="runs/gpipe", pipeline_parallel=2, pipeline_schedule="gpipe",
      pipeline_microbatches=2)
train("vit-tiny", **settings, run_dir="runs/1f1b", pipeline_parallel=2, pipeline_schedule="1f1b",
      pipeline_microbatches=4)
interleaved = dict(pipeline_parallel=2, pipeline_schedule="interleaved-1f1b", pipeline_microbatches=2,
                   pipeline_virtual_stages=2)
train("vit-tiny", **settings, run_dir="runs/interleaved", **interleaved)
if env.is_main:  # the interleaved run as it was after its first step, resumed on the same pipeline (a requeued job)
    shutil.copytree("runs/interleaved", "runs/resumed")
    shutil.rmtree(checkpoint_dir("runs/resumed") / "ckpt-00000002")
distributed.barrier()
train("vit-tiny", **settings, run_dir="runs/resumed", resume=True, **interleaved)
# the bubble measured in the same ranks (what dlscale.bench.pipeline.bench_pipeline starts ranks to run)
rows = measure_pipeline(load_config("vit-tiny", {"depth": 4}), ("gpipe", "1f1b"), (2, 4), steps=1)
if env.is_main:
    open("rows.json", "w").write(json.dumps(rows))
distributed.shutdown()
"""


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    """One process, then two ranks: three pipelined runs (GPipe, 1F1B, interleaved 1F1B) and the bubble's rows."""
    folder = tmp_path_factory.mktemp("pipeline")
    one = _reference(folder)
    return folder, one, _launch(folder, TWO_STAGES, ranks=2)


def test_two_stages_equal_one_process_with_gpipe_1f1b_and_interleaved_1f1b_and_resume_on_the_pipeline(two_stages):
    in_tmp, one, out = two_stages
    assert out.count("(pipeline of 2 stages)") == 4  # (three schedules, then the resumed run)
    for run in ("gpipe", "1f1b", "interleaved"):
        assert _difference(one, in_tmp / f"runs/{run}") < SAME_STEPS_FP64, run
    # every rank wrote its stage's part of the checkpoint, under the whole model's names (load_model read it whole)
    assert sorted(p.name for p in (checkpoint_dir(in_tmp / "runs/1f1b") / "ckpt-00000002").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    # resumed from its step-1 checkpoint on the same two ranks, each stage finds its own optimizer settings and state
    assert "resuming from ckpt-00000001 at step 1" in out
    assert _difference(one, in_tmp / "runs/resumed") < SAME_STEPS_FP64
    summary = json.loads((in_tmp / "runs/interleaved/summary.json").read_text())
    assert summary["applied"]["pipeline_schedule"] == "interleaved-1f1b"
    assert (
        summary["parallel"]["gradient_bytes"]
        == json.loads((one / "summary.json").read_text())["parallel"]["gradient_bytes"]
    )  # (the whole model's, gathered from both stages)


THREE_D = """
import json, shutil, sys
from dlscale import distributed
from dlscale.checkpoint import checkpoint_dir
from dlscale.train import train

settings = json.loads(sys.argv[1])
env = distributed.init("cpu", timeout_s=120)
train("vit-tiny", **settings, run_dir="runs/3d", pipeline_parallel=2, tensor_parallel=2, pipeline_microbatches=2)
if env.rank == 0:  # two copies of the 3-D run as it was after its first step
    for layout in ("1d", "2d"):
        shutil.copytree("runs/3d", f"runs/{layout}")
        shutil.rmtree(checkpoint_dir(f"runs/{layout}") / "ckpt-00000002")
distributed.barrier()
train("vit-tiny", **settings, run_dir="runs/1d", resume=True, data_parallel="fsdp")  # FSDP over 8
train("vit-tiny", **settings, run_dir="runs/2d", resume=True, tensor_parallel=2)  # FSDP 4 x TP 2
distributed.shutdown()
"""


@pytest.mark.slow  # (8 ranks: each pays torch's imports, FSDP's and DTensor's first calls; ~90 s on 2 cores)
def test_data_tensor_pipeline_on_8_ranks_equals_one_process_and_resumes_on_1d_and_2d(in_tmp):
    """2 × 2 × 2 from the meta device; its sharded checkpoint of step 1 resumed on a 1-D and a 2-D mesh of the same
    8 ranks (each rank then reads other shards than it wrote) reaches one process's step 2."""
    one = _reference(in_tmp)
    out = _launch(in_tmp, THREE_D, ranks=8)
    assert "(fsdp over 2 × tensor parallel over 2 × pipeline of 2 stages)" in out
    assert _difference(one, in_tmp / "runs/3d") < SAME_STEPS_FP64
    written = checkpoint_dir(in_tmp / "runs/3d") / "ckpt-00000001"
    assert len(list(written.glob("*.distcp"))) == 8
    resumed = [line for line in out.splitlines() if "resuming from ckpt-00000001 at step 1" in line]
    assert len(resumed) == 2 and "(fsdp)," in resumed[0] and "(fsdp over 4 × tensor parallel over 2)," in resumed[1]
    for layout in ("1d", "2d"):
        assert _difference(one, in_tmp / f"runs/{layout}") < SAME_STEPS_FP64, layout


def test_the_bubble_rows_each_stage_against_the_textbook_and_1f1b_holds_fewer_activations(two_stages):
    rows = json.loads((two_stages[0] / "rows.json").read_text())
    assert [(r["schedule"], r["microbatches"], r["stage"]) for r in rows] == [
        (schedule, m, stage) for schedule in ("gpipe", "1f1b") for m in (2, 4) for stage in (0, 1)
    ]
    assert all(tuple(r) == COLUMNS for r in rows)
    assert all(r["textbook_bubble"] == 1 / (r["microbatches"] + 1) for r in rows)  # (p - 1) / (m + p - 1), p = 2
    assert all(0 <= r["idle_share"] < 1 and 0 < r["busy_ms"] <= r["step_ms"] for r in rows)
    peak = {(r["schedule"], r["microbatches"], r["stage"]): r["peak_activation_bytes"] for r in rows}
    # GPipe holds every micro-batch's activations before its first backward: the batch's, whatever m; 1F1B holds at
    # most p micro-batches' on the first stage and one on the last
    assert abs(peak["gpipe", 4, 0] - peak["gpipe", 2, 0]) < 0.1 * peak["gpipe", 2, 0]
    assert 0.4 < peak["1f1b", 4, 0] / peak["gpipe", 4, 0] < 0.6
    assert 0.2 < peak["1f1b", 4, 1] / peak["gpipe", 4, 1] < 0.3
    assert len(format_pipeline(rows).splitlines()) == 2 + len(rows)
