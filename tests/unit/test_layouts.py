"""Lesson 11's plan for a model that does not fit one GPU: the pipeline's term (its bubble and sends), the layout
chooser among DP, FSDP, TP×DP and PP×TP×DP, its check against Megatron-LM's published pipeline runs, and
``dlscale project --layouts``."""

import pytest

from dlscale.errors import RangeError
from dlscale.scaling.collectives import Link, layout_seconds, ring_allgather
from dlscale.scaling.layouts import GPUS, Gpu, Training, choose_layout, format_layouts, group_placement, layout_rows
from dlscale.scaling.model_size import PRESETS, ModelSize, gpt
from dlscale.scaling.pipeline_cost import (
    SCHEDULES,
    bubble_share,
    held_microbatches,
    pipeline_step,
    schedule_refusal,
    send_seconds,
)
from dlscale.scaling.plan import predict_next
from dlscale.scaling.published_pipeline import (
    CASES,
    ZERO3_175B,
    format_inputs,
    format_validation,
    format_zero3,
    fsdp_beside_zero3,
    validate,
)
from dlscale.scaling.sites import PERLMUTTER, site_from_link

from ..conftest import ROOT


def test_the_bubble_is_the_textbook_formula_the_lesson_measures():
    """The plan's bubble is the lesson's (p - 1)/(v·m + p - 1), and a step's idle slots are that share of it."""
    from dlscale.distributed.pipeline import SCHEDULES as LESSON_SCHEDULES
    from dlscale.distributed.pipeline import textbook_bubble

    assert SCHEDULES == LESSON_SCHEDULES
    for p in range(1, 9):
        for m in range(4, 33):
            for v in (1, 2, 3):
                share = bubble_share(p, m, v)
                assert share == pytest.approx(textbook_bubble(p, m, v)) == pytest.approx((p - 1) / (v * m + p - 1))
                step = pipeline_step(1.0, 0.25, 0.0, m, p, v)
                assert step.bubble / step.step == pytest.approx(share)
                assert step.compute == pytest.approx(m) and step.tensor == pytest.approx(m / 4)
    # each of the v·m + p - 1 slots sends a micro-batch forward and a gradient back; without a pipeline: neither
    step = pipeline_step(1.0, 0.0, 0.01, 8, 4)
    assert step.send == pytest.approx((8 + 3) * 2 * 0.01) and step.step == pytest.approx(8 + 3 + 0.22)
    alone = pipeline_step(1.0, 0.5, 0.01, 8, 1, 1, 2.0)
    assert (alone.bubble, alone.send, alone.step) == (0.0, 0.0, pytest.approx(8 * 1.5 + 2))
    # what the first stage holds: GPipe every micro-batch, 1F1B at most p, interleaved p + (p - 1)/v stage-loads
    assert held_microbatches("gpipe", 4, 16) == 16 and held_microbatches("1f1b", 4, 16) == 4
    assert held_microbatches("interleaved-1f1b", 4, 16, 2) == 4 + 3 / 2 and held_microbatches("1f1b", 1, 16) == 1
    assert "at least 8 micro-batches" in schedule_refusal("1f1b", 8, 4, 1)
    assert schedule_refusal("interleaved-1f1b", 4, 8, 1) and schedule_refusal("1f1b", 4, 8, 1) is None


