"""The plain-PyTorch recipe: the tests that launch ranks, engines or runs beside them (tests/unit/test_recipes.py
has the rest)."""

import os
import re
import runpy

import pytest

from dlscale.jobs.notebook_engines import run_file, run_on_engines, stop_engines
from dlscale.lessons.parity import engine_twin, largest_loss_gap
from dlscale.lessons.recipe_folder import RECIPES
from dlscale.lessons.stage_check import check_gaps, check_stage
from dlscale.lessons.stage_measure import run_rank
from dlscale.lessons.stage_probes import run_stage, small_config
from dlscale.lessons.stage_record import Variant
from dlscale.lessons.stages import stage_record
from tests.unit.test_recipes import _solution
from tests.unit.test_stage_gaps import variant_source

#: Loss difference allowed between a stage and the engine (see the module's docstring).
TOLERANCE = 1e-6


def _folder(tmp_path_factory, name):
    folder, before = tmp_path_factory.mktemp(name), os.getcwd()
    os.chdir(folder)
    yield folder
    stop_engines()  # (the engines started there: kept for the folder's next test, not for the session's end)
    os.chdir(before)


@pytest.fixture(scope="module")
def ranks_folder(tmp_path_factory):
    """One folder for the stages' two-rank runs: the engines started there serve each of them (seconds each)."""
    yield from _folder(tmp_path_factory, "recipes")


@pytest.fixture(scope="module")
def checks_folder(tmp_path_factory):
    """Engines of their own for the exercise checks, as an exercise notebook (its own kernel) starts them."""
    yield from _folder(tmp_path_factory, "checks")


def _assert_equal_runs(recipe: dict, engine: dict) -> None:
    assert largest_loss_gap(recipe["losses"], engine["losses"]) <= TOLERANCE
    assert recipe["r2"] == pytest.approx(engine["r2"], abs=TOLERANCE)


@pytest.mark.parametrize(
    "stage, arguments",
    [
        ("01_baseline.py", {}),
        ("02_data_loading.py", {"workers": 1}),
        ("03_mixed_precision.py", {"precision": "fp16", "workers": 0}),  # the scaler, and clipping after unscaling
        ("04_compile.py", {"precision": "fp32", "workers": 0}),  # channels-last and torch.compile
    ],
)
def test_single_process_stage_trains_as_the_engine(stage, arguments, in_tmp):
    arguments = {"epochs": 1, "device": "cpu", **arguments}
    recipe = runpy.run_path(str(RECIPES / stage), run_name="recipe")["main"](**arguments)
    _assert_equal_runs(recipe, engine_twin(stage, **arguments))


@pytest.mark.parametrize(
    "stage, arguments",
    [
        ("05_ddp.py", {"precision": "fp32"}),
        ("07_large_batch.py", {"batch_size": 64, "scaling": "sqrt", "optimizer_name": "lamb"}),  # bf16 autocast too
        ("10_fsdp_tp.py", {"precision": "bf16"}),  # FSDP2 with its mixed-precision policy
        ("10_fsdp_tp.py", {"precision": "fp32", "tp": 2}),  # tensor parallel on a (1 x 2) mesh
    ],
)
def test_distributed_stage_on_two_ranks_trains_as_the_engine(stage, arguments, ranks_folder):
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, **arguments}
    if stage != "10_fsdp_tp.py":
        arguments["compile"] = False  # (stage 04's test compiles; here the ranks and their reductions)
    recipe = run_on_engines(run_stage, 2, str(RECIPES / stage), **arguments)  # (watched, as a lesson runs it)
    assert recipe[0]["losses"] == recipe[1]["losses"], "the ranks logged different losses: not all-reduced"
    for rank in recipe:
        check_gaps(stage, rank)  # every probe passes ours on two ranks (the sampler's shares, the split plan)
    engine = run_on_engines(engine_twin, 2, stage, **arguments)
    _assert_equal_runs(recipe[0], engine[0])


