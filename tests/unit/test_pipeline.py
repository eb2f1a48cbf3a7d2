"""Pipeline parallelism without launching ranks: the config's one-line errors, the cut into stages, the stages run in
one process against the whole model, and the activations they hold (tests/integration/test_pipeline.py launches
them)."""

import pytest
import torch

from dlscale.checkpoint.formats import misfit
from dlscale.config import ConfigError, load_config
from dlscale.distributed import DistEnv
from dlscale.distributed.parallelize import ParallelPlan, plan_parallelism
from dlscale.distributed.pipeline import local_stage_ids, rank_part, stage_blocks, textbook_bubble
from dlscale.metrics.memory import HeldActivations
from dlscale.models import ViTRegressor
from dlscale.training.setup import check_fits


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"pipeline_parallel": 0}, "config key 'pipeline_parallel' must be >= 1, got 0"),
        ({"pipeline_microbatches": 0}, "config key 'pipeline_microbatches' must be >= 1, got 0"),
        ({"pipeline_virtual_stages": -1}, "config key 'pipeline_virtual_stages' must be >= 1, got -1"),
        ({"pipeline_schedule": "zero-bubble"}, "config key 'pipeline_schedule' must be one of gpipe, 1f1b"),
        ({"model": "cnn", "pipeline_parallel": 2}, "config key 'pipeline_parallel' needs model=vit"),
        ({"pipeline_parallel": 3}, "config key 'pipeline_parallel'=3 x pipeline_virtual_stages=1 makes 3 stages of"),
        (
            {"pipeline_parallel": 2, "pipeline_schedule": "interleaved-1f1b", "pipeline_virtual_stages": 2},
            "makes 4 stages of depth=2 blocks",
        ),
        ({"pipeline_virtual_stages": 2}, "config key 'pipeline_virtual_stages'=2 needs pipeline_schedule=interleav"),
        ({"pipeline_parallel": 2, "pipeline_microbatches": 1}, "config key 'pipeline_microbatches'=1 must be >= pip"),
        (
            {"depth": 4, "pipeline_parallel": 2, "pipeline_schedule": "interleaved-1f1b", "pipeline_microbatches": 3},
            "config key 'pipeline_microbatches'=3 must be at most pipeline_parallel=2 or a multiple of it",
        ),
        ({"pipeline_parallel": 2, "grad_accumulation": 2}, "config key 'grad_accumulation' must be 1 with pipeline"),
        ({"pipeline_parallel": 2, "data_parallel": "ddp"}, "pipeline_parallel=2 needs data_parallel=fsdp or auto"),
        ({"pipeline_parallel": 2, "compile": True}, "config key 'compile' is not supported with data_parallel=fsdp,"),
    ],
)
def test_each_bad_pipeline_setting_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as raised:
        load_config("vit-tiny", overrides)
    assert "\n" not in str(raised.value)


def test_the_job_must_hold_whole_pipelines_and_each_rank_whole_micro_batches():
    cfg = load_config("vit-tiny", {"pipeline_parallel": 2, "tensor_parallel": 2})
    with pytest.raises(ConfigError, match="pipeline_parallel=2 x tensor_parallel=2 does not divide the 6 ranks"):
        plan_parallelism(cfg.sections.parallel, DistEnv(0, 0, 6, 6, "torchrun", "127.0.0.1", 29500))
    with pytest.raises(ConfigError, match="pipeline_parallel=2 needs torch.distributed's ranks"):
        plan_parallelism(cfg.sections.parallel, DistEnv(0, 0, 4, 4, "horovodrun", backend="horovod"))
    cfg = load_config("vit-tiny", {"pipeline_parallel": 2, "pipeline_microbatches": 3, "global_batch_size": 32})
    plan = ParallelPlan("none", 1, 0, 1, pipeline=2)
    with pytest.raises(ConfigError, match="'pipeline_microbatches'=3 must divide the per-rank batch 32"):
        check_fits(cfg, torch.device("cpu"), plan)
    assert plan.sharded and plan.model_ranks == 2  # (no rank holds the whole model: checkpoints are sharded)
    assert ParallelPlan("fsdp", 2, 0, 2, pipeline=2).describe() == (
        "fsdp over 2 × tensor parallel over 2 × pipeline of 2 stages"
    )


def test_stages_cut_the_blocks_evenly_and_interleave_round_robin():
    assert stage_blocks(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_blocks(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ConfigError):
        stage_blocks(2, 3)
    assert local_stage_ids(1, 2, 2) == [1, 3]  # rank 1 of 2 holds the 2nd and the 4th stage
    assert textbook_bubble(4, 12) == pytest.approx(3 / 15)
    assert textbook_bubble(4, 12, 2) == pytest.approx(3 / 27)  # interleaving: v times fewer idle slots


def _whole_and_stages(seed=3):
    kwargs = dict(image_size=16, width=32, depth=4, heads=4, seed=seed)
    whole = ViTRegressor(**kwargs).double()
    with torch.device("meta"):
        meta = ViTRegressor(**kwargs)
    stages = [meta.pipeline_stage(blocks, i == 0, i == 2) for i, blocks in enumerate(stage_blocks(4, 3))]
    for stage in stages:  # (as a sharded run does: each stage materialized and initialized alone)
        stage.to(torch.float64).to_empty(device="cpu")
        stage.init_weights(seed)
    return whole, stages


def test_stages_built_on_meta_start_as_the_whole_model_and_chain_to_its_output():
    whole, stages = _whole_and_stages()
    expected = dict(whole.named_parameters())
    for stage in stages:
        for name, parameter in stage.named_parameters():  # (the whole model's names and values)
            assert torch.equal(parameter, expected[name]), name
    x = torch.randn(8, 1, 16, 16, dtype=torch.float64)
    out = x
    for stage in stages:
        out = stage(out)
    assert torch.allclose(out, whole(x), rtol=0, atol=1e-12)
    assert out.shape == (8, 3) and stages[0](x).is_contiguous()  # (gloo sends contiguous tensors only)


def test_a_ranks_stages_together_hold_their_parameters_under_the_whole_names_and_load_from_a_whole_checkpoint():
    whole, stages = _whole_and_stages()
    part = rank_part([stages[0], stages[2]])  # (interleaved: a rank's first and last stage)
    names = [name for name, _ in part.named_parameters()]
    assert names[0] == "position" and "blocks.0.mlp.w1.weight" in names and "blocks.3.mlp.w1.weight" in names
    assert not any(name.startswith("blocks.2.") for name in names) and names[-1] == "head.bias"  # (stage 1's)
    saved = {name: tuple(value.shape) for name, value in whole.state_dict().items()}
    assert misfit(saved, part) is None  # (the other stages' weights in a checkpoint are not extra to a part)
    assert "weight(s) the model has not" in misfit(saved, stages[0])  # (a module that is not a part: refused)


def test_held_activations_count_what_waits_for_a_backward_and_uncount_it_after():
    whole, _ = _whole_and_stages()
    x = torch.randn(8, 1, 16, 16, dtype=torch.float64)
    with HeldActivations(whole) as held:
        outputs = [whole(x) for _ in range(3)]
        three = held.held
        outputs[0].sum().backward()
        assert 0.6 < held.held / three < 0.7  # one forward's activations gone with its backward
        del outputs[1:]  # a graph dropped unrun lets go of its activations too
        assert held.held == 0
    assert held.peak == three