def test_the_sends_go_on_the_link_between_the_stages():
    inside, between = Link(5e-6, 1 / 100e9), Link(10e-6, 1 / 25e9)
    assert send_seconds(1e8, 1, False, inside, between) == pytest.approx(5e-6 + 1e8 / 100e9)
    assert send_seconds(1e8, 1, True, inside, between) == pytest.approx(10e-6 + 1e8 / 25e9)
    # tensor parallelism: each rank sends a 1/t slice between nodes, the next stage all-gathers it inside its node
    split = send_seconds(1e8, 4, True, inside, between)
    assert split == pytest.approx(10e-6 + 2.5e7 / 25e9 + ring_allgather(1e8, 4, inside))
    assert split < send_seconds(1e8, 1, True, inside, between)
    # a pipeline inside one node sends inside it; one over several nodes crosses them
    small = PRESETS["gpt-1.3b"]
    rows = {(r["layout"], r["pipeline"]): r for r in layout_rows(small, GPUS["a100-80gb"], PERLMUTTER, 4, Training(64))}
    assert rows["PP×TP×DP", 4]["stages_across_nodes"] is False and rows["PP×TP×DP", 4]["send_s"] > 0
    wide = {(r["tensor"], r["pipeline"]): r for r in layout_rows(small, GPUS["a100-80gb"], PERLMUTTER, 8, Training(64))}
    assert wide[1, 8]["stages_across_nodes"] is True
    # the kit's mesh: tensor-parallel ranks consecutive, so a data-parallel group holds g/t GPUs of a node
    assert group_placement(8, 2, 4) == (2, 4) and group_placement(4, 8, 4) == (1, 4)
    assert group_placement(4, 1, 4) == (4, 1)


def test_the_chooser_picks_a_pipeline_where_dp_and_fsdp_do_not_fit_and_tensor_parallelism_is_slow_across_nodes():
    """GPT-3 175B on 64 Perlmutter nodes of A100s of 80 GB, micro-batches of 16 sequences: DP holds 2.7 TB a GPU,
    FSDP splits the state but not the activations (125 GB), and tensor parallelism fits only across 16 nodes."""
    model, gpu = PRESETS["gpt-175b"], GPUS["a100-80gb"]
    rows, choice = choose_layout(model, gpu, PERLMUTTER, 256, Training(4096, micro_batch=16))
    kind = {layout: [r for r in rows if r["layout"] == layout] for layout in ("DP", "FSDP", "TP×DP")}
    assert all("needs" in r["dropped"] and "GB per GPU" in r["dropped"] for r in kind["DP"] + kind["FSDP"])
    tensor_only = [r for r in kind["TP×DP"] if not r["dropped"]]
    assert tensor_only and all(r["tensor"] > PERLMUTTER.gpus_per_node for r in tensor_only)
    assert choice["layout"] == "PP×TP×DP" and choice["tensor"] <= PERLMUTTER.gpus_per_node
    assert choice["stages_across_nodes"] and choice["memory_bytes"] <= gpu.memory_gb * 2**30
    assert all(r["efficiency"] < choice["efficiency"] - 0.2 for r in tensor_only)
    assert all(r["step_s"] >= choice["step_s"] for r in rows if not r["dropped"])
    text = format_layouts(rows, choice, gpu)
    assert "| PP×TP×DP ← |" in text and "**Cheapest:** PP×TP×DP" in text and "FSDP does not fit" in text


def test_the_chooser_picks_data_parallelism_for_a_model_that_fits():
    rows, choice = choose_layout(PRESETS["gpt-1.3b"], GPUS["a100-40gb"], PERLMUTTER, 64, Training(512))
    assert choice["layout"] == "DP" and choice["dropped"] is None and choice["efficiency"] > 0.9
    # a ResNet-50-sized model: 25.6 M parameters, 12 GFLOP and 100 MB of activations per image
    small = ModelSize("ResNet-50-sized", 25_557_032, 12.3e9, 1e8, 1e6, 50)
    rows, choice = choose_layout(small, GPUS["a100-40gb"], PERLMUTTER, 8, Training(256, micro_batch=32))
    assert choice["layout"] == "DP" and all(r["step_s"] >= choice["step_s"] for r in rows)
    # none fits: one layout with the least memory named
    rows, choice = choose_layout(PRESETS["gpt-175b"], GPUS["a100-40gb"], PERLMUTTER, 4, Training(64))
    assert choice is None and "**No layout fits:**" in format_layouts(rows, choice, GPUS["a100-40gb"])


