"""The one training loop: ``train(cfg) -> Result``.

The notebooks, ``dlscale train``, ``python -m dlscale.train`` and the Slurm scripts all
run this function. It reads top to bottom: device, data, model, optimizer and schedule,
resume, then the loop — step, log, validate at each epoch end, checkpoint — and a
summary. A SIGTERM or SIGUSR1 makes it checkpoint at the next step boundary and stop
(see :mod:`dlscale.preemption`); ``resume=true`` continues from the latest checkpoint
so that every later step logs the same loss an uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .checkpoint import load_latest_checkpoint, rng_state, save_checkpoint, set_rng_state
from .checkpoint import CheckpointError, clear_checkpoints
from .config import ConfigError, TrainConfig, load_config
from . import distributed, horovod_backend
from .data import make_loader, prepare_data, stage_data
from .distributed import DistributedError, all_reduce_max_flag, all_reduce_mean, all_reduce_sum
from .errors import DlscaleError
from .data.loader import target_names
from .models import build_model, count_parameters
from .optim import build_optimizer
from .precision import Precision
from .preemption import PREEMPTED_EXIT_CODE, StopFlag
from .profiling import StepProfiler, flops_per_sample, mfu, nvtx_backend, nvtx_range, peak_flops, peak_precision
from .noise_scale import NoiseScaleEstimator, grad_sq_norm, preserved_buffers
from .schedules import scale_lr, warmup_schedule
from .throughput import ThroughputMeter
from .tracking import TRAIN_FILE, VAL_FILE, MetricsLogger, read_rows

#: Step rows are written in blocks of this many, so the loss is fetched from the device once per block.
LOG_BLOCK = 10


class DeviceError(DlscaleError):
    """The requested device is not available here; the message says what to use instead."""


class DivergedError(DlscaleError):
    """The loss or the weights became non-finite; the message names the step and what to try."""


@dataclass
class Result:
    """What a run produced: final metrics, the whole history, and how fast it went."""

    config: TrainConfig
    run_dir: Path
    device: str
    final: dict[str, float]
    history: list[dict[str, float]] = field(repr=False)
    steps: list[dict[str, float]] = field(repr=False)
    samples_per_s: float
    steps_done: int
    total_steps: int
    seconds: float
    preempted: bool = False
    peak_lr: float = 0.0
    noise_scale: float = float("nan")
    applied: dict[str, Any] = field(default_factory=dict)
    mfu: float | None = None
    model: nn.Module | None = field(default=None, repr=False)

    def summary(self) -> str:
        """One paragraph for a terminal or a notebook."""
        status = "stopped on a signal (resume with resume=true)" if self.preempted else "finished"
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in self.final.items())
        return (f"run {self.config.name} {status}: step {self.steps_done}/{self.total_steps} on {self.device} "
                f"in {self.seconds:.1f} s, {self.samples_per_s:,.0f} samples/s\n"
                f"validation: {metrics or 'not yet run'}\nrun directory: {self.run_dir}")


def resolve_device(spec: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without it is a :class:`DeviceError`."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device={spec} was asked for, but this torch sees no CUDA GPU "
                              f"(torch {torch.__version__}); use device=auto or device=cpu, or run on a GPU node")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device={spec} was asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device, channels_last: bool = False,
             names: list[str] | None = None) -> dict[str, float]:
    """MSE and R² (mean and per target) of ``model`` over ``loader``.

    Built from sums (count, Σy, Σy², Σ squared error per target) so that ranks can
    add theirs before the division.
    """
    model.eval()
    sums = None
    dtype = next(model.parameters()).dtype
    for x, y in loader:
        x, y = _to_device(x, y, device, channels_last, dtype)
        pred = model(x).double()
        y = y.double()
        batch = torch.stack([torch.full_like(y[0], len(y)), y.sum(0), (y * y).sum(0), ((pred - y) ** 2).sum(0)])
        sums = batch if sums is None else sums + batch
    model.train()
    if sums is None:
        return {}
    count, total, squares, errors = all_reduce_sum(sums).cpu()  # every rank scored its own slice
    variance_sum = squares - total * total / count
    r2 = 1.0 - errors / variance_sum
    metrics = {"mse": float(errors.sum() / count.sum()), "r2": float(r2.mean())}
    for name, value in zip(names or [f"target_{i}" for i in range(len(r2))], r2.tolist()):
        metrics[f"r2_{name}"] = value
    return metrics


@torch.no_grad()
def predict(model: nn.Module, loader: Iterable, device: torch.device | str = "cpu",
            channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and targets over ``loader``, both on the CPU, in loader order."""
    model.eval()
    preds, targets = [], []
    dtype = next(model.parameters()).dtype
    for x, y in loader:
        x, _ = _to_device(x, y, torch.device(device), channels_last, dtype)
        preds.append(model(x).float().cpu())
        targets.append(y)
    model.train()
    return torch.cat(preds), torch.cat(targets)