def test_a_tensor_parallel_split_taken_out_is_named_on_two_ranks(ranks_folder):
    """Gap 10.b does nothing with tp=1, so tests/unit/test_stage_gaps.py cannot show it: here with tp=2."""
    from dlscale.lessons.stage_record import Variant
    from tests.unit.test_stage_gaps import variant_source

    taken_out = Variant("the split taken out", (('parallelize_module(block, mesh["tp"], split)', "pass"),))
    (ranks_folder / "mutant_10_b.py").write_text(variant_source("10_fsdp_tp.py", taken_out))
    ranks = run_on_engines(
        run_stage,
        2,
        str(ranks_folder / "mutant_10_b.py"),
        epochs=1,
        device="cpu",
        workers=0,
        precision="fp32",
        tp=2,
        checkpoint="mutant-10b",
    )
    with pytest.raises(AssertionError, match=r"^TODO 10\.b .*tp=2, but no block was split"):
        check_gaps("10_fsdp_tp.py", ranks[0])


def test_a_rank_numbered_by_its_node_is_named_as_on_two_nodes(ranks_folder):
    """On one host a rank's number on its node equals its number in the job; the check runs CPU ranks as on a node
    each, so `rank=local_rank` in the group and in the sampler is named (on rank 1), and the job does not hang."""
    from dlscale.lessons.stage_record import Variant
    from tests.unit.test_stage_gaps import variant_source

    group = "rank=rank, world_size=world_size,"
    by_node = Variant("numbered by the node", ((group, "rank=local_rank, world_size=world_size,"),))
    (ranks_folder / "by_node.py").write_text(variant_source("05_ddp.py", by_node))
    settings = {"epochs": 1, "device": "cpu", "workers": 0, "precision": "fp32", "compile": False}
    ranks = run_on_engines(run_stage, 2, str(ranks_folder / "by_node.py"), checkpoint="by-node", **settings)
    with pytest.raises(
        AssertionError, match=r"^TODO 05\.b .*joined as rank 0, but its launcher made it rank 1.*rank 1"
    ):
        check_stage("05_ddp.py", ranks, None)


@pytest.mark.parametrize(
    "stage, arguments",
    [
        ("10_fsdp_tp.py", {"precision": "fp32"}),
        # two stages per rank: each rank saves and finds its own stages' weights, moments and optimizer settings
        ("13_pipeline.py", {"schedule": "interleaved-1f1b", "stages_per_rank": 2, "tiny_samples": 128}),
    ],
)
def test_sharded_stage_resumes_from_its_dcp_checkpoint_exactly(stage, arguments, ranks_folder):
    """Epoch 1, then a second run that loads every rank's shards and trains epoch 2: the losses of one run of 2. Each
    run on one torch thread per rank (left to the stage, a run beside a busy moment takes fewer: other rounding)."""
    recipe = str(RECIPES / stage)
    common = {"device": "cpu", "workers": 0, **arguments}
    if "tiny_samples" in common:  # (fewer maps: the resume is exact at any size)
        common["config"] = small_config("tiny", common.pop("tiny_samples"))

    def run(checkpoint: str, **more) -> dict:
        return run_on_engines(run_rank, 2, recipe, {**common, **more, "checkpoint": checkpoint}, 1)[0]

    straight = run(f"straight{stage[:2]}", epochs=2)
    run(f"interrupted{stage[:2]}", epochs=1)
    resumed = run(f"interrupted{stage[:2]}", epochs=2, resume=True)
    second_epoch = straight["losses"][len(straight["losses"]) // 2 :]
    assert resumed["losses"] == second_epoch and resumed["r2"] == straight["r2"][1:]


def test_horovod_stage_trains_as_the_engine(in_tmp):
    from dlscale.distributed import horovod_backend

    if not horovod_backend.available():
        pytest.skip("Horovod is not built (make horovod)")
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, "precision": "fp32", "compile": False}
    recipe = horovod_backend.run(run_file, 2, str(RECIPES / "06_horovod.py"), **arguments)
    engine = horovod_backend.run(engine_twin, 2, "06_horovod.py", **arguments)
    _assert_equal_runs(recipe[0], engine[0])