def test_a_batch_that_does_not_divide_or_a_schedule_that_cannot_run_drops_the_layout_with_why():
    rows = layout_rows(PRESETS["gpt-13b"], GPUS["a100-80gb"], PERLMUTTER, 64, Training(100))
    dp = next(r for r in rows if r["layout"] == "DP")
    assert "not a whole number of micro-batches of 1 on each of 64" in dp["dropped"] and dp["efficiency"] <= 1
    rows = layout_rows(PRESETS["gpt-13b"], GPUS["a100-80gb"], PERLMUTTER, 64, Training(64))
    deep = next(r for r in rows if r["tensor"] == 1 and r["pipeline"] == 32)
    assert deep["microbatches"] == 32 and deep["dropped"] is None
    deeper = layout_rows(PRESETS["gpt-13b"], GPUS["a100-80gb"], PERLMUTTER, 64, Training(32))
    assert (
        "1F1B needs at least 32 micro-batches"
        in next(r for r in deeper if r["tensor"] == 1 and r["pipeline"] == 32)["dropped"]
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ModelSize("x", 0, 1.0, 0, 0, 1), "parameters must be at least 1, not 0"),
        (lambda: gpt("x", 0, 8, 1), "layers must be at least 1, not 0"),
        (lambda: Gpu("x", 40, 312, utilization=0), "utilization (the share of the peak reached) must be above 0"),
        (lambda: Gpu("x", -1, 312), "GPU memory (GB) must be above 0, not -1"),
        (lambda: Training(0), "global batch must be at least 1, not 0"),
        (lambda: Training(8, micro_batch=16), "micro-batch must be at most 8, not 16"),
        (lambda: Training(8, schedule="zigzag"), "schedule must be one of gpipe, 1f1b, interleaved-1f1b"),
        (lambda: bubble_share(4, 0), "micro-batches must be at least 1, not 0"),
        (lambda: layout_rows(PRESETS["gpt-13b"], GPUS["a100-80gb"], PERLMUTTER, 6, Training(6)), "6 GPUs is not"),
        (lambda: layout_rows(PRESETS["gpt-13b"], GPUS["a100-80gb"], PERLMUTTER, 0, Training(6)), "GPUs must be"),
    ],
)
def test_every_input_is_range_checked_in_one_line(make, message):
    with pytest.raises(RangeError) as refused:
        make()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_megatron_lms_pipeline_runs_are_predicted_from_their_inputs():
    """Narayanan et al. 2021, Table 2: the per-GPU throughput of each series at one batch on more GPUs, against its
    smallest run, within the page's 10 points; in fact all four 0.4 to 1.5 points low (the page says so)."""
    rows = validate()
    assert len(rows) == len(CASES) == 4
    for row in rows:
        assert abs(row["points_off"]) <= 10
        assert -2 < row["points_off"] < 0, row
        assert row["fits"] and 0.05 < row["bubble_share"] < 0.11 and row["send_share"] < 0.01
        assert 0.5 < 100 * (row["interleaved"] - row["published"]) < 3  # (the interleaved schedule: a little high)
    # the bubble grows as the micro-batches per pipeline halve: the larger run of each series loses more
    assert rows[1]["bubble_share"] > rows[0]["bubble_share"] and rows[3]["bubble_share"] > rows[2]["bubble_share"]
    # the chooser's FSDP row falls with the GPUs as Table 2's ZeRO-3 runs do (not cases: the page says why)
    zero = fsdp_beside_zero3()
    assert [r["published"] for r in zero] == [published for _, _, published in ZERO3_175B]
    assert zero[0]["estimate"] > zero[1]["estimate"] > zero[2]["estimate"]
    page = (ROOT / "docs" / "scaling-validation.md").read_text()
    assert format_validation(rows) in page and format_inputs(rows) in page and format_zero3() in page


