"""The plain-PyTorch recipe: its files are the lessons' cells, and every stage trains as the engine does.

The engine (``dlscale.train``) is the reference. With the settings :func:`engine_settings` gives,
a stage and the engine run the same kernels in the same order on a CPU, so their losses agree to
the last bit here; the tests allow 1e-6, room for AdamW's multi-tensor update (the engine's)
against the per-tensor one (the recipe's on a CPU), which may add in another order elsewhere. The
validation R² gets the same room: on PyPI's CUDA build of torch 2.13 running on a CPU (Python 3.13),
stage 01's sixth loss differed from the engine's by one float32 ulp, and its R² by 1.3e-8.
"""

import json
import os
import runpy

import pytest

from dlscale.cluster.notebook_engines import run_file, run_on_engines
from dlscale.lessons.recipes import RECIPES, RecipeError, engine_twin, largest_loss_gap, recipe_cells, write_recipes

from .conftest import ROOT

#: Loss difference allowed between a stage and the engine (see the module's docstring).
TOLERANCE = 1e-6


def _folder(tmp_path_factory, name):
    folder, before = tmp_path_factory.mktemp(name), os.getcwd()
    os.chdir(folder)
    yield folder
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


def test_recipe_files_are_the_lessons_cells(tmp_path):
    assert write_recipes(ROOT / "notebooks", RECIPES, check=True) == [], "recipes/ is out of date: run dlscale recipes"
    assert sorted(recipe_cells(ROOT / "notebooks")) == ["01_baseline.py", "02_data_loading.py",
                                                          "03_mixed_precision.py", "04_compile.py", "05_ddp.py",
                                                          "07_large_batch.py", "10_fsdp_tp.py"]
    # an edited cell makes its file out of date, and the generator rewrites it
    lesson = json.loads((ROOT / "notebooks" / "01_single_device_baseline.ipynb").read_text())
    cell = next(c for c in lesson["cells"] if "recipe" in c["metadata"].get("tags", []))
    cell["source"].append("\n# an attendee's change\n")
    (tmp_path / "01.ipynb").write_text(json.dumps(lesson))
    (tmp_path / "recipes").mkdir()
    assert write_recipes(tmp_path, tmp_path / "recipes") == [tmp_path / "recipes" / "01_baseline.py"]
    assert "# an attendee's change" in (tmp_path / "recipes" / "01_baseline.py").read_text()
    assert write_recipes(tmp_path, tmp_path / "recipes", check=True) == []
    cell["source"][0] = "# 01_baseline.py\n"  # a recipe cell must name its file
    (tmp_path / "01.ipynb").write_text(json.dumps(lesson))
    with pytest.raises(RecipeError, match="must start with '# recipes/NAME.py'"):
        write_recipes(tmp_path, tmp_path / "recipes")


@pytest.mark.parametrize("stage, arguments", [
    ("01_baseline.py", {}),
    ("02_data_loading.py", {"workers": 1}),
    ("03_mixed_precision.py", {"precision": "fp16", "workers": 0}),  # the scaler, and clipping after unscaling
    ("04_compile.py", {"precision": "fp32", "workers": 0}),          # channels-last and torch.compile
])
def test_single_process_stage_trains_as_the_engine(stage, arguments, in_tmp):
    arguments = {"epochs": 1, "device": "cpu", **arguments}
    recipe = runpy.run_path(str(RECIPES / stage), run_name="recipe")["main"](**arguments)
    _assert_equal_runs(recipe, engine_twin(stage, **arguments))


