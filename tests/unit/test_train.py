"""The training loop in one process: configs, optimizers, resume, stopping and the model registry."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.checkpoint import CheckpointError, checkpoint_dir, list_checkpoints
from dlscale.metrics.noise_scale import noise_scale_of_rows
from dlscale.metrics.steplog import DivergedError
from dlscale.metrics.tracking import read_rows
from dlscale.runtime.devices import DeviceError, resolve_device
from dlscale.train import train


def losses(result):
    return [row["loss"] for row in result.steps]


def test_model_learns_on_a_tiny_config(tiny):
    result = train(tiny(epochs=4))
    steps = losses(result)
    assert len(steps) == result.total_steps == 4 * 1024 // 32
    assert sum(steps[-10:]) < 0.5 * sum(steps[:10])
    r2 = [row["r2"] for row in result.history]
    assert len(r2) == 4 and r2[-1] > r2[0] and r2[-1] > 0.5  # the blur makes 16x16 maps hard: ~0.56 after 4
    assert result.final["r2"] == r2[-1] and {"r2_log_amplitude", "r2_spectral_index"} <= set(result.final)
    assert result.samples_per_s > 0 and not result.preempted


def test_runs_are_deterministic_on_cpu(tiny):
    first = train(tiny(run_dir="runs/a"))
    second = train(tiny(run_dir="runs/b"))
    assert losses(first) == losses(second)
    assert first.final == second.final


def test_run_directory_holds_metrics_plot_config_and_checkpoints(tiny):
    result = train(tiny(plot=True, checkpoint_every=20, keep_checkpoints=2))
    run = result.run_dir
    for name in ("config.yaml", "metrics.csv", "validation.csv", "summary.json", "loss_curve.png"):
        assert (run / name).is_file(), name
    assert (run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(run / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == list(range(1, 65))
    assert set(rows[0]) == {"step", "epoch", "loss", "lr", "samples_per_s"}
    # 20, 40, 60 and the final 64 were written; the two newest are kept; nothing half-written is left
    assert [p.name for p in list_checkpoints(run)] == ["ckpt-00000060.pt", "ckpt-00000064.pt"]
    assert not list((run / "checkpoints").glob("*.tmp"))
    state = torch.load(run / "checkpoints/ckpt-00000064.pt", weights_only=True)
    assert state["position"]["step"] == 64
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "config"} <= set(state)


def test_warmup_starts_above_zero_and_lr_is_logged(tiny):
    result = train(tiny(warmup_steps=10, lr=0.01))
    lrs = [row["lr"] for row in result.steps]
    assert lrs[0] == pytest.approx(0.001) and lrs[10] == pytest.approx(0.01)
    assert lrs[-1] < 0.001  # cosine decay towards 0


def test_lr_scaling_sets_the_peak_and_warmup_starts_from_the_base_lr(tiny):
    result = train(
        tiny(
            lr=0.001,
            base_batch=8,
            global_batch_size=32,
            lr_scaling="linear",
            warmup_epochs=0.5,
            epochs=1,
            optimizer="lamb",
        )
    )
    lrs = [row["lr"] for row in result.steps]
    assert result.peak_lr == pytest.approx(0.004)
    assert lrs[0] == pytest.approx(0.001)  # Goyal et al.: warmup from the small-batch LR
    assert lrs[16] == pytest.approx(0.004)  # half an epoch of 32 steps
    sqrt = train(tiny(lr=0.001, base_batch=8, global_batch_size=32, lr_scaling="sqrt", max_steps=3))
    assert sqrt.peak_lr == pytest.approx(0.002)


@pytest.mark.parametrize("optimizer", ["sgd", "lars", "larc", "lamb"])
def test_every_optimizer_trains(tiny, optimizer):
    lr = {"sgd": 0.05, "lars": 1.0, "larc": 0.5, "lamb": 0.01}[optimizer]
    result = train(tiny(optimizer=optimizer, lr=lr, epochs=3))
    assert result.final["r2"] > 0.3, result.final
    ratios = read_rows(result.run_dir / "trust_ratios.csv")
    if optimizer == "sgd":
        assert ratios == []
    else:  # every 10 steps, one column per tensor; weights adapt (ratio != 1), biases never do
        assert [int(r["step"]) for r in ratios] == list(range(10, result.total_steps + 1, 10))
        assert any(r["features.0.0.weight"] != 1.0 for r in ratios) and all(r["head.2.bias"] == 1.0 for r in ratios)


@pytest.mark.parametrize("optimizer, lr", [("lars", 1.0), ("larc", 0.5), ("lamb", 0.01)])
def test_layerwise_runs_resume_exactly_from_their_checkpoints(tiny, optimizer, lr):
    """Finish a run, drop the checkpoints after step 40, resume: steps 41-64 replay identically."""
    settings = dict(optimizer=optimizer, lr=lr, checkpoint_every=20, keep_checkpoints=10, noise_scale_every=8)
    full = train(tiny(**settings))
    for path in list_checkpoints(full.run_dir):
        if int(path.name[5:13]) > 40:
            path.unlink()
    resumed = train(tiny(resume=True, **settings))
    assert losses(resumed) == losses(full)
    assert read_rows(resumed.run_dir / "noise_scale.csv")[-1]["b_simple"] == pytest.approx(
        full.noise_scale, nan_ok=True
    )


def test_noise_scale_is_measured_without_changing_the_run(tiny):
    plain = train(tiny(run_dir="runs/plain"))
    measured = train(tiny(run_dir="runs/noise", noise_scale_every=4))
    assert losses(measured) == losses(plain)  # the extra small batch leaves the trajectory alone
    rows = read_rows(measured.run_dir / "noise_scale.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 65, 4))
    assert rows[-1]["b_simple"] == pytest.approx(measured.noise_scale, nan_ok=True)
    assert noise_scale_of_rows(rows, until_step=32) > 0  # the steep first half gives a usable estimate


def test_fresh_start_replaces_an_earlier_run(tiny):
    train(tiny(epochs=2, checkpoint_every=10))
    result = train(tiny(epochs=1, checkpoint_every=0))
    assert [row["step"] for row in result.steps] == list(range(1, 33))
    assert [p.name for p in list_checkpoints(result.run_dir)] == ["ckpt-00000032.pt"]


def test_unreadable_newest_checkpoint_falls_back_to_the_previous(tiny, capsys):
    first = train(tiny(max_steps=40, checkpoint_every=20))
    newest = list_checkpoints("runs/tiny")[-1]
    newest.write_bytes(b"disk full")
    with pytest.warns(UserWarning, match="ckpt-00000040.pt could not be loaded"):
        resumed = train(tiny(max_steps=40, resume=True, checkpoint_every=20))
    assert "resuming from ckpt-00000020.pt" in capsys.readouterr().out
    assert losses(resumed) == losses(first)  # steps 21-40 were run again, identically


def test_pruning_after_a_fallback_keeps_the_good_checkpoint_and_sets_the_corrupt_one_aside(tiny, capsys):
    """keep_checkpoints=1 once counted the corrupt newest file as the one to keep and deleted every good one."""
    train(tiny(max_steps=40, checkpoint_every=10, keep_checkpoints=5))
    corrupt = list_checkpoints("runs/tiny")[-1]
    corrupt.write_bytes(b"a copy that broke off")
    with pytest.warns(UserWarning, match="ckpt-00000040.pt could not be loaded"):
        train(tiny(max_steps=35, resume=True, checkpoint_every=10, keep_checkpoints=1))
    assert [p.name for p in list_checkpoints("runs/tiny")] == ["ckpt-00000035.pt"]  # the one just written
    assert (Path("runs/tiny/checkpoints/unreadable") / corrupt.name).read_bytes() == b"a copy that broke off"
    assert f"{corrupt} could not be loaded when this run resumed; moved to" in capsys.readouterr().out
    train(tiny(max_steps=10, checkpoint_every=10))  # a fresh start clears what was set aside too
    assert not Path("runs/tiny/checkpoints/unreadable").exists()


def test_export_of_a_run_whose_newest_checkpoint_is_corrupt_falls_back_as_a_resume_does(tiny):
    from dlscale.checkpoint import load_model

    train(tiny(max_steps=40, checkpoint_every=20))
    older, newest = list_checkpoints("runs/tiny")
    expected = torch.load(older, weights_only=True)["model"]
    newest.write_bytes(b"a copy that broke off")
    with pytest.warns(UserWarning, match="ckpt-00000040.pt could not be loaded"):
        model = load_model("runs/tiny")
    assert all(torch.equal(model.state_dict()[name], value) for name, value in expected.items())


def test_a_run_folder_that_cannot_be_written_stops_before_training_in_one_line(in_tmp):
    """As an ordinary user (a user namespace where this account is not root, so the mode bits hold)."""
    (in_tmp / "runs/copy/checkpoints").mkdir(parents=True)
    (in_tmp / "runs/copy/checkpoints").chmod(0o555)
    command = [sys.executable, "-m", "dlscale", "train", "tiny", "run_dir=runs/copy", "progress=false"]
    if os.geteuid() == 0:
        command = ["unshare", "--user", "--map-user=1000", "--map-group=1000", *command]
    done = subprocess.run(command, cwd=in_tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == (
        "dlscale: error: runs/copy/checkpoints cannot be written (Permission denied): "
        "choose a run_dir you can write (run_dir=runs/<name>; on a cluster, under $SCRATCH)"
    )
    assert not (in_tmp / "data").exists()  # refused before the data were made


def test_every_checkpoint_unreadable_is_one_clear_error(tiny):
    train(tiny(max_steps=20, checkpoint_every=20))
    for path in list_checkpoints("runs/tiny"):
        path.write_bytes(b"")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no checkpoint in .* could be loaded"):
        train(tiny(resume=True))


def test_a_resume_on_other_data_is_refused_and_the_same_data_moved_is_not(tiny, capsys):
    """data_dir may change (data move, or are staged), but the shards must be the ones the run trained on."""
    import shutil

    from dlscale.config import ConfigError
    from dlscale.data import FieldSpec, generate_dataset, synthetic_dir

    cfg = tiny()
    train(tiny(max_steps=20, checkpoint_every=20))  # (makes the synthetic set, copied as "the user's data")
    shutil.copytree(synthetic_dir(cfg), "mine")
    generate_dataset(
        "other",
        FieldSpec(image_size=cfg.image_size, noise=cfg.noise),
        cfg.train_samples,
        cfg.val_samples,
        cfg.shard_size,
        seed=1,
        progress=False,
    )
    # trained on the synthetic set, resumed on a folder of other data: refused too (#61)
    with pytest.raises(
        ConfigError,
        match=r"the shards of data_dir=other are not the data it trained on \(the "
        r"synthetic set;",
    ):
        train(tiny(max_steps=40, resume=True, data_dir="other"))
    first = train(tiny(max_steps=40, checkpoint_every=20, data_dir="mine"))
    list_checkpoints("runs/tiny")[-1].unlink()  # (resume from step 20)
    with pytest.raises(
        ConfigError,
        match=r"belongs to another run: the shards of data_dir=other are not the data it "
        r"trained on \(data_dir=mine;",
    ):
        train(tiny(max_steps=40, resume=True, data_dir="other"))
    shutil.move("mine", "moved")
    resumed = train(tiny(max_steps=40, resume=True, data_dir="moved"))
    assert "resuming from ckpt-00000020.pt" in capsys.readouterr().out
    assert losses(resumed) == losses(first)


def test_resume_with_another_batch_size_is_refused(tiny):
    from dlscale.config import ConfigError

    train(tiny(max_steps=20, checkpoint_every=20))
    with pytest.raises(ConfigError, match="belongs to another run: global_batch_size 32 -> 64"):
        train(tiny(resume=True, global_batch_size=64))


def _finite(checkpoint):
    return all(torch.isfinite(v).all() for v in torch.load(checkpoint, weights_only=True)["model"].values())


def test_a_nan_map_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tiny):
    from dlscale.data import prepare_data

    data = prepare_data(tiny())
    x_path = data / "train/shard-00002-x.npy"
    maps = np.load(x_path)
    maps[7] = np.nan  # one map full of NaN, met at some step of the first epoch
    np.save(x_path, maps)
    with pytest.raises(DivergedError, match=r"loss became nan at step (\d+) .*dlscale data check") as caught:
        train(tiny(data_dir=str(data), checkpoint_every=1, keep_checkpoints=1000))
    bad_step = int(re.search(r"at step (\d+)", str(caught.value)).group(1))
    kept = list_checkpoints("runs/tiny")
    assert kept and _step_of(kept[-1]) == bad_step - 1  # every step before it was saved, none after
    assert all(_finite(path) for path in kept)
    assert all(row["step"] < bad_step for row in read_rows("runs/tiny/metrics.csv"))


def test_an_exploding_lr_stops_the_run_without_a_non_finite_checkpoint(tiny):
    with pytest.raises(DivergedError, match="at step .* Try a lower lr"):
        train(tiny(lr=1e12, optimizer="sgd", warmup_steps=0, checkpoint_every=1))
    assert all(_finite(path) for path in list_checkpoints("runs/tiny"))


# The two torches a machine without a GPU has: a CPU-only build, and PyPI's CUDA build for Linux (most
# laptops and login nodes), which sees no GPU. Each gets its own fix; neither a traceback nor a CPU run.
@pytest.mark.parametrize(
    "cuda, says",
    [
        (
            None,
            r"is a CPU-only build\. Install a GPU build.*or train on the CPU "
            r"with device=cpu",
        ),
        (
            "13.0",
            r"sees no GPU on this node: run on a GPU node .*CUDA_VISIBLE_DEVICES"
            r".*device=cpu",
        ),
    ],
)
def test_unavailable_gpu_is_one_clear_error_on_either_build(cuda, says, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(DeviceError, match=says) as caught:
        resolve_device("cuda")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("device=cuda was asked for, but this torch")
    assert resolve_device("auto").type == resolve_device("cpu").type == "cpu"


def test_a_gpu_index_past_those_visible_names_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"device=cuda:3 was asked for, but only 1 GPU\(s\) are visible"):
        resolve_device("cuda:3")


def _step_of(checkpoint):
    return int(checkpoint.name[5:13])


def test_a_fresh_start_clears_old_checkpoints_and_a_resume_keeps_them(tiny):
    train(tiny(max_steps=40, checkpoint_every=10, keep_checkpoints=10))
    (checkpoint_dir("runs/tiny") / ".ckpt-00000050.pt.tmp").write_bytes(b"half")  # a write cut short
    resumed = train(tiny(max_steps=40, resume=True, checkpoint_every=0, keep_checkpoints=10))
    assert resumed.steps_done == 40 and len(list_checkpoints("runs/tiny")) == 4  # nothing removed, nothing to redo
    train(tiny(max_steps=20, checkpoint_every=0))
    assert [p.name for p in checkpoint_dir("runs/tiny").iterdir()] == ["ckpt-00000020.pt"]


def test_cuda_random_state_is_this_devices_only(monkeypatch):
    """A rank that saw 4 GPUs saves its own device's generator, so it resumes on a node that sees 1.

    No GPU here: torch.cuda's generator calls are stood in for (the device tool checks the real ones).
    """
    from dlscale.checkpoint import rng_state, set_rng_state

    states = [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[torch.cuda.current_device()])
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(states))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("sets a state per visible GPU"))
    saved = rng_state()
    assert torch.equal(saved["cuda"], states[2])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the resume sees one GPU
    set_rng_state(saved)
    assert torch.equal(restored[-1], states[2])
    set_rng_state({**saved, "cuda": list(states)})  # an older checkpoint: one state per GPU, take this device's
    assert torch.equal(restored[-1], states[0])


def test_compile_wraps_ddp_so_the_all_reduce_overlaps_the_backward():
    """DDP first, then torch.compile of the DDP module (Dynamo's DDPOptimizer splits the graph at the
    buckets); the step's gradient sync still finds DDP's no_sync, and the plain model stays for checkpoints."""
    import torch.distributed as dist

    from dlscale.config import load_config
    from dlscale.distributed import DistEnv
    from dlscale.distributed.grad_sync import DDPSync, gradient_sync
    from dlscale.distributed.parallelize import build_step_model
    from dlscale.models import build_model

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = load_config("tiny", {"compile": True})
        model = build_model(cfg, 1, 2)
        two_ranks = DistEnv(world_size=2, backend="gloo")  # "2 ranks": DDP wraps
        step_model = build_step_model(model, two_ranks, cfg.sections.parallel, cfg.sections.model)
        assert isinstance(step_model, torch._dynamo.eval_frame.OptimizedModule)
        ddp = step_model._orig_mod
        assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel) and ddp.module is model
        _, sync = gradient_sync("ddp", step_model, torch.optim.SGD(model.parameters(), lr=0.1), model)
        assert isinstance(sync, DDPSync) and sync.module is ddp
    finally:
        dist.destroy_process_group()


def test_cuda_graphs_are_recorded_only_when_captured(tiny):
    """On a CPU nothing is captured, whatever was asked (on a GPU, inductor's skip counter decides)."""
    result = train(tiny(compile=True, cuda_graphs=True, max_steps=3, norm="group"))
    assert result.applied["compiled"] and not result.applied["cuda_graphs"] and not result.applied["ddp"]


def test_sync_batchnorm_with_compile_is_refused(tiny):
    from dlscale.config import ConfigError

    with pytest.raises(ConfigError, match="sync_batchnorm=true cannot be combined with compile=true"):
        tiny(sync_batchnorm=True, compile=True)


def test_a_model_is_added_without_touching_the_rest_of_the_kit(in_tmp):
    """A model of the tests' own, registered by name: configs, training and its refusals know it; nothing else
    changed. (MODELS keeps it for the rest of this process: the name is the test's.)"""
    from torch import nn

    from dlscale.config import ConfigError, load_config
    from dlscale.models import MODELS, build_model, register_model

    class PixelMLP(nn.Module):
        def __init__(self, in_channels: int, num_outputs: int, pixels: int, width: int):
            super().__init__()
            self.layers = nn.Sequential(
                nn.Flatten(), nn.Linear(in_channels * pixels, width), nn.ReLU(), nn.Linear(width, num_outputs)
            )

        def forward(self, x):
            return self.layers(x)

    def build(model, shape, outputs, seed):  # given the model section alone: a key of another section fails here
        return PixelMLP(shape[0], outputs, shape[1] * shape[2], model.width)

    register_model("pixel_mlp_for_tests", build)
    try:
        cfg = load_config("tiny", {"model": "pixel_mlp_for_tests", "width": 32, "epochs": 2})
        assert isinstance(build_model(cfg), PixelMLP)
        result = train(cfg, run_dir="runs/mlp", progress=False, plot=False)
        assert result.applied["model"] == "pixel_mlp_for_tests" and result.final["r2"] > 0
        with pytest.raises(ConfigError, match="tensor-parallel plan.*PixelMLP has none"):  # no units, no plan
            from dlscale.distributed.parallelize import apply_tensor_parallel

            apply_tensor_parallel(build_model(cfg), None)
        with pytest.raises(ConfigError, match="config key 'model' must be one of cnn, vit, pixel_mlp_for_tests"):
            load_config("tiny", {"model": "pixel_mpl"})
    finally:
        MODELS.pop("pixel_mlp_for_tests")
        from dlscale.config.train_config import MODEL_NAMES

        MODEL_NAMES.remove("pixel_mlp_for_tests")


def test_the_flops_are_counted_once_per_architecture_and_again_for_another(tiny, in_tmp):
    """Runs of the same model in one process (a sweep's rounds, a benchmark's turns) count its FLOPs once; another
    width is another architecture, counted anew, and its count is larger."""
    from dlscale.training import setup

    def flops(**overrides):
        result = train(tiny(max_steps=1, **overrides))
        return json.loads((result.run_dir / "summary.json").read_text())["flops_per_sample"]

    setup.model_flops.cache_clear()
    first, again, wider = flops(name="a"), flops(name="b"), flops(name="c", width=16)
    info = setup.model_flops.cache_info()
    assert (info.misses, info.hits) == (2, 1)
    assert first == again < wider


def test_the_stop_file_the_job_script_writes_stops_rank_0_as_the_signal_would(tmp_path):
    """Where only the batch shell gets Slurm's signal (podman-hpc --mpi, #59), slurm/launch.sh writes the request:
    rank 0 looks at most every STOP_FILE_EVERY_S seconds, takes it as the signal, and removes it (a requeued run
    must not stop again at once)."""
    from dlscale.training.preemption import STOP_FILE, STOP_FILE_EVERY_S, StopFlag

    now = [0.0]
    stop = StopFlag(tmp_path / STOP_FILE, clock=lambda: now[0])
    assert stop.poll() is False
    (tmp_path / STOP_FILE).write_text("SIGUSR1\n")
    now[0] += STOP_FILE_EVERY_S / 2
    assert stop.poll() is False  # (not looked for yet: one stat per interval on a shared file system)
    now[0] += STOP_FILE_EVERY_S
    assert stop.poll() is True and stop.signal_name == "SIGUSR1"
    assert stop.reason == "SIGUSR1 received by the job script (stop-requested)"
    assert not (tmp_path / STOP_FILE).exists()
    assert StopFlag(None).poll() is False  # the other ranks: rank 0 tells them through the agreement
