"""Beyond data parallel: the tests that launch ranks, engines or runs beside them (tests/unit/test_sharded.py
has the rest).

Starting ranks costs more on this machine than their few steps (each rank pays torch's imports, then FSDP's and
DTensor's first calls), so the trainings share launches: each launch runs a script that joins the process group
first, then calls ``train`` once per run (``train`` leaves up a group it did not start). Three launches serve the
file, each made once by a module fixture: four ranks (the 2-D run and a run to resume), two ranks (every other run,
then that run resumed on two), and four ranks again (that run resumed in a fresh launch, as a requeued job would).
The one-process references train in this process. Each test keeps its assertions, on the runs it needs: their
folders, and what each run printed.
"""

import json
import os
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
from dlscale.train import train

from ..conftest import SAME_STEPS_FP64

# float64 for the equivalence runs: honest differences are then ~1e-13 (conftest's bound is 1e-9),
# while a wrong shard, average or norm moves the weights by 1e-4 or more.
SETTINGS = {"progress": False, "plot": False, "max_steps": 12, "checkpoint_every": 6, "keep_checkpoints": 5}
FP64 = {"precision": "fp64"}
LAMB = {"optimizer": "lamb", "lr": 0.01, "grad_clip": 0.5}
LAYERWISE = ("lars", "larc")
# the run the resume test stops after its step 12 (its checkpoint of step 24 removed) and resumes
RESUMED = {**SETTINGS, "data_parallel": "fsdp", "max_steps": 24, "checkpoint_every": 12}

#: What rank 0 prints before each run, so that each run's lines can be told from the others' in the launch's output.
MARK = "=== run "

RANKS = f"""
import json, sys
import torch.distributed as dist
from dlscale import distributed
from dlscale.train import train

trainings = json.loads(sys.argv[1])  # {{run: its settings}}, trained in this order, each into runs/<run>
env = distributed.init("cpu", timeout_s=120)  # (the group outlives each run: train leaves up a group it did not start)
calls = []
# counted for every run (the accumulation test reads its run's): what FSDP2's gradient reduction calls, once per unit
# per backward
original = dist.reduce_scatter_single
dist.reduce_scatter_single = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
counted = {{}}
for run, settings in trainings.items():
    if env.is_main:
        print("{MARK}" + run, flush=True)
    calls.clear()
    result = train("vit-tiny", **settings, run_dir=f"runs/{{run}}")
    counted[run] = {{"reduce_scatters": len(calls), "units": len(result.model.blocks) + 1}}  # (rank 0's)
if env.is_main:
    open("counted.json", "w").write(json.dumps(counted))
distributed.shutdown()
"""