def _small_batch_sq_norm(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         autocast: Any, scaler: torch.amp.GradScaler) -> float:
    """‖gradient‖² of the mean loss over a small batch, leaving the model exactly as it was.

    Batch-norm running statistics are put back, so a run that measures the noise scale
    follows the same trajectory as one that does not.
    """
    with preserved_buffers(model):
        with autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
    value = float(grad_sq_norm(model.parameters())) / scaler.get_scale() ** 2
    model.zero_grad(set_to_none=True)
    return value


def _is_channels_last(model: nn.Module) -> bool:
    """Whether the conv weights are in NHWC layout (a weight with one input channel is both, so it is skipped)."""
    weights = [p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1]
    return bool(weights) and all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
                                 for p in weights)


def _to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, channels_last: bool,
               dtype: torch.dtype = torch.float32):
    x = x.to(device, dtype, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device, dtype, non_blocking=True)


def _check_finite(losses: list[float], first_step: int, lr: float) -> None:
    """Stop with one message if a logged loss is NaN or infinite (before anything is checkpointed)."""
    bad = next((i for i, loss in enumerate(losses) if not np.isfinite(loss)), None)
    if bad is not None:
        raise DivergedError(
            f"the training loss became {losses[bad]} at step {first_step + bad} (lr {lr:.3g}); no checkpoint "
            f"was written from this point and the last good one is kept. Try a lower lr, a longer warmup "
            f"(warmup_steps), grad_clip=1.0 or precision=fp32, and check the data for NaN or inf values with "
            f"`dlscale data check DATA_DIR`; then continue from the last checkpoint with resume=true, or start "
            f"afresh with resume=false")


def _weights_are_finite(model: nn.Module) -> bool:
    return bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all())


def _as_config(cfg: TrainConfig | str | None, overrides: Mapping[str, Any]) -> TrainConfig:
    if isinstance(cfg, TrainConfig):
        return cfg.override(overrides) if overrides else cfg
    if cfg is None or isinstance(cfg, str):
        return load_config(cfg, overrides)
    raise ConfigError(f"train() takes a TrainConfig, a config name or path, or None; got {type(cfg).__name__}")


def _restore(ckpt: dict[str, Any], path: Path, steps_per_epoch: int, cfg: TrainConfig, model: nn.Module,
             optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
             noise: NoiseScaleEstimator) -> int:
    """Load a checkpoint's states into the live objects and return its step."""
    saved = ckpt["position"]
    if saved["steps_per_epoch"] != steps_per_epoch or saved["global_batch_size"] != cfg.global_batch_size:
        raise CheckpointError(
            f"checkpoint {path} was written with global_batch_size={saved['global_batch_size']} "
            f"({saved['steps_per_epoch']} steps per epoch), but this run has global_batch_size="
            f"{cfg.global_batch_size} ({steps_per_epoch} steps per epoch); resume with the same settings, "
            f"or start afresh with resume=false")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    noise.__dict__.update(ckpt.get("noise_scale", {}))
    return int(saved["step"])