DATA_PARALLEL_MISTAKES = {
    "no set_epoch": (("        sampler.set_epoch(epoch)\n", "        pass\n"), "call sampler.set_epoch"),
    "loss not all-reduced": (
        (
            "            dist.all_reduce(logged)\n            losses.append(logged.item() / world_size)",
            "            losses.append(logged.item())",
        ),
        "the metrics are not all-reduced",
    ),
    "padded shares": (("seed=0, drop_last=True)", "seed=0, drop_last=False)"), "share size is wrong"),
    "every rank writes": (
        ("        if rank == 0:\n            torch.save(", "        if True:\n            torch.save("),
        r"written by rank\(s\) \[0, 1\]",
    ),
}


def test_data_parallel_check_passes_the_solution(checks_folder):
    from dlscale.lessons.lesson05 import check_data_parallel_loop

    check_data_parallel_loop(_solution("05_data_parallel.ipynb", "train_data_parallel"))


@pytest.mark.parametrize("mistake", sorted(DATA_PARALLEL_MISTAKES))
def test_data_parallel_check_names_the_mistake(mistake, checks_folder):
    from dlscale.lessons.lesson05 import check_data_parallel_loop

    change, message = DATA_PARALLEL_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_data_parallel_loop(_solution("05_data_parallel.ipynb", "train_data_parallel", change))


FSDP_MISTAKES = {
    "blocks only": (("    fully_shard(model, mesh=mesh)\n", "    pass\n"), "the root is not sharded"),
    "root only": (
        ("    for block in model.blocks:\n        fully_shard(block, mesh=mesh)\n", ""),
        "the blocks are not FSDP units",
    ),
}


@pytest.mark.parametrize("mistake", [None, *sorted(FSDP_MISTAKES)])
def test_fsdp_check_passes_the_solution_and_names_each_mistake(mistake, checks_folder):
    from dlscale.lessons.lesson10 import check_fsdp_sharding

    if mistake is None:
        return check_fsdp_sharding(_solution("10_sharded_and_model_parallel.ipynb", "shard"))
    change, message = FSDP_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_fsdp_sharding(_solution("10_sharded_and_model_parallel.ipynb", "shard", change))


def test_a_resumed_data_parallel_stage_equals_an_uninterrupted_one(ranks_folder):
    recipe = str(RECIPES / "05_ddp.py")
    common = {"device": "cpu", "workers": 0, "precision": "fp32", "compile": False}
    straight = run_on_engines(run_file, 2, recipe, epochs=2, checkpoint="straight05.pt", **common)[0]
    run_on_engines(run_file, 2, recipe, epochs=1, checkpoint="cut05.pt", **common)
    resumed = run_on_engines(run_file, 2, recipe, epochs=2, resume=True, checkpoint="cut05.pt", **common)[0]
    assert resumed["losses"] == straight["losses"][len(straight["losses"]) // 2 :]
    assert resumed["r2"] == straight["r2"][1:]


def test_accumulated_micro_batches_train_as_the_engine_does(ranks_folder):
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, "precision": "fp32", "compile": False, "accumulate": 2}
    recipe = run_on_engines(run_file, 2, str(RECIPES / "05_ddp.py"), **arguments)
    engine = run_on_engines(engine_twin, 2, "05_ddp.py", **arguments)
    _assert_equal_runs(recipe[0], engine[0])


UNEVEN_VALIDATION = """
import datetime, os, runpy
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from dlscale.models import ViTRegressor

def main(recipe):
    r2_score = runpy.run_path(recipe, run_name="recipe")["r2_score"]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    x, y = torch.randn(40, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.randn(40, 3)
    whole = ViTRegressor(image_size=8, width=16, depth=2, heads=2)
    with torch.device("meta"):
        model = ViTRegressor(image_size=8, width=16, depth=2, heads=2)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    model.init_weights(0)
    share = slice(0, 30) if rank == 0 else slice(30, 40)  # rank 0: 4 batches of 8, rank 1: 2
    sharded = r2_score(model, DataLoader(TensorDataset(x[share], y[share]), batch_size=8), torch.device("cpu"))
    with torch.no_grad():
        error = ((whole(x).double() - y.double()) ** 2).sum(0)
    reference = float((1 - error / ((y.double() - y.double().mean(0)) ** 2).sum(0)).mean())
    dist.destroy_process_group()
    return sharded, reference
"""