def _launch(folder, trainings, ranks):
    """Train ``trainings`` ({run: settings}) in one launch of ``ranks`` ranks in ``folder``; return what rank 0
    printed for each run, by run."""
    (folder / "ranks.py").write_text(RANKS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "ranks.py",
            json.dumps(trainings),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    parts = re.split(rf"^{MARK}(\S+)\n", done.stdout, flags=re.MULTILINE)
    said = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert list(said) == list(trainings), done.stdout[-2000:]
    return said


def _difference(one, other):
    """The largest difference between two runs' final weights, each read back whole in this process."""
    expected, got = load_model(one).state_dict(), load_model(other).state_dict()
    assert expected.keys() == got.keys()
    assert all(v.dtype == torch.float64 for v in got.values())
    return max(float((expected[k] - got[k]).abs().max()) for k in expected)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process, in this process (no launch to pay for): the references, AdamW, LAMB with clipping (which differs
    from AdamW's), LARS and LARC. Its folder is every launch's, whose ranks then find the synthetic maps written."""
    folder = tmp_path_factory.mktemp("sharded")
    here = os.getcwd()
    os.chdir(folder)
    try:
        train("vit-tiny", **SETTINGS, **FP64, run_dir="runs/one-adamw")
        train("vit-tiny", **SETTINGS, **FP64, **LAMB, run_dir="runs/one-lamb")
        for optimizer in LAYERWISE:
            train("vit-tiny", **SETTINGS, **FP64, optimizer=optimizer, lr=0.01, run_dir=f"runs/one-{optimizer}")
    finally:
        os.chdir(here)
    assert _difference(folder / "runs/one-adamw", folder / "runs/one-lamb") > 1e-3
    return folder


@pytest.fixture(scope="module")
def four_ranks(one_process):
    """Four ranks: DP 2 × TP 2 with LAMB, and a sharded run of 24 steps, which then loses its checkpoint of step 24
    (and is copied, for two ranks to reshard) for the resume test. Returns what the 2-D run printed and the rows of
    the uninterrupted run, before a resume rewrites them."""
    folder = one_process
    said = _launch(folder, {"2d": {**SETTINGS, **FP64, **LAMB, "tensor_parallel": 2}, "r": RESUMED}, ranks=4)
    full = read_rows(folder / "runs/r/metrics.csv")
    shutil.copytree(folder / "runs/r", folder / "runs/r2")
    for run in ("r", "r2"):
        shutil.rmtree(checkpoint_dir(folder / f"runs/{run}") / "ckpt-00000024")
        # a folder a killed job was writing: never read, replaced when that step is written again
        (checkpoint_dir(folder / f"runs/{run}") / ".ckpt-00000024.tmp").mkdir()
    return {"2d": said["2d"], "full": full}


@pytest.fixture(scope="module")
def resumed_on_four_ranks(one_process, four_ranks):
    """The four ranks' run resumed by four ranks in a fresh launch, as a requeued job would (a launch of its own:
    nothing the first launch's processes held can help); what it printed. (Its own fixture, so that the first test's
    setup does not pay for every launch.)"""
    return _launch(one_process, {"r": {**RESUMED, "resume": True}}, ranks=4)["r"]


@pytest.fixture(scope="module")
def two_ranks(one_process, four_ranks):
    """Two ranks, one launch: every two-rank run of the file, then the copy of the four ranks' run resumed on two
    (last, so that it resumes in ranks that have not trained it). Returns what each run printed and rank 0's
    reduce-scatter counts."""
    folder = one_process
    trainings = {
        "fsdp": {**SETTINGS, **FP64, "data_parallel": "fsdp"},
        "tp": {**SETTINGS, **FP64, "tensor_parallel": 2},
        **{
            f"tp-{name}": {**SETTINGS, **FP64, "tensor_parallel": 2, "optimizer": name, "lr": 0.01}
            for name in LAYERWISE
        },
        "fsdp-lamb": {**SETTINGS, **FP64, **LAMB, "data_parallel": "fsdp"},
        "acc": {**SETTINGS, "max_steps": 2, "checkpoint_every": 0, "data_parallel": "fsdp", "grad_accumulation": 4},
        "ddp-bytes": {**SETTINGS, "max_steps": 2},
        "fsdp-bytes": {**SETTINGS, "max_steps": 2, "data_parallel": "fsdp"},
        "tp-export": {**SETTINGS, "tensor_parallel": 2, "max_steps": 6},
        # (a set of its own, with one validation map: 64 training maps are enough for its 2 steps, and quicker made)
        "no-val-map": {**SETTINGS, "train_samples": 64, "val_samples": 1, "max_steps": 2, "checkpoint_every": 0},
        "r2": {**RESUMED, "resume": True},
    }
    said = _launch(folder, trainings, ranks=2)
    return said, json.loads((folder / "counted.json").read_text())


def test_a_rank_with_no_validation_map_does_not_leave_the_others_waiting(two_ranks):
    """One map to validate on and two ranks: rank 1's share is empty, and it used to skip the reduction that rank 0
    then waited in until dist_timeout_s (then the job failed; here the launch fails after the group's 120 s)."""
    said, _ = two_ranks
    assert "validation: mse" in said["no-val-map"]


def test_fsdp_on_two_ranks_equals_one_process_and_writes_a_sharded_checkpoint(one_process, two_ranks):
    said, _ = two_ranks
    assert "(fsdp)" in said["fsdp"]
    assert _difference(one_process / "runs/one-adamw", one_process / "runs/fsdp") < SAME_STEPS_FP64
    newest = list_checkpoints(one_process / "runs/fsdp")[-1]
    assert newest.is_dir() and sorted(p.name for p in newest.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    summary = json.loads((one_process / "runs/fsdp/summary.json").read_text())
    assert summary["applied"]["fsdp"] and summary["applied"]["data_parallel_ranks"] == 2


def test_tensor_parallel_on_two_ranks_equals_one_process(one_process, two_ranks):
    said, _ = two_ranks
    assert "tensor parallel over 2" in said["tp"]
    assert _difference(one_process / "runs/one-adamw", one_process / "runs/tp") < SAME_STEPS_FP64


def test_fsdp_times_tensor_parallel_with_lamb_and_clipping_equals_one_process(one_process, four_ranks):
    """DP 2 × TP 2: LAMB's trust ratios and the clipping norm need the norms of whole tensors, not of shards."""
    assert "fsdp over 2 × tensor parallel over 2" in four_ranks["2d"]
    assert _difference(one_process / "runs/one-lamb", one_process / "runs/2d") < SAME_STEPS_FP64
    val_one = read_rows(one_process / "runs/one-lamb/validation.csv")[-1]
    val_2d = read_rows(one_process / "runs/2d/validation.csv")[-1]
    assert val_2d["r2"] == pytest.approx(val_one["r2"], abs=1e-9)  # the two tensor-parallel ranks count once


@pytest.mark.parametrize("optimizer", LAYERWISE)
def test_layerwise_optimizers_on_tensor_parallel_shards_equal_one_process(one_process, two_ranks, optimizer):
    """A trust ratio from the norm of a local shard would differ on each rank and from one process."""
    assert _difference(one_process / f"runs/one-{optimizer}", one_process / f"runs/tp-{optimizer}") < SAME_STEPS_FP64


def test_fsdp_with_lamb_equals_one_process(one_process, two_ranks):
    assert _difference(one_process / "runs/one-lamb", one_process / "runs/fsdp-lamb") < SAME_STEPS_FP64


def test_fsdp_with_accumulation_reduce_scatters_only_on_the_last_micro_batch(two_ranks):
    """Four micro-batches per step, yet one reduce-scatter per FSDP unit per step: the inner ones stay local."""
    _, counted = two_ranks
    assert counted["acc"]["reduce_scatters"] == 2 * counted["acc"]["units"]  # (without the skip: 4 times as many)


def test_fsdp_holds_half_the_parameter_and_optimizer_bytes_of_ddp(one_process, two_ranks):
    per_rank, parallel = {}, {}
    for name in ("ddp", "fsdp"):
        summary = json.loads((one_process / f"runs/{name}-bytes/summary.json").read_text())
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


def test_a_sharded_run_resumes_exactly_and_reshards_from_four_ranks_to_two(
    one_process, four_ranks, resumed_on_four_ranks, two_ranks
):
    full = four_ranks["full"]  # the uninterrupted run's rows, read before the resume rewrote them
    assert "resuming from ckpt-00000012 at step 12" in resumed_on_four_ranks
    assert [r["loss"] for r in read_rows(one_process / "runs/r/metrics.csv")] == [
        r["loss"] for r in full
    ]  # bit for bit
    assert not list(checkpoint_dir(one_process / "runs/r").glob(".ckpt-*"))
    fewer = two_ranks[0]["r2"]
    assert "resuming from ckpt-00000012 at step 12" in fewer and "rank 0/2" in fewer
    resharded = read_rows(one_process / "runs/r2/metrics.csv")
    assert [r["step"] for r in resharded] == [r["step"] for r in full]
    # the same samples and weights; only the order of the sums changed
    assert [r["loss"] for r in resharded[12:]] == pytest.approx([r["loss"] for r in full[12:]], rel=1e-5)


def test_export_writes_the_whole_model_of_a_sharded_run(one_process, two_ranks):
    done = subprocess.run(
        [sys.executable, "-m", "dlscale", "export", "runs/tp-export", "model.pt"],
        cwd=one_process,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    exported = torch.load(one_process / "model.pt", weights_only=True)
    model = load_model(one_process / "runs/tp-export")
    assert exported["model"]["blocks.0.attention.wq.weight"].shape == (32, 32)  # whole, not a half
    assert all(torch.equal(exported["model"][k], v) for k, v in model.state_dict().items())
    assert exported["config"]["tensor_parallel"] == 2