def test_the_plan_prices_a_pipeline_runs_data_parallel_share():
    """A sweep run with a pipeline all-reduces each stage's share of the gradient, among the ranks of its stage:
    4 ranks of one node in 2 stages of 2; on 2 nodes, each stage is a node's 4."""
    link = Link(alpha=1e-5, beta=1e-9)
    site = site_from_link(link, 4)
    row = {
        "run": "weak-n1",
        "group": "weak",
        "nodes": 1,
        "ranks": 4,
        "global_batch_size": 128,
        "samples_per_s": 3200.0,
        "hours_to_target": 1 / 3600,
        "samples_to_target": 3200.0,
        "gradient_bytes": 1e6,
        "noise_scale": None,
        "pipeline_parallel": 2,
    }
    step = 128 / 3200
    pipeline = predict_next([row], site)
    grow = layout_seconds("ddp", 5e5, 4, 1, link, link, "auto", 25 * 2**20) - layout_seconds(
        "ddp", 5e5, 2, 1, link, link, "auto", 25 * 2**20
    )
    assert pipeline["hours_to_target"] * 3600 == pytest.approx(3200 / (256 / (step + grow)))
    assert "a pipeline of 2 stages" in " ".join(pipeline["assumptions"])
    # without the pipeline, as before: the whole gradient among the 4 ranks of one node, then of two nodes
    plain = predict_next([{**row, "pipeline_parallel": 1}], site)
    grow = layout_seconds("ddp", 1e6, 4, 2, link, link, "auto", 25 * 2**20) - layout_seconds(
        "ddp", 1e6, 4, 1, link, link, "auto", 25 * 2**20
    )
    assert plain["hours_to_target"] * 3600 == pytest.approx(3200 / (256 / (step + grow)))


def test_project_layouts_prints_the_table_the_cheapest_and_the_assumptions(capfd):
    from dlscale.cli import main

    assert main(["project", "--layouts", "gpt-13b", "--gpus", "64", "--global-batch", "512"]) == 0
    out = capfd.readouterr().out
    assert "| PP×TP×DP ← |" in out and "**Cheapest:** PP×TP×DP" in out and "DP does not fit" in out
    assert "A100 40 GB, 40 GB, 312 TFLOP/s" in out and "Perlmutter, 64 GPUs = 16 node(s) of 4" in out
    assert main(["project", "--layouts", "gpt-1.3b", "--gpus", "64", "--global-batch", "512"]) == 0
    assert "**Cheapest:** DP 1×1×64" in capfd.readouterr().out
    # another GPU and schedule, a machine of one's own
    assert (
        main(
            [
                *("project", "--layouts", "gpt-175b", "--gpus", "512", "--gpu", "h100-80gb", "--gpus-per-node", "8"),
                *("--inside-gbs", "450", "--schedule", "interleaved-1f1b", "--utilization", "0.4"),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "interleaved-1f1b with 2 stages per rank" in out and "H100 80 GB (SXM)" in out
    assert "at 40% of the peak" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "argument --gpus: must be at least 1, not 0"),
        (["--gpus", "6"], "6 GPUs is not a whole number of nodes of 4 GPUs"),
        (["--micro-batch", "2000"], "micro-batch must be at most 1536, not 2000"),
        (["--utilization", "1.5"], "argument --utilization: must be at most 1, not 1.5"),
        (["--gpu-memory-gb", "0"], "argument --gpu-memory-gb: must be above 0, not 0"),
        (["--global-batch", "many"], "argument --global-batch: a whole number is needed, not 'many'"),
        (["--virtual-stages", "3"], "--virtual-stages 3 with --schedule 1f1b"),
        (["--parameters", "5"], "--parameters describes a data-parallel projection"),
        (["--samples-per-s", "5"], "argument --samples-per-s: not allowed with argument --layouts"),
    ],
)
def test_project_layouts_refuses_a_bad_value_in_one_line(args, message, capfd):
    from dlscale.cli import main

    try:
        code = main(["project", "--layouts", "gpt-13b", *args])
    except SystemExit as stopped:  # (argparse exits on a bad argument)
        code = stopped.code
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