@pytest.mark.parametrize("stage, arguments", [
    ("05_ddp.py", {"precision": "fp32"}),
    ("07_large_batch.py", {"batch_size": 64, "scaling": "sqrt", "optimizer_name": "lamb"}),  # bf16 autocast too
    ("10_fsdp_tp.py", {"precision": "bf16"}),  # FSDP2 with its mixed-precision policy
    ("10_fsdp_tp.py", {"precision": "fp32", "tp": 2}),  # tensor parallel on a (1 x 2) mesh
])
def test_distributed_stage_on_two_ranks_trains_as_the_engine(stage, arguments, ranks_folder):
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, **arguments}
    if stage != "10_fsdp_tp.py":
        arguments["compile"] = False  # (stage 04's test compiles; here the ranks and their reductions)
    recipe = run_on_engines(run_file, 2, str(RECIPES / stage), **arguments)
    assert recipe[0]["losses"] == recipe[1]["losses"], "the ranks logged different losses: not all-reduced"
    engine = run_on_engines(engine_twin, 2, stage, **arguments)
    _assert_equal_runs(recipe[0], engine[0])


def test_sharded_stage_resumes_from_its_dcp_checkpoint_exactly(ranks_folder):
    """Epoch 1, then a second run that loads every rank's shards and trains epoch 2: the losses of one run of 2."""
    recipe = str(RECIPES / "10_fsdp_tp.py")
    common = {"device": "cpu", "workers": 0, "precision": "fp32"}
    straight = run_on_engines(run_file, 2, recipe, epochs=2, checkpoint="straight", **common)[0]
    run_on_engines(run_file, 2, recipe, epochs=1, checkpoint="interrupted", **common)
    resumed = run_on_engines(run_file, 2, recipe, epochs=2, resume=True, checkpoint="interrupted", **common)[0]
    second_epoch = straight["losses"][len(straight["losses"]) // 2:]
    assert resumed["losses"] == second_epoch and resumed["r2"] == straight["r2"][1:]


def test_horovod_stage_trains_as_the_engine(in_tmp):
    from dlscale.distributed import horovod_backend

    if not horovod_backend.available():
        pytest.skip("Horovod is not built (make horovod)")
    arguments = {"epochs": 1, "device": "cpu", "workers": 0, "precision": "fp32", "compile": False}
    recipe = horovod_backend.run(run_file, 2, str(RECIPES / "06_horovod.py"), **arguments)
    engine = horovod_backend.run(engine_twin, 2, "06_horovod.py", **arguments)
    _assert_equal_runs(recipe[0], engine[0])


# -- the exercises that add recipe lines: each usual mistake is named -------------------------------

def _solution(notebook: str, name: str, mistake: tuple[str, str] | None = None):
    """The function ``name`` of a solution notebook, optionally with one mistake written in (``old -> new``),
    defined in ``__main__`` as a notebook defines it, so that engines receive it by value."""
    cells = json.loads((ROOT / "solutions" / notebook).read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if f"def {name}(" in "".join(c["source"]))
    if mistake:
        assert mistake[0] in source, f"the solution no longer holds {mistake[0]!r}"
        source = source.replace(*mistake)
    namespace = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace[name]


def test_mixed_precision_check_passes_the_solution_and_names_clipping_before_unscaling():
    from dlscale.lessons.recipe_checks import check_mixed_precision_loop

    check_mixed_precision_loop(_solution("03_mixed_precision.ipynb", "train_fp16"))
    swapped = ("        scaler.unscale_(optimizer)\n        nn.utils.clip_grad_norm_(model.parameters(), clip)\n",
               "        nn.utils.clip_grad_norm_(model.parameters(), clip)\n        scaler.unscale_(optimizer)\n")
    with pytest.raises(AssertionError, match="clipping before scaler.unscale_"):
        check_mixed_precision_loop(_solution("03_mixed_precision.ipynb", "train_fp16", swapped))


DATA_PARALLEL_MISTAKES = {
    "no set_epoch": (("        sampler.set_epoch(epoch)\n", "        pass\n"), "call sampler.set_epoch"),
    "loss not all-reduced": (("            dist.all_reduce(logged)\n            losses.append(logged.item() / world_size)",
                              "            losses.append(logged.item())"), "the metrics are not all-reduced"),
    "padded shares": (("seed=0, drop_last=True)", "seed=0, drop_last=False)"), "share size is wrong"),
    "every rank writes": (("        if rank == 0:\n            torch.save(", "        if True:\n            torch.save("),
                          r"written by rank\(s\) \[0, 1\]"),
}


def test_data_parallel_check_passes_the_solution(checks_folder):
    from dlscale.lessons.recipe_checks import check_data_parallel_loop

    check_data_parallel_loop(_solution("05_data_parallel.ipynb", "train_data_parallel"))


@pytest.mark.parametrize("mistake", sorted(DATA_PARALLEL_MISTAKES))
def test_data_parallel_check_names_the_mistake(mistake, checks_folder):
    from dlscale.lessons.recipe_checks import check_data_parallel_loop

    change, message = DATA_PARALLEL_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_data_parallel_loop(_solution("05_data_parallel.ipynb", "train_data_parallel", change))


SCHEDULE_MISTAKES = {
    "not scaled": (("    peak = lr * batch_size / base_batch\n", "    peak = lr\n"), "it is not scaled"),
    "square root": (("    peak = lr * batch_size / base_batch\n", "    peak = lr * (batch_size / base_batch) ** 0.5\n"),
                    "square-root rule"),
    "warmup from 0": (("    start = lr / peak\n", "    start = 0.0\n"), "the first step's LR is 0"),
    "no warmup": (("    start = lr / peak\n", "    start = 1.0\n"), "no warmup"),
}


@pytest.mark.parametrize("mistake", [None, *sorted(SCHEDULE_MISTAKES)])
def test_lr_schedule_check_passes_the_solution_and_names_each_mistake(mistake):
    from dlscale.lessons.recipe_checks import check_lr_schedule

    if mistake is None:
        return check_lr_schedule(_solution("07_large_batch.ipynb", "scaled_schedule"))
    change, message = SCHEDULE_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_lr_schedule(_solution("07_large_batch.ipynb", "scaled_schedule", change))


FSDP_MISTAKES = {
    "blocks only": (("    fully_shard(model, mesh=mesh)\n", "    pass\n"), "the root is not sharded"),
    "root only": (("    for block in model.blocks:\n        fully_shard(block, mesh=mesh)\n", ""),
                  "the blocks are not FSDP units"),
}


@pytest.mark.parametrize("mistake", [None, *sorted(FSDP_MISTAKES)])
def test_fsdp_check_passes_the_solution_and_names_each_mistake(mistake, checks_folder):
    from dlscale.lessons.recipe_checks import check_fsdp_sharding

    if mistake is None:
        return check_fsdp_sharding(_solution("10_sharded_and_model_parallel.ipynb", "shard"))
    change, message = FSDP_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_fsdp_sharding(_solution("10_sharded_and_model_parallel.ipynb", "shard", change))


def test_the_lessons_run_the_pytorch_an_attendee_writes():
    """Each call an attendee must write in their own script stands in a code cell of a lesson (not only in a diff)."""
    code = "\n".join("".join(c["source"]) for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
                     for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    for call in ("DistributedDataParallel(", "init_process_group(", "DistributedSampler(", "set_epoch(",
                 "torch.autocast(", "GradScaler(", "unscale_(", "torch.compile(", "fully_shard(", "parallelize_module(",
                 "init_device_mesh(", "dcp.save(", "dcp.load(", "LambdaLR("):
        assert call in code, f"no lesson runs {call}"


def test_every_recipe_that_joins_a_process_group_bounds_the_wait():
    """Without timeout=, a rank whose peer never starts waits silently for torch's default (30 min on gloo)."""
    import ast
    calls = []
    for path in sorted((ROOT / "recipes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "init_process_group":
                calls.append((path.name, {k.arg for k in node.keywords}))
    assert len(calls) >= 3  # 05, 07, 10
    assert all("timeout" in keywords for _, keywords in calls), calls
