"""The plain-PyTorch recipe: its files are the lessons' cells, and every stage trains as the engine does.

The engine (``dlscale.train``) is the reference. With the settings :func:`engine_settings` gives,
a stage and the engine run the same kernels in the same order on a CPU, so their losses agree to
the last bit here; the tests allow 1e-6, room for AdamW's multi-tensor update (the engine's)
against the per-tensor one (the recipe's on a CPU), which may add in another order elsewhere. The
validation R² gets the same room: on PyPI's CUDA build of torch 2.13 running on a CPU (Python 3.13),
stage 01's sixth loss differed from the engine's by one float32 ulp, and its R² by 1.3e-8.
"""

import json
import runpy

import pytest

from dlscale.distributed.ports import free_port
from dlscale.lessons.exercises import stage_source
from dlscale.lessons.recipe_folder import RECIPES, RecipeError
from dlscale.lessons.recipes import recipe_cells, write_recipes
from dlscale.lessons.stage_check import check_stage
from dlscale.lessons.stages import all_stages, stage_record

from ..conftest import ROOT


def test_recipe_files_are_the_lessons_cells(tmp_path):
    assert write_recipes(ROOT / "notebooks", RECIPES, check=True) == [], "recipes/ is out of date: run dlscale recipes"
    assert sorted(recipe_cells(ROOT / "notebooks")) == [
        "01_baseline.py",
        "02_data_loading.py",
        "03_mixed_precision.py",
        "04_compile.py",
        "05_ddp.py",
        "07_large_batch.py",
        "10_fsdp_tp.py",
        "13_pipeline.py",
    ]
    # an edited cell makes its file out of date, and the generator rewrites it
    lesson = json.loads((ROOT / "notebooks" / "01_single_device_baseline.ipynb").read_text())
    cell = next(c for c in lesson["cells"] if "recipe" in c["metadata"].get("tags", []))
    cell["source"].append("\n# an attendee's change\n")
    (tmp_path / "01.ipynb").write_text(json.dumps(lesson))
    (tmp_path / "recipes").mkdir()
    assert write_recipes(tmp_path, tmp_path / "recipes") == [tmp_path / "recipes" / "01_baseline.py"]
    assert "# an attendee's change" in (tmp_path / "recipes" / "01_baseline.py").read_text()
    # the file says in its first line where it comes from, and that an edit belongs in the lesson (#60)
    assert (tmp_path / "recipes" / "01_baseline.py").read_text().splitlines()[0] == (
        "# recipes/01_baseline.py: written from notebooks/01.ipynb by `dlscale recipes`; edit the lesson's cell"
    )
    assert write_recipes(tmp_path, tmp_path / "recipes", check=True) == []
    cell["source"][0] = "# 01_baseline.py\n"  # a recipe cell must name its file
    (tmp_path / "01.ipynb").write_text(json.dumps(lesson))
    with pytest.raises(RecipeError, match="must start with '# recipes/NAME.py'"):
        write_recipes(tmp_path, tmp_path / "recipes")


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
    from dlscale.lessons.lesson03 import check_mixed_precision_loop

    check_mixed_precision_loop(_solution("03_mixed_precision.ipynb", "train_fp16"))
    swapped = (
        "        scaler.unscale_(optimizer)\n        nn.utils.clip_grad_norm_(model.parameters(), clip)\n",
        "        nn.utils.clip_grad_norm_(model.parameters(), clip)\n        scaler.unscale_(optimizer)\n",
    )
    with pytest.raises(AssertionError, match="clipping before scaler.unscale_"):
        check_mixed_precision_loop(_solution("03_mixed_precision.ipynb", "train_fp16", swapped))


SCHEDULE_MISTAKES = {
    "not scaled": (("    peak = lr * batch_size / base_batch\n", "    peak = lr\n"), "it is not scaled"),
    "square root": (
        ("    peak = lr * batch_size / base_batch\n", "    peak = lr * (batch_size / base_batch) ** 0.5\n"),
        "square-root rule",
    ),
    "warmup from 0": (("    start = lr / peak\n", "    start = 0.0\n"), "the first step's LR is 0"),
    "no warmup": (("    start = lr / peak\n", "    start = 1.0\n"), "no warmup"),
}


@pytest.mark.parametrize("mistake", [None, *sorted(SCHEDULE_MISTAKES)])
def test_lr_schedule_check_passes_the_solution_and_names_each_mistake(mistake):
    from dlscale.lessons.lesson07 import check_lr_schedule

    if mistake is None:
        return check_lr_schedule(_solution("07_large_batch.ipynb", "scaled_schedule"))
    change, message = SCHEDULE_MISTAKES[mistake]
    with pytest.raises(AssertionError, match=message):
        check_lr_schedule(_solution("07_large_batch.ipynb", "scaled_schedule", change))


