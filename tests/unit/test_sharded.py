"""Beyond data parallel: FSDP and tensor parallelism of the ViT equal one process; sharded checkpoints; bad
combinations."""

import json
from pathlib import Path

import pytest
import torch

from dlscale.config import ConfigError, load_config
from dlscale.distributed import DistEnv, DistributedError, resolve_data_parallel
from dlscale.distributed.parallelize import ParallelPlan, build_step_model, plan_parallelism
from dlscale.metrics.memory import peak_bytes, reset_peak, saved_activation_bytes
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


def test_a_cpu_peak_restarts_at_reset_so_an_engine_reports_each_run_its_own():
    """The memory table's peak on a CPU: after reset_peak, a process that once held more (an engine that trained
    before) reports what it holds from then on, not its old high-water mark (Linux; elsewhere it cannot fall)."""
    cpu = torch.device("cpu")
    block = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    high = peak_bytes(cpu)
    del block
    reset_peak(cpu)
    after = peak_bytes(cpu)
    assert 0 < after <= high
    if Path("/proc/self/clear_refs").exists():
        assert after < high - 32 * 2**20


@pytest.mark.parametrize("on_engines", [False, True])
def test_bench_memory_runs_each_layout_with_the_same_settings_under_torchrun_or_on_the_engines(
    on_engines, tmp_path, monkeypatch
):
    """`dlscale bench memory` launches each layout under torchrun; lesson 10 runs the same layouts on its engines:
    each run gets the layout's settings, the steps, a small validation set and the quiet flags either way."""
    from dlscale.bench import memory, scaling
    from dlscale.jobs import notebook_engines

    seen = []

    def summary(processes: int, settings: dict, run_dir) -> dict:
        seen.append((processes, settings))
        share = 2 if settings.get("data_parallel") == "fsdp" else 1
        rank = {"parameters": 400 // share, "gradients": 400 // share, "optimizer_state": 800 // share, "peak": 7}
        return {"memory_per_rank": [rank] * processes, "global_batch_size": 32, "samples_per_s": 320.0 / processes}

    def torchrun(cfg, processes, run_dir, overrides, threads, label):
        return summary(processes, dict(o.split("=", 1) for o in overrides), run_dir)

    def engines(function, n, cfg, run_dir, show, threads, **settings):
        Path(run_dir).mkdir(parents=True)
        Path(run_dir, "summary.json").write_text(json.dumps(summary(n, settings, run_dir)))
        return [{"run_dir": run_dir}] * n

    monkeypatch.setattr(scaling, "run_training", torchrun)
    monkeypatch.setattr(notebook_engines, "run_on_engines", engines)
    rows = memory.bench_memory(
        load_config("vit-tiny"),
        steps=7,
        out_dir=tmp_path,
        layouts=memory.LAYOUTS[:3],
        progress=False,
        on_engines=on_engines,
    )
    assert [processes for processes, _ in seen] == [1, 2, 2]
    assert [settings.get("data_parallel") for _, settings in seen] == [None, "ddp", "fsdp"]
    for _, settings in seen:
        assert (settings["max_steps"], settings["val_samples"]) == ("7", "64")
        if on_engines:  # (under torchrun run_training adds them itself)
            assert not settings["checkpoint_every"] and not settings["progress"] and not settings["resume"]
    assert [round(row["held_vs_ddp"], 2) for row in rows] == [1.0, 1.0, 0.5]
    assert [round(row["step_vs_ddp"], 2) for row in rows] == [1.0, 1.0, 1.0]


def test_stage_config_is_the_config_itself_at_its_own_size_and_a_smaller_set_otherwise(tmp_path, monkeypatch):
    from dlscale.lessons.lesson_tools import stage_config

    monkeypatch.chdir(tmp_path)
    assert stage_config(load_config("tiny").train_samples) == "tiny"
    small = load_config(stage_config(128))
    assert (small.train_samples, small.val_samples, small.image_size) == (128, 64, load_config("tiny").image_size)


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


def test_a_sharded_folder_written_with_nested_optimizer_groups_still_loads(tmp_path):
    """Folders keep the optimizer's settings per parameter (a pipeline's stages each find their own); a folder written
    before, with the ``param_groups`` nested, loads as it did: weights, moments and settings."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from dlscale.checkpoint.sharded import load_sharded_checkpoint

    def stepped(lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.8, 0.9) if lr < 0.1 else (0.9, 0.999))
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = stepped(0.01)
    model_state, optimizer_state = get_state_dict(model, optimizer)  # (nested: as folders were written before)
    folder = tmp_path / "ckpt-00000001"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.distributed is not up: one process is the intent)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder, no_dist=True)
    torch.save({"step": 1}, folder / "training.pt")
    torch.save({}, folder / "rng-rank00000.pt")
    fresh, fresh_optimizer = stepped(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rest = load_sharded_checkpoint(folder, fresh, fresh_optimizer)
    assert rest["step"] == 1 and "optimizer_layout" not in rest
    group = fresh_optimizer.param_groups[0]
    assert group["lr"] == 0.01 and tuple(group["betas"]) == (0.8, 0.9)
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_optimizer.state[fresh.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