def train(cfg: TrainConfig | str | None = None, /, **overrides: Any) -> Result:
    """Train the model a config describes and return its :class:`Result`.

    ``cfg`` is a :class:`TrainConfig`, a config name or YAML path, or None (defaults);
    keyword arguments override fields: ``train("tiny", epochs=2)``.
    """
    cfg = _as_config(cfg, overrides)
    started = time.perf_counter()
    requested = resolve_device(cfg.device)  # a clear error if the device is not there
    owns_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    env = distributed.init("auto" if cfg.device == "auto" else str(requested),
                           None if cfg.dist_backend == "auto" else cfg.dist_backend, cfg.dist_timeout_s,
                           data_parallel=cfg.data_parallel)
    # Horovod stays up for the life of the process (it cannot always start again after a shutdown).
    owns_group = owns_group and env.backend != "horovod"
    finished = False
    try:
        result = _train(cfg, env, started)
        finished = True
        return result
    except RuntimeError as err:
        if not env.distributed or isinstance(err, DlscaleError):
            raise
        raise DistributedError(f"rank {env.rank} of {env.world_size} stopped: a collective operation failed "
                               f"({str(err).splitlines()[0][:200]}). Another rank probably died or was killed; "
                               f"resume with resume=true from the last checkpoint") from None
    finally:
        if owns_group:
            distributed.shutdown(drain=finished)  # after a failure a peer may be gone: no barrier