def test_sharded_validation_over_uneven_shares_ends_and_counts_every_map_once(ranks_folder, tmp_path):
    """Rank 0 has 4 validation batches, rank 1 has 2: FSDP's gathers need both ranks in each forward pass."""
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN_VALIDATION)
    results = run_on_engines(run_file, 2, str(script), recipe=str(RECIPES / "10_fsdp_tp.py"), timeout=120)
    for sharded, reference in results:
        assert sharded == pytest.approx(reference, abs=1e-6)


def test_a_rank_killed_under_torchrun_ends_the_job_within_seconds(in_tmp):
    """torchrun's agent sees a rank die and stops the others: nobody waits for the collective timeout.
    (Under srun the job scripts ask for the same with --kill-on-bad-exit=1.)"""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(RECIPES / "05_ddp.py"),
        "--device",
        "cpu",
        "--workers",
        "0",
        "--no-compile",
        "--precision",
        "fp32",
        "--epochs",
        "200",
        "--log-every",
        "4",
    ]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in job.stdout:  # both ranks are in the training loop once a block is logged
            if "samples/s" in line:
                break
        ranks = [p for p in psutil.Process(job.pid).children(recursive=True) if "05_ddp.py" in " ".join(p.cmdline())]
        victim = next(p for p in ranks if p.environ().get("LOCAL_RANK") == "1")
        victim.kill()
        killed = time.monotonic()
        output, _ = job.communicate(timeout=120)
        ended = time.monotonic() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    assert ended < 30, f"the job took {ended:.1f} s to end after a rank died"
    print(f"the job ended {ended:.1f} s after rank 1 was killed")
    assert "ChildFailedError" in output or "failed" in output.lower()


# -- the pipeline stage: its gaps show on two ranks (a pipeline of one stage sends nothing) ----------------------------

_PIPELINE = stage_record("13_pipeline.py")
_PIPELINE_TWINS: dict[tuple, dict] = {}


@pytest.mark.parametrize(
    ("gap_id", "kind", "variant"),
    [pytest.param(None, "right", Variant("ours", ()), id="13-ours")]
    + [
        pytest.param(gap.id, kind, variant, id=f"{gap.id}-{kind}-{variant.what.replace(' ', '_')}")
        for gap in _PIPELINE.gaps
        for kind, variants in (("wrong", gap.mistakes), ("right", gap.alternatives))
        for variant in variants
    ],
)
def test_what_attendees_write_in_the_pipeline_stage_is_judged_on_two_ranks(gap_id, kind, variant, ranks_folder):
    """Our stage and each variant on the module's two engines, with its switch runs, as lesson 13 runs it (4 steps):
    a wrong one named by its one gap (the stage built wrong named before the step that fails on it), a right one
    passing with the engine's losses on every rank; ours too."""
    path = ranks_folder / f"variant_13_{variant.what.replace(' ', '_')}.py"
    path.write_text(variant_source(_PIPELINE.file, variant))
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, "config": small_config("tiny", 128), **variant.settings}
    ranks = run_on_engines(run_stage, 2, str(path), timeout=300, **arguments)
    key = tuple(sorted(variant.settings.items()))
    if key not in _PIPELINE_TWINS:
        _PIPELINE_TWINS[key] = run_on_engines(engine_twin, 2, _PIPELINE.file, timeout=300, **arguments)[0]
    if kind == "right":
        assert ranks[0]["losses"] == ranks[1]["losses"], "the ranks logged different losses"
        check_stage(_PIPELINE.file, ranks, _PIPELINE_TWINS[key])
        return
    with pytest.raises(AssertionError) as caught:
        check_stage(_PIPELINE.file, ranks, _PIPELINE_TWINS[key])
    message = str(caught.value)
    assert "\n" not in message, message
    if variant.names == "outside":  # (a line of ours failed on it: the verdict names the changed line)
        assert "outside the gaps" in message and "TODO " not in message, message
    else:
        assert re.findall(r"TODO (\d\d\.[a-z])", message) == [gap_id], message