def test_the_lessons_run_the_pytorch_an_attendee_writes():
    """Each call an attendee must write in their own script stands in a code cell of a lesson (not only in a diff)."""
    code = "\n".join(
        "".join(c["source"])
        for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for c in json.loads(path.read_text())["cells"]
        if c["cell_type"] == "code"
    )
    for call in (
        "DistributedDataParallel(",
        "init_process_group(",
        "DistributedSampler(",
        "set_epoch(",
        "torch.autocast(",
        "GradScaler(",
        "unscale_(",
        "torch.compile(",
        "fully_shard(",
        "parallelize_module(",
        "init_device_mesh(",
        "dcp.save(",
        "dcp.load(",
        "LambdaLR(",
    ):
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


# -- what a site run needs: resume, the device, the batch, accumulation, a profiling window ----------------


def _stage(name: str) -> dict:
    return runpy.run_path(str(RECIPES / name), run_name="recipe")


def test_a_resumed_stage_equals_an_uninterrupted_one_and_refuses_another_runs_checkpoint(in_tmp):
    main = _stage("01_baseline.py")["main"]
    common = {"device": "cpu", "log_every": 5}
    straight = main(epochs=2, checkpoint="straight.pt", **common)
    main(epochs=1, checkpoint="cut.pt", **common)
    resumed = main(epochs=2, checkpoint="cut.pt", resume=True, **common)
    assert resumed["losses"] == straight["losses"][len(straight["losses"]) // 2 :]
    assert resumed["r2"] == straight["r2"][1:]
    assert not (in_tmp / "cut.pt.tmp").exists()  # written to a temporary file, then renamed
    with pytest.raises(SystemExit, match=r"cut.pt is another run's .*resume with its settings"):
        main(epochs=3, checkpoint="cut.pt", resume=True, lr=0.1, **common)


class _FakeCuda:
    """torch.cuda as a node with `visible` GPUs shows it to one process."""

    def __init__(self, monkeypatch, visible: int):
        import torch

        self.chosen = []
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        monkeypatch.setattr(torch.cuda, "set_device", self.chosen.append)


@pytest.mark.parametrize("visible, local_rank, chosen", [(1, 3, 0), (4, 3, 3)])
def test_a_rank_takes_its_only_gpu_or_the_one_at_its_local_rank(monkeypatch, visible, local_rank, chosen):
    from training_tools import pick_device

    cuda = _FakeCuda(monkeypatch, visible)
    assert str(pick_device("cuda", local_rank)) == f"cuda:{chosen}" and cuda.chosen == [chosen]


@pytest.mark.parametrize(
    "visible, on_node, chosen, launcher",
    [
        (1, 2, "cpu", "LOCAL_WORLD_SIZE"),
        (1, 2, "cpu", "HOROVOD_LOCAL_SIZE"),
        (4, 4, "cuda:3", "LOCAL_WORLD_SIZE"),
        (1, 1, "cuda:0", "LOCAL_WORLD_SIZE"),
    ],
)
def test_ranks_that_outnumber_the_gpus_train_on_the_cpu_under_auto_and_stop_under_cuda(
    monkeypatch, capsys, visible, on_node, chosen, launcher
):
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected": lesson 05's two engines on a one-GPU node);
    torchrun and the engines say how many ranks share the node in LOCAL_WORLD_SIZE, horovodrun in its own."""
    from training_tools import pick_device

    _FakeCuda(monkeypatch, visible)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv(launcher, str(on_node))
    local_rank = on_node - 1
    assert str(pick_device("auto", local_rank)) == chosen
    pick_device("auto", 0)  # (the node's first rank says it once)
    assert ("train on the CPU" in capsys.readouterr().out) == (chosen == "cpu")
    if chosen == "cpu":
        with pytest.raises(SystemExit, match=rf"local rank {local_rank} of {on_node} on this node, and it shows 1 GPU"):
            pick_device("cuda", local_rank)


def test_a_single_process_run_compared_with_ranks_uses_their_device(monkeypatch):
    import torch

    from dlscale.lab import device_for_ranks

    for visible, ranks, device in [(0, 2, "auto"), (1, 2, "cpu"), (1, 1, "auto"), (4, 4, "auto"), (4, 8, "cpu")]:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        assert device_for_ranks(ranks) == device, (visible, ranks)


def test_the_stage_check_reads_the_device_the_stage_picked(monkeypatch):
    """The gaps' probes want gloo and unpinned memory on the CPU, NCCL and pinned memory on a GPU: the device they
    judge by is the one pick_device chose (auto: the CPU for two ranks on a node of one GPU), not the CPU's by
    default."""
    import torch

    from dlscale.lessons.stage_record import device_kind as _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert _device({}) == "cuda" and _device({"device": "auto"}) == "cuda" and _device({"device": "cpu"}) == "cpu"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _device({}) == "cpu" and _device({"device": "cuda:0"}) == "cuda"


@pytest.mark.parametrize(
    "visible, local_rank, message",
    [
        (0, 0, r"local rank 0 of 1 on this node, and it shows 0 GPUs"),
        (4, 5, r"local rank 5 of 1 on this node, and it shows 4 GPUs .* fewer ranks per node"),
    ],
)
def test_a_gpu_asked_for_and_missing_stops_the_stage_naming_the_counts(monkeypatch, visible, local_rank, message):
    from training_tools import pick_device

    _FakeCuda(monkeypatch, visible)
    with pytest.raises(SystemExit, match=message):
        pick_device("cuda", local_rank)
    assert str(pick_device("cpu", local_rank)) == "cpu"


@pytest.mark.parametrize(
    "stage, arguments, message",
    [
        ("05_ddp.py", {"batch_size": 3}, r"--batch-size 3 is the global batch: it must split evenly over 2 ranks x 1"),
        ("05_ddp.py", {"batch_size": 32, "accumulate": 3}, r"over 2 ranks x 3 micro-batches"),
        ("10_fsdp_tp.py", {"batch_size": 1}, r"--batch-size 1 split evenly over 2 data ranks"),
        ("13_pipeline.py", {"microbatches": 3}, r"--microbatches 3 must divide --batch-size 32"),
        ("13_pipeline.py", {"depth": 1}, r"--depth 1 needs a block for each of the 2 x 1 stages"),
    ],
)
def test_a_global_batch_the_ranks_cannot_share_stops_the_stage_before_it_starts(monkeypatch, stage, arguments, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=message):
        _stage(stage)["main"](device="cpu", **arguments)


def test_the_profiling_window_names_the_forward_backward_and_step(in_tmp, capsys):
    _stage("04_compile.py")["main"](
        epochs=1, device="cpu", workers=0, precision="fp32", compile=False, profile_steps="3,5"
    )
    trace = json.loads((in_tmp / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"forward", "backward", "optimizer step"} <= names
    assert "optimizer step" in capsys.readouterr().out  # the table, printed when the window closes


def test_each_stage_logs_samples_per_second_once_per_block(in_tmp, capsys):
    result = _stage("01_baseline.py")["main"](epochs=1, device="cpu", log_every=10)
    steps = len(result["losses"])  # 1,024 samples / 32 = 32 steps: blocks of 10, 10, 10 and 2
    assert len(result["throughput"]) == -(-steps // 10) and all(rate > 0 for rate in result["throughput"])
    assert capsys.readouterr().out.count("samples/s") == len(result["throughput"])


@pytest.mark.parametrize("config", ["tiny", "demo"])
@pytest.mark.parametrize("stage", ["01_baseline.py", "05_ddp.py", "07_large_batch.py", "10_fsdp_tp.py"])
def test_the_engine_twin_trains_the_recipes_own_model_on_every_config(stage, config):
    """The twin takes the stage's model settings, not the config's (demo's CNN is wider and deeper)."""
    from dlscale.config import load_config
    from dlscale.lessons.parity import engine_settings
    from dlscale.models import build_model

    name, overrides = engine_settings(stage, config=config)
    cfg = load_config(name).override({k: v for k, v in overrides.items() if k != "config"})
    engine = build_model(cfg)
    if stage == "10_fsdp_tp.py":
        from dlscale.models import ViTRegressor

        recipe = ViTRegressor(image_size=cfg.image_size, width=32, depth=2, heads=4)
    else:
        recipe = _stage(stage)["make_model"](8, 2)
    assert [p.shape for p in engine.parameters()] == [p.shape for p in recipe.parameters()]


def test_stage_13s_twin_pipelines_every_rank_that_does_not_split_a_stage(monkeypatch):
    from dlscale.lessons.parity import engine_settings

    monkeypatch.setenv("WORLD_SIZE", "8")
    overrides = engine_settings("13_pipeline.py", tp=2, schedule="interleaved-1f1b", stages_per_rank=2)[1]
    assert [overrides[k] for k in ("pipeline_parallel", "tensor_parallel", "pipeline_virtual_stages")] == [4, 2, 2]
    overrides = engine_settings("13_pipeline.py", stages_per_rank=2)[1]  # (one stage per rank unless interleaved)
    keys = ("pipeline_parallel", "pipeline_virtual_stages", "pipeline_schedule")
    assert [overrides[k] for k in keys] == [8, 1, "1f1b"]
    assert overrides["model"] == "vit" and overrides["pipeline_microbatches"] == 4


def test_stage_07_scales_adam_like_optimizers_by_the_square_root_and_sgd_linearly():
    from dlscale.lessons.parity import engine_settings

    assert engine_settings("07_large_batch.py")[1]["lr_scaling"] == "sqrt"
    assert engine_settings("07_large_batch.py", optimizer_name="lamb")[1]["lr_scaling"] == "sqrt"
    assert engine_settings("07_large_batch.py", optimizer_name="lars")[1]["lr_scaling"] == "linear"
    assert engine_settings("07_large_batch.py", optimizer_name="sgd")[1]["lr_scaling"] == "linear"


def test_a_stages_change_is_shown_coloured_unwrapped_with_the_whole_file_a_click_away():
    from dlscale.lessons.recipes import recipe_change_html

    page = recipe_change_html("04_compile.py", "05_ddp.py")
    assert 'style="background:#e6ffec">+from torch.nn.parallel import DistributedDataParallel</div>' in page
    assert 'style="background:#ffebe9">-' in page and "white-space:pre;overflow-x:auto" in page
    assert "<details><summary>the whole of recipes/05_ddp.py</summary>" in page
    assert page.count("init_process_group") >= 2  # a changed line, and the file behind the click


# -- the stage the attendee writes -------------------------------------------------------------------


@pytest.mark.parametrize("stage", [stage.file for stage in all_stages().values()])
def test_a_stage_with_its_gaps_stops_at_the_first_todo_it_reaches_and_names_it(stage, tmp_path, monkeypatch):
    """As shipped, the lesson's stage runs up to its first gap and raises there, naming what to write; every gap
    cuts whole statements (it compiles) and says what goes there."""
    import torch.distributed as dist

    if stage == "06_horovod.py":
        pytest.importorskip("horovod.torch", reason="needs Horovod (make horovod)")
    source = stage_source(stage, gaps=True)
    assert source.count('raise NotImplementedError("TODO ') == len(stage_record(stage).gaps)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # 07 and 10 join a group of one before their first gap
    namespace = {"__name__": "recipe"}
    exec(compile(source, f"{stage} with gaps", "exec"), namespace)
    try:
        with pytest.raises(NotImplementedError, match=rf"^TODO {stage[:2]}\.[a-e]: "):
            namespace["main"](
                epochs=1,
                device="cpu",
                checkpoint=str(tmp_path / "checkpoint"),
                **({} if stage.startswith("01") else {"workers": 0}),
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_stage_check_allows_what_a_gpu_rounds_differently_and_names_where_a_stage_parts():
    twin = {"losses": [1.0, 0.8, 0.6, 0.5], "r2": [0.4]}
    within = {"losses": [1.0, 0.8, 0.6 * (1 + 2e-2), 0.5], "r2": [0.41]}  # cuDNN's algorithms, TF32: a few %
    check_stage("01_baseline.py", within, twin, device="cuda")
    with pytest.raises(AssertionError, match="from step 2 .the steps before it agree.: the update"):
        check_stage("01_baseline.py", within, twin, device="cpu")
    with pytest.raises(AssertionError, match="first step's loss"):
        check_stage("01_baseline.py", {**within, "losses": [1.1, 0.8, 0.6, 0.5]}, twin, device="cuda")
    with pytest.raises(AssertionError, match="logged 3 steps, dlscale.train 4"):
        check_stage("05_ddp.py", {**twin, "losses": [1.0, 0.8, 0.6]}, twin)
    with pytest.raises(AssertionError, match="epoch 1's validation R² is 0.3000"):
        check_stage("05_ddp.py", {**twin, "r2": [0.3]}, twin, device="cpu")


@pytest.mark.parametrize("stage", sorted(p.name for p in RECIPES.glob("[0-9][0-9]_*.py")))
def test_every_option_of_a_stage_reaches_it_through_torchrun(stage):
    """torchrun's parser reads an option it could abbreviate as its own, even after the script (stage 13's
    ``--virtual`` stopped torchrun: "ambiguous option: --virtual could match --virtual-local-rank"); every option a
    stage takes passes through to the stage."""
    import inspect

    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    for name in inspect.signature(_stage(stage)["main"]).parameters:
        option = "--" + name.replace("_", "-")
        parsed = parser.parse_args(["--nproc-per-node", "2", stage, option, "1"])
        assert parsed.training_script_args == [option, "1"], (stage, option)
