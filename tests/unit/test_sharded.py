"""Beyond data parallel: FSDP and tensor parallelism of the ViT equal one process; sharded checkpoints; bad
combinations."""

import pytest
import torch

from dlscale.config import ConfigError, load_config
from dlscale.distributed import DistEnv, DistributedError, resolve_data_parallel
from dlscale.distributed.parallelize import ParallelPlan, build_step_model, plan_parallelism
from dlscale.metrics.memory import saved_activation_bytes
from dlscale.models import build_model
from dlscale.runtime.precision import Precision


def test_activation_checkpointing_computes_the_same_gradients_from_fewer_saved_bytes():
    cfg = load_config("vit-tiny")
    x, grads, saved = torch.randn(8, 1, 16, 16), [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg.override({"activation_checkpointing": checkpointing}))
        saved.append(saved_activation_bytes(model, x))
        model(x).pow(2).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads))
    assert saved[1] < saved[0] / 3  # each block keeps only its input


# -- what cannot run is one clear error ---------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tensor_parallel": 2}, "needs model=vit"),
        ({"model": "vit", "width": 32, "heads": 4, "tensor_parallel": 3}, "must divide heads=4"),
        ({"model": "vit", "width": 30, "heads": 4}, "must divide width=30"),
        ({"model": "vit", "tensor_parallel": 2, "data_parallel": "horovod"}, "needs data_parallel=fsdp or auto"),
        ({"model": "vit", "data_parallel": "fsdp", "noise_scale_every": 5}, "noise_scale_every' is not supported"),
    ],
)
def test_bad_combinations_are_one_clear_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", overrides)


def test_tensor_parallel_must_divide_the_ranks_and_fsdp_cannot_run_under_horovod():
    cfg = load_config("vit-tiny", {"tensor_parallel": 2})
    with pytest.raises(ConfigError, match="tensor_parallel=2 does not divide the 3 ranks"):
        plan_parallelism(cfg.sections.parallel, DistEnv(0, 0, 3, 3, "torchrun", "127.0.0.1", 29500))
    with pytest.raises(DistributedError, match="data_parallel=fsdp needs torch.distributed"):
        resolve_data_parallel("fsdp", "horovodrun")


def test_fp16_with_sharded_parameters_says_what_to_use():
    cfg = load_config("vit-tiny", {"data_parallel": "fsdp"})
    with pytest.raises(ConfigError, match="use precision=bf16 or fp32"):
        build_step_model(
            torch.nn.Linear(2, 2),
            None,
            cfg.sections.parallel,
            cfg.sections.model,
            ParallelPlan("fsdp", 1, 0, 2),
            Precision("fp16", "cuda"),
        )


def test_fsdp_sends_one_and_a_half_times_ddp_and_tensor_parallel_scales_with_the_activations():
    from dlscale.scaling.collectives import data_parallel_bytes, tensor_parallel_bytes

    two = data_parallel_bytes(1_000_000, 2)
    assert two == {"DDP": 4_000_000, "FSDP": 6_000_000}  # 2·½·P·4 bytes, and 3·½·P·4
    assert data_parallel_bytes(1_000_000, 1) == {"DDP": 0, "FSDP": 0}  # nothing to exchange alone
    assert data_parallel_bytes(1_000_000, 8)["DDP"] == 2 * 7 / 8 * 4_000_000
    # four all-reduces per block of batch × tokens × width values; twice the batch, twice the bytes
    assert tensor_parallel_bytes(16, 64, 32, 2, 2) == 4 * 2 * 2 * 0.5 * 16 * 64 * 32 * 4
    assert tensor_parallel_bytes(32, 64, 32, 2, 2) == 2 * tensor_parallel_bytes(16, 64, 32, 2, 2)