def _train(cfg: TrainConfig, env: distributed.DistEnv, started: float) -> Result:
    rank, world_size, is_main = env.rank, env.world_size, env.is_main
    device = torch.device(env.device)
    seed_everything(cfg.seed)
    run_dir = cfg.resolved_run_dir

    # -- data and model --------------------------------------------------------
    if is_main:  # one rank generates the synthetic set; the others wait and then find it
        prepare_data(cfg)
    distributed.barrier()
    data_root = prepare_data(cfg)
    if cfg.stage_dir:  # one copy per node
        if env.local_rank == 0:
            stage_data(data_root, cfg.stage_dir, progress=cfg.progress and is_main)
        distributed.barrier()
        data_root = stage_data(data_root, cfg.stage_dir)
    train_loader = make_loader(cfg, rank, world_size, "train", device, data_root)
    val_loader = make_loader(cfg, rank, world_size, "val", device, data_root)
    dataset = train_loader.dataset
    names = target_names(data_root, dataset.num_targets)
    model = build_model(cfg, dataset.input_shape[0], dataset.num_targets)
    if cfg.sync_batchnorm:
        if device.type != "cuda":
            raise ConfigError("sync_batchnorm=true needs GPUs (torch's SyncBatchNorm is CUDA-only); on CPUs use norm=group")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    policy = Precision.resolve(cfg.precision, device)
    model = model.to(device, policy.param_dtype)
    loss_fn = nn.MSELoss()
    # Counted before Horovod hooks the gradients: its extra backward pass would set off an all-reduce.
    flops = flops_per_sample(model, dataset.input_shape, loss_fn, dataset.num_targets)
    peak_lr = scale_lr(cfg.lr, cfg.base_batch, cfg.global_batch_size, cfg.lr_scaling)
    optimizer = build_optimizer(cfg, model, lr=peak_lr)
    accumulation = cfg.grad_accumulation
    # Under Horovod the optimizer all-reduces (``sync.synchronize()``); under DDP the model does and sync is None.
    optimizer, sync = distributed.wrap_optimizer(optimizer, model, env, cfg.horovod_fp16_compression, accumulation)
    steps_per_epoch = len(train_loader) // accumulation
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    warmup = round(cfg.warmup_epochs * steps_per_epoch) if cfg.warmup_epochs else cfg.warmup_steps
    start_factor = cfg.warmup_start_factor or (cfg.lr / peak_lr if peak_lr > cfg.lr else None)
    scheduler = warmup_schedule(optimizer, min(warmup, total_steps), total_steps, cfg.decay, start_factor)
    noise = NoiseScaleEstimator(decay=0.9)
    if cfg.noise_scale_every and train_loader.batch_size < 2:
        raise ConfigError("noise_scale_every needs a per-rank batch of at least 2 samples")
    if cfg.noise_scale_every and sync is not None:
        raise ConfigError("noise_scale_every works with DDP only: under Horovod its extra backward pass would set "
                          "off an all-reduce; launch with torchrun/srun/mpirun, or set noise_scale_every=0")
    scaler = policy.grad_scaler()  # enabled only for fp16; otherwise its calls pass straight through
    autocast = policy.autocast
    # The plain module is kept for checkpoints and evaluation; the compiled (and DDP-wrapped) one trains.
    step_model = build_step_model(model, env, cfg)
    graph_skips = _cuda_graph_skips() if cfg.cuda_graphs else 0

    # -- resume or start afresh ------------------------------------------------
    # A resume never removes a checkpoint: the newest stays until a newer one is renamed into
    # place (save_checkpoint), so a run that dies again before its next one resumes from the
    # same point. Only a fresh start clears the checkpoints of an earlier run in this folder.
    step, resume_from = 0, None
    if cfg.resume:
        found = load_latest_checkpoint(run_dir)
        if found:
            resume_from, ckpt = found
            step = _restore(ckpt, resume_from, steps_per_epoch, cfg, model, optimizer, scheduler, scaler, noise)
            del ckpt
    elif is_main:
        clear_checkpoints(run_dir)
    distributed.barrier()  # every rank has loaded (or rank 0 has cleared) before any rank goes on
    first_step = step
    if sync is not None:  # Horovod's idiom: every rank starts from rank 0's state
        horovod_backend.broadcast_initial_state(model, optimizer, resumed=resume_from is not None)
    if is_main:
        cfg.save(run_dir / "config.yaml")
    logger = MetricsLogger(cfg, run_dir, resume_step=step if resume_from else None, is_main=is_main,
                           val_columns=["mse", "r2", *(f"r2_{n}" for n in names)])
    applied = {
        "device": str(device), "precision": policy.name, "grad_scaler": scaler.is_enabled(),
        "channels_last": _is_channels_last(model),
        "compiled": cfg.compile, "cuda_graphs": False,  # known after the first steps
        "world_size": world_size, "launcher": env.launcher, "backend": env.backend,
        "ddp": isinstance(step_model, nn.parallel.DistributedDataParallel), "horovod": sync is not None,
        "horovod_fp16_compression": sync is not None and cfg.horovod_fp16_compression,
        "optimizer": type(optimizer).__name__,
        "optimizer_foreach": bool(optimizer.defaults.get("foreach")),
        "optimizer_fused": bool(optimizer.defaults.get("fused")), "num_workers": train_loader.num_workers,
        "pin_memory": train_loader.pin_memory, "data_dir": str(data_root), "nvtx": nvtx_backend(),
    }
    if is_main:
        where = f"resuming from {resume_from.name} at step {step}" if resume_from else "starting afresh"
        print(f"dlscale: {cfg.name} on {env.describe()}, {count_parameters(model):,} parameters, {len(dataset):,} maps "
              f"{tuple(dataset.input_shape)} from {data_root}, {total_steps} steps of batch "
              f"{cfg.global_batch_size}, {cfg.optimizer} at peak lr {peak_lr:.3g}, {policy.name}"
              f"{', compiled' if applied['compiled'] else ''}; {where}; writing to {run_dir}", flush=True)

    def checkpoint() -> None:
        if not _weights_are_finite(model):  # a finite loss can still come before an exploding update
            raise DivergedError(f"the weights became non-finite by step {step} (lr {lr:.3g}); the checkpoint of "
                                f"this step was not written and the last good one is kept. Try a lower lr, a "
                                f"longer warmup, grad_clip=1.0 or precision=fp32, then resume=true")
        if is_main:
            save_checkpoint(run_dir, step, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(),
                "position": {"step": step, "steps_per_epoch": steps_per_epoch,
                             "global_batch_size": cfg.global_batch_size},
                "config": cfg.to_dict(), "noise_scale": dict(noise.__dict__),
            }, keep=cfg.keep_checkpoints)

    # -- the loop --------------------------------------------------------------
    meter = ThroughputMeter()
    pending: list[tuple[int, int, torch.Tensor, float, float]] = []
    # Layer-wise optimizers expose their trust ratios; one row per LOG_BLOCK steps, for lesson 07's plot.
    layer_names = {p: n for n, p in model.named_parameters()}
    ratio_columns = ([layer_names[p] for g in optimizer.param_groups for p in g["params"]]
                     if hasattr(optimizer, "trust_ratios") else [])
    pending_ratios: list[tuple[int, torch.Tensor]] = []

    def flush() -> float | None:
        """Write the pending step rows, fetching their losses from the device in one go."""
        if not pending:
            return None
        losses = all_reduce_mean(torch.stack([row[2] for row in pending]).float()).tolist()  # the global batch's loss
        _check_finite(losses, pending[0][0], pending[0][3])  # every rank sees the same mean, so all stop together
        logger.log_steps([dict(step=s, epoch=e, loss=loss, lr=lr, samples_per_s=sps)
                          for (s, e, _, lr, sps), loss in zip(pending, losses)])
        pending.clear()
        for ratio_step, ratios in pending_ratios:
            logger.log_trust_ratios(ratio_columns, {"step": ratio_step, **dict(zip(ratio_columns, ratios.tolist()))})
        pending_ratios.clear()
        return losses[-1]

    bar = tqdm(total=total_steps, initial=step, desc=cfg.name, unit="step", disable=not (is_main and cfg.progress),
               dynamic_ncols=True, file=sys.stderr)
    say = bar.write if is_main else (lambda *args, **kwargs: None)
    preempted = False
    window = cfg.profile_steps or (0, 0)
    # Every rank opens the nsys capture range; the main rank also writes the torch trace.
    profiler = StepProfiler(run_dir, *window, device, trace=is_main, first_step=step)
    model.train()
    with StopFlag() as stop, profiler:
        while step < total_steps and not preempted:
            epoch, epoch_step = divmod(step, steps_per_epoch)
            train_loader.sampler.set_position(epoch, epoch_step * cfg.per_rank_batch(world_size))
            batches = iter(train_loader)
            while True:
                optimizer.zero_grad()  # (Horovod's zero_grad takes no arguments; None gradients is the default)
                loss = None
                for micro in range(accumulation):
                    with nvtx_range("data"):
                        batch = next(batches, None)
                        if batch is None:
                            break
                        x, y = _to_device(*batch, device, cfg.channels_last, policy.param_dtype)
                    measuring = cfg.noise_scale_every and step % cfg.noise_scale_every == 0
                    if measuring:
                        small = len(x) // 4 or 1
                        small_sq = _small_batch_sq_norm(model, loss_fn, x[:small], y[:small], autocast, scaler)
                    # Inner micro-batches keep their gradients local; DDP all-reduces after the last one.
                    inner = applied["ddp"] and micro < accumulation - 1
                    with (step_model.no_sync() if inner else contextlib.nullcontext()):
                        with nvtx_range("forward"), autocast():
                            micro_loss = loss_fn(step_model(x), y)
                            if accumulation > 1:
                                micro_loss = micro_loss / accumulation
                        with nvtx_range("backward"):
                            scaler.scale(micro_loss).backward()
                    loss = micro_loss.detach() if loss is None else loss + micro_loss.detach()
                if batch is None:
                    break
                with nvtx_range("optimizer"):
                    if sync is not None:  # wait for Horovod's all-reduce before the gradients are read
                        with nvtx_range("allreduce"):
                            sync.synchronize()
                    if cfg.grad_clip or measuring:
                        scaler.unscale_(optimizer)
                    if measuring:
                        g2, trace = noise.update(small_sq, small, float(grad_sq_norm(model.parameters())),
                                                 len(x) * world_size)  # after DDP, the gradient of the global batch
                        logger.log_noise_scale({"step": step + 1, "g2": g2, "trace": trace,
                                                "b_simple": noise.b_simple})
                    if cfg.grad_clip:
                        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    lr = optimizer.param_groups[0]["lr"]
                    with horovod_backend.skip_synchronize(sync):
                        scaler.step(optimizer)
                    scaler.update()
                    scheduler.step()
                step += 1
                profiler.step(step)
                if ratio_columns and step % LOG_BLOCK == 0:
                    ratios = torch.cat(optimizer.trust_ratios)
                    if len(ratios) == len(ratio_columns):  # (a parameter without a gradient would shift columns)
                        pending_ratios.append((step, ratios))
                meter.step(len(x) * accumulation)
                pending.append((step, epoch, loss.detach(), lr, meter.last_rate * world_size))
                bar.update()
                if len(pending) >= LOG_BLOCK:
                    bar.set_postfix(loss=f"{flush():.4f}", lr=f"{lr:.2e}")
                end_of_epoch = step % steps_per_epoch == 0 or step == total_steps
                if end_of_epoch:
                    flush()
                    metrics = evaluate(model, val_loader, device, cfg.channels_last, names)
                    logger.log_validation({"epoch": epoch + 1, "step": step, **metrics})
                    say(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                    meter.pause()
                # A signal may reach only some ranks: with several, they agree at block boundaries.
                if (stop.requested if not env.distributed else
                        step % LOG_BLOCK == 0 and all_reduce_max_flag(stop.requested, device)):
                    say(f"dlscale: {stop.signal_name or 'a stop signal'} received; checkpointing at step {step} "
                        f"and stopping")
                    preempted = True
                if preempted or step == total_steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                    flush()
                    checkpoint()
                    meter.pause()
                if preempted or end_of_epoch:
                    break
    bar.close()
    flush()
    # Inductor skips CUDA graphs it cannot capture safely (batch norm mutates its running
    # statistics, for one), so whether they were applied is read back, not assumed.
    applied["cuda_graphs"] = (cfg.compile and cfg.cuda_graphs and device.type == "cuda"
                              and step > first_step and _cuda_graph_skips() == graph_skips)

    # -- summary ---------------------------------------------------------------
    # Rank 0 wrote the files; it hands their rows to the others (which may not share its file system).
    history, step_rows = distributed.broadcast_object(
        (read_rows(run_dir / VAL_FILE), read_rows(run_dir / TRAIN_FILE)) if is_main else None)
    final = {k: v for k, v in history[-1].items() if k not in ("epoch", "step")} if history else {}
    # float32 convolutions on an Ampere or newer GPU run on TF32 tensor cores: MFU is against that peak.
    peak_name = peak_precision(device, policy.name)
    peak = peak_flops(device, peak_name)
    utilisation = mfu(meter.samples_per_s, flops, peak)  # per device
    result = Result(config=cfg, run_dir=run_dir, device=str(device), final=final, history=history,
                    steps=step_rows, samples_per_s=meter.aggregate(world_size), steps_done=step,
                    total_steps=total_steps, seconds=time.perf_counter() - started, preempted=preempted,
                    model=model, peak_lr=peak_lr, noise_scale=noise.b_simple, applied=applied, mfu=utilisation)
    if is_main:
        summary = {"samples_per_s": result.samples_per_s, "samples_per_s_per_rank": meter.samples_per_s,
                   "world_size": world_size, "nodes": max(1, world_size // max(1, env.local_world_size)),
                   "global_batch_size": cfg.global_batch_size, "steps_done": step, "total_steps": total_steps,
                   "seconds": result.seconds, "device": str(device), "preempted": preempted, "peak_lr": peak_lr,
                   "flops_per_sample": flops, "mfu": utilisation,
                   "mfu_peak": {"precision": peak_name, "flops_per_s": peak}, "applied": applied,
                   **({"noise_scale": noise.b_simple} if cfg.noise_scale_every else {}), **final}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        logger.summary(summary)
        if cfg.plot and not preempted:
            from .plots import loss_curves
            loss_curves(run_dir, title=f"{cfg.name}: global batch {cfg.global_batch_size} on {device}").savefig(
                run_dir / "loss_curve.png", dpi=120)
        print(result.summary(), flush=True)
    logger.close()
    return result


def build_step_model(model: nn.Module, env: distributed.DistEnv, cfg: TrainConfig) -> nn.Module:
    """The module the training step calls: ``model`` compiled when asked, then wrapped in DDP.

    The order is PyTorch's guidance: torch.compile does not trace DDP's hooks well, so the
    inner module is compiled and DDP wraps the result. ``model`` itself stays plain, for
    checkpoints and evaluation.
    """
    inner = torch.compile(model, mode="reduce-overhead" if cfg.cuda_graphs else None) if cfg.compile else model
    return distributed.wrap_model(inner, env, cfg.bucket_cap_mb, cfg.gradient_as_bucket_view, cfg.static_graph)


def _cuda_graph_skips() -> int:
    """How many times inductor has declined to capture a CUDA graph in this process."""
    from torch._dynamo.utils import counters
    return counters["inductor"]["cudagraph_skips"]


def train_quietly(cfg: TrainConfig) -> Result:
    """:func:`train` with its console lines saved to ``output.log`` in the run directory (for sweeps)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        result = train(cfg)
    (result.run_dir / "output.log").write_text(output.getvalue())
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m dlscale.train [CONFIG] [key=value ...]``: the same as ``dlscale train``."""
    from .cli import main as cli_main
    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
