"""The one training loop: ``train(cfg) -> Result``.

The notebooks, ``dlscale train``, ``python -m dlscale.train`` and the Slurm scripts all
run this function. It reads top to bottom:

- :func:`_setup` builds a :class:`Run`: device, data, model, optimizer and schedule,
  precision, the module the step calls (compiled, DDP-wrapped), resume or a fresh start;
- :func:`train_step` takes **one optimizer step** over its micro-batches;
- :func:`_loop` calls it, logs, validates at each epoch end, checkpoints, and stops on a
  signal (SIGTERM/SIGUSR1, see :mod:`dlscale.preemption`) after a checkpoint;
- :func:`_finish` writes the summary and returns the :class:`Result`.

``resume=true`` continues from the latest checkpoint so that every later step logs the same
loss an uninterrupted run would. The optional measurements (the gradient noise scale, the
layer-wise trust ratios) are small objects the step and the loop call explicitly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import distributed, horovod_backend
from .checkpoint import (CheckpointError, clear_checkpoints, load_latest_checkpoint, restore_training, save_checkpoint,
                         training_extras, training_state)
from .config import ConfigError, TrainConfig, load_config
from .data.loader import rank_loaders, target_names
from .devices import DeviceError, resolve_device, to_device  # noqa: F401 - DeviceError is part of train's API
from .distributed import DistributedError, all_reduce_max_flag
from .dtensors import clip_grad_norm_, local
from .errors import DlscaleError
from .evaluation import evaluate, predict  # noqa: F401 - predict is part of train's API (lesson 01)
from .models import build_model, count_parameters, is_channels_last
from .noise_scale import NoiseScaleEstimator, NoiseScaleProbe
from .optim import build_optimizer
from .memory import memory_row
from .parallel import Layout, build_step_model, cuda_graph_skips, plan
from .precision import Precision
from .preemption import StopFlag
from .result import Result
from .profiling import StepProfiler, flops_per_sample, mfu, nvtx_backend, nvtx_range, peak_flops, peak_precision
from .schedules import scale_lr, warmup_schedule
from .steplog import LOG_BLOCK, DivergedError, StepLog
from .throughput import ThroughputMeter
from .threads import ThreadChoice, apply_threads
from .tracking import TRAIN_FILE, VAL_FILE, MetricsLogger, read_rows


@dataclass
class Run:
    """Everything one training run works with, built once by :func:`_setup`."""

    cfg: TrainConfig
    env: distributed.DistEnv
    layout: Layout                 # how the ranks share the work (DDP, FSDP, tensor parallel)
    device: torch.device
    model: nn.Module               # for checkpoints and evaluation: plain, or itself sharded under FSDP/TP
    step_model: nn.Module          # what the step calls: compiled and/or DDP-wrapped; the model under FSDP/TP
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    sync: Any                      # Horovod's optimizer to synchronize(), or None under DDP
    scheduler: Any
    scaler: torch.amp.GradScaler
    policy: Precision
    train_loader: Any
    val_loader: Any
    names: list[str]
    steps_per_epoch: int
    total_steps: int
    peak_lr: float
    flops: float
    noise: NoiseScaleEstimator
    step: int = 0
    first_step: int = 0            # where this process started (the resumed step, or 0)
    graph_skips: int = 0           # inductor's CUDA-graph skips before the first step
    threads: ThreadChoice | None = None  # torch's CPU threads in this process, and why
    resumed_from: Path | None = None
    logger: MetricsLogger | None = None
    log: StepLog | None = None
    noise_probe: NoiseScaleProbe | None = None
    applied: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.cfg.resolved_run_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -- the step ------------------------------------------------------------------------------------------

def train_step(run: Run, batches: Iterator) -> tuple[torch.Tensor, int] | None:
    """One optimizer step over ``grad_accumulation`` micro-batches: (its loss, samples), or None at the epoch's end.

    Zero the gradients; forward and backward on each micro-batch (DDP all-reduces after the
    last one only); then, through the grad scaler (a pass-through unless fp16), unscale,
    clip, step the optimizer and the LR schedule.
    """
    cfg, accumulation = run.cfg, run.cfg.grad_accumulation
    run.optimizer.zero_grad()  # (Horovod's zero_grad takes no arguments; None gradients is the default)
    measuring = run.noise_probe is not None and run.noise_probe.due(run.step)
    loss = None
    for micro in range(accumulation):
        with nvtx_range("data"):
            batch = next(batches, None)
            if batch is None:
                return None
            x, y = to_device(*batch, run.device, cfg.channels_last, run.policy.param_dtype)
        if measuring:
            run.noise_probe.measure_small_batch(run.model, run.loss_fn, x, y, run.policy.autocast, run.scaler)
        inner = run.applied["ddp"] and micro < accumulation - 1  # inner micro-batches keep their gradients local
        with (run.step_model.no_sync() if inner else contextlib.nullcontext()):
            with nvtx_range("forward"), run.policy.autocast():
                micro_loss = run.loss_fn(run.step_model(x), y)
                if accumulation > 1:
                    micro_loss = micro_loss / accumulation
            with nvtx_range("backward"):
                run.scaler.scale(micro_loss).backward()
        loss = micro_loss.detach() if loss is None else loss + micro_loss.detach()
    with nvtx_range("optimizer"):
        if run.sync is not None:  # wait for Horovod's all-reduce before the gradients are read
            with nvtx_range("allreduce"):
                run.sync.synchronize()
        if cfg.grad_clip or measuring:
            run.scaler.unscale_(run.optimizer)
        if measuring:  # after DDP: the gradient of the global batch
            run.noise_probe.measure_global_batch(run.model, len(x) * run.layout.data_ranks, run.step + 1)
        if cfg.grad_clip:  # (the norm of the whole gradients, also where each rank holds a shard)
            clip_grad_norm_(list(run.model.parameters()), cfg.grad_clip)
        with horovod_backend.skip_synchronize(run.sync):
            run.scaler.step(run.optimizer)
        run.scaler.update()
        run.scheduler.step()
    return loss, len(x) * accumulation


# -- the loop ------------------------------------------------------------------------------------------

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
        run = _setup(cfg, env)
        preempted, meter = _loop(run)
        result = _finish(run, meter, preempted, started)
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


def _loop(run: Run) -> tuple[bool, ThroughputMeter]:
    """Steps until the last one or a stop signal; returns (preempted, the throughput meter)."""
    cfg, env = run.cfg, run.env
    meter, preempted = ThroughputMeter(), False
    bar = tqdm(total=run.total_steps, initial=run.step, desc=cfg.name, unit="step", dynamic_ncols=True,
               disable=not (env.is_main and cfg.progress), file=sys.stderr)
    say = bar.write if env.is_main else (lambda *args, **kwargs: None)
    # Every rank opens the nsys capture range; the main rank also writes the torch trace.
    profiler = StepProfiler(run.run_dir, *(cfg.profile_steps or (0, 0)), run.device, trace=env.is_main,
                            first_step=run.step)
    run.model.train()
    with StopFlag() as stop, profiler:
        while run.step < run.total_steps and not preempted:
            epoch, epoch_step = divmod(run.step, run.steps_per_epoch)
            run.train_loader.sampler.set_position(epoch, epoch_step * cfg.per_rank_batch(run.layout.data_ranks))
            batches = iter(run.train_loader)
            while True:
                lr = run.optimizer.param_groups[0]["lr"]  # the LR this step uses
                done = train_step(run, batches)
                if done is None:
                    break
                loss, samples = done
                run.step += 1
                profiler.step(run.step)
                run.log.add_trust_ratios(run.step, run.optimizer)
                meter.step(samples)
                run.log.add(run.step, epoch, loss, lr, meter.last_rate * run.layout.data_ranks)
                bar.update()
                if run.log.full:
                    bar.set_postfix(loss=f"{run.log.flush():.4f}", lr=f"{lr:.2e}")
                end_of_epoch = run.step % run.steps_per_epoch == 0 or run.step == run.total_steps
                if end_of_epoch:
                    _validate(run, epoch, say)
                    meter.pause()
                # A signal may reach only some ranks: with several, they agree at block boundaries.
                if (stop.requested if not env.distributed else
                        run.step % LOG_BLOCK == 0 and all_reduce_max_flag(stop.requested, run.device)):
                    say(f"dlscale: {stop.signal_name or 'a stop signal'} received; checkpointing at step "
                        f"{run.step} and stopping")
                    preempted = True
                every = cfg.checkpoint_every
                if preempted or run.step == run.total_steps or (every and run.step % every == 0):
                    _checkpoint(run, lr)
                    meter.pause()
                if preempted or end_of_epoch:
                    break
    bar.close()
    run.log.flush()
    return preempted, meter


def _validate(run: Run, epoch: int, say: Any) -> None:
    run.log.flush()
    metrics = evaluate(run.model, run.val_loader, run.device, run.cfg.channels_last, run.names)
    run.logger.log_validation({"epoch": epoch + 1, "step": run.step, **metrics})
    say(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


def _checkpoint(run: Run, lr: float) -> None:
    """Write the pending rows, then the checkpoint of this step, never one with non-finite weights.

    Rank 0 writes the whole state; under FSDP or tensor parallelism every rank writes its shards.
    """
    run.log.flush()  # (stops the run first if a pending loss is not finite)
    finite = bool(torch.stack([torch.isfinite(local(p)).all() for p in run.model.parameters()]).all())
    if run.layout.sharded:  # each rank sees only its shards: all must be finite
        finite = not all_reduce_max_flag(not finite, run.device)
    if not finite:
        # a finite loss can still come before an exploding update
        raise DivergedError(f"the weights became non-finite by step {run.step} (lr {lr:.3g}); the checkpoint of "
                            f"this step was not written and the last good one is kept. Try a lower lr, a "
                            f"longer warmup, grad_clip=1.0 or precision=fp32, then resume=true", step=run.step)
    if run.layout.sharded:
        from .sharded_checkpoint import save_sharded_checkpoint
        save_sharded_checkpoint(run.run_dir, run.step, run.model, run.optimizer, training_extras(
            run.step, run.steps_per_epoch, run.cfg, run.scheduler, run.scaler, run.noise), keep=run.cfg.keep_checkpoints)
    elif run.env.is_main:
        save_checkpoint(run.run_dir, run.step, training_state(
            run.step, run.steps_per_epoch, run.cfg, run.model, run.optimizer, run.scheduler, run.scaler, run.noise),
            keep=run.cfg.keep_checkpoints)


# -- setup ---------------------------------------------------------------------------------------------

def _setup(cfg: TrainConfig, env: distributed.DistEnv) -> Run:
    """Data, model, optimizer, schedule and precision; then resume or a fresh start, and the logs."""
    device = torch.device(env.device)
    threads = apply_threads(requested=cfg.threads)  # before any kernel runs: from the CPUs this process was given
    seed_everything(cfg.seed)
    layout = plan(cfg, env)
    train_loader, val_loader, data_root = rank_loaders(cfg, env, device, layout.data_rank, layout.data_ranks)
    if layout.sharded and cfg.val_samples % layout.data_ranks:
        # (every rank must run as many forward passes: FSDP gathers each block from all of them)
        raise ConfigError(f"val_samples={cfg.val_samples} must split evenly over the {layout.data_ranks} "
                          f"data-parallel ranks with FSDP or tensor parallelism; choose a multiple of "
                          f"{layout.data_ranks}")
    dataset = train_loader.dataset
    model = build_model(cfg, dataset.input_shape[0], dataset.num_targets)
    if cfg.sync_batchnorm:
        if device.type != "cuda":
            raise ConfigError("sync_batchnorm=true needs GPUs (torch's SyncBatchNorm is CUDA-only); on CPUs use norm=group")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    policy = Precision.resolve(cfg.precision, device)
    if layout.data_parallel == "fsdp" and policy.name == "bf16":
        policy = dataclasses.replace(policy, fsdp_casts=True)
    model = model.to(device, policy.param_dtype)
    loss_fn = nn.MSELoss()
    # Counted before Horovod hooks the gradients (its extra backward pass would set off an all-reduce)
    # and before FSDP or TP split the model.
    flops = flops_per_sample(model, dataset.input_shape, loss_fn, dataset.num_targets)
    # Before the optimizer: FSDP and tensor parallelism replace the parameters by DTensors.
    step_model = build_step_model(model, env, cfg, layout, policy)
    peak_lr = scale_lr(cfg.lr, cfg.base_batch, cfg.global_batch_size, cfg.lr_scaling)
    optimizer = build_optimizer(cfg, model, lr=peak_lr)
    # Under Horovod the optimizer all-reduces (``sync.synchronize()``); under DDP the model does and sync is None.
    optimizer, sync = distributed.wrap_optimizer(optimizer, model, env, cfg.horovod_fp16_compression,
                                                 cfg.grad_accumulation)
    steps_per_epoch = len(train_loader) // cfg.grad_accumulation
    total_steps = min(cfg.epochs * steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch)
    warmup = round(cfg.warmup_epochs * steps_per_epoch) if cfg.warmup_epochs else cfg.warmup_steps
    start_factor = cfg.warmup_start_factor or (cfg.lr / peak_lr if peak_lr > cfg.lr else None)
    scheduler = warmup_schedule(optimizer, min(warmup, total_steps), total_steps, cfg.decay, start_factor)
    if cfg.noise_scale_every and train_loader.batch_size < 2:
        raise ConfigError("noise_scale_every needs a per-rank batch of at least 2 samples")
    if cfg.noise_scale_every and sync is not None:
        raise ConfigError("noise_scale_every works with DDP only: under Horovod its extra backward pass would set "
                          "off an all-reduce; launch with torchrun/srun/mpirun, or set noise_scale_every=0")
    run = Run(cfg=cfg, env=env, layout=layout, device=device, model=model, step_model=step_model,
              loss_fn=loss_fn, optimizer=optimizer, sync=sync, scheduler=scheduler, policy=policy,
              scaler=policy.grad_scaler(),  # enabled only for fp16; otherwise its calls pass straight through
              train_loader=train_loader, val_loader=val_loader, names=target_names(data_root, dataset.num_targets),
              steps_per_epoch=steps_per_epoch, total_steps=total_steps, peak_lr=peak_lr, flops=flops,
              noise=NoiseScaleEstimator(decay=0.9))
    run.graph_skips = cuda_graph_skips() if cfg.cuda_graphs else 0
    run.threads = threads
    _resume_or_start_afresh(run)
    if env.is_main:
        cfg.save(run.run_dir / "config.yaml")
    run.logger = MetricsLogger(cfg, run.run_dir, resume_step=run.step if run.resumed_from else None,
                               is_main=env.is_main, val_columns=["mse", "r2", *(f"r2_{n}" for n in run.names)])
    layer_names = {p: n for n, p in model.named_parameters()}
    run.log = StepLog(run.logger, [layer_names[p] for g in optimizer.param_groups for p in g["params"]]
                      if hasattr(optimizer, "trust_ratios") else [])
    if cfg.noise_scale_every:
        run.noise_probe = NoiseScaleProbe(cfg.noise_scale_every, run.noise, run.logger.log_noise_scale)
    run.applied = _applied(run, data_root)
    if env.is_main:
        where = f"resuming from {run.resumed_from.name} at step {run.step}" if run.resumed_from else "starting afresh"
        split = f" ({layout.describe()})" if layout.sharded else ""
        print(f"dlscale: {cfg.name} on {env.describe()}{split}, {count_parameters(model):,} parameters, {len(dataset):,} maps "
              f"{tuple(dataset.input_shape)} from {data_root}, {total_steps} steps of batch "
              f"{cfg.global_batch_size}, {cfg.optimizer} at peak lr {peak_lr:.3g}, {policy.name}"
              f"{', compiled' if cfg.compile else ''}; {where}; writing to {run.run_dir}", flush=True)
    return run


def _resume_or_start_afresh(run: Run) -> None:
    """Load the newest checkpoint (``resume=true``) or clear an earlier run's; every rank waits for both.

    A resume never removes a checkpoint: the newest stays until a newer one is renamed into
    place (save_checkpoint), so a run that dies again before its next one resumes from the
    same point. Only a fresh start clears the checkpoints of an earlier run in this folder.
    """
    if run.cfg.resume:
        found = load_latest_checkpoint(run.run_dir, run.model, run.optimizer)
        if found:
            run.resumed_from, ckpt = found
            if run.layout.sharded and "model" in ckpt:
                raise CheckpointError(f"{run.resumed_from} was written by a run whose ranks each held the whole "
                                      f"model; resume it without FSDP/tensor parallelism, or start afresh with "
                                      f"resume=false")
            run.step = restore_training(ckpt, run.resumed_from, run.steps_per_epoch, run.cfg, run.model,
                                        run.optimizer, run.scheduler, run.scaler, run.noise)
            del ckpt
    elif run.env.is_main:
        clear_checkpoints(run.run_dir)
    distributed.barrier()  # every rank has loaded (or rank 0 has cleared) before any rank goes on
    run.first_step = run.step
    if run.sync is not None:  # Horovod's idiom: every rank starts from rank 0's state
        horovod_backend.broadcast_initial_state(run.model, run.optimizer, resumed=run.resumed_from is not None)


def _applied(run: Run, data_root: Path) -> dict[str, Any]:
    """What the run really uses (summary.json's ``applied``): settings read back from the live objects."""
    optimizer, loader = run.optimizer, run.train_loader
    return {
        "device": str(run.device), "precision": run.policy.name, "grad_scaler": run.scaler.is_enabled(),
        "channels_last": is_channels_last(run.model),
        "compiled": run.cfg.compile, "cuda_graphs": False,  # known after the first steps (_finish)
        "world_size": run.env.world_size, "launcher": run.env.launcher, "backend": run.env.backend,
        "ddp": isinstance(run.step_model, nn.parallel.DistributedDataParallel), "horovod": run.sync is not None,
        "fsdp": run.layout.data_parallel == "fsdp", "tensor_parallel": run.layout.tensor_parallel,
        "data_parallel_ranks": run.layout.data_ranks, "model": run.cfg.model,
        "activation_checkpointing": run.cfg.activation_checkpointing and run.cfg.model == "vit",
        "horovod_fp16_compression": run.sync is not None and run.cfg.horovod_fp16_compression,
        "optimizer": type(optimizer).__name__, "optimizer_foreach": bool(optimizer.defaults.get("foreach")),
        "optimizer_fused": bool(optimizer.defaults.get("fused")), "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory, "data_dir": str(data_root), "nvtx": nvtx_backend(),
    }


def _as_config(cfg: TrainConfig | str | None, overrides: Mapping[str, Any]) -> TrainConfig:
    if isinstance(cfg, TrainConfig):
        return cfg.override(overrides) if overrides else cfg
    if cfg is None or isinstance(cfg, str):
        return load_config(cfg, overrides)
    raise ConfigError(f"train() takes a TrainConfig, a config name or path, or None; got {type(cfg).__name__}")


# -- the end -------------------------------------------------------------------------------------------

def _finish(run: Run, meter: ThroughputMeter, preempted: bool, started: float) -> Result:
    """Read back what was applied, hand rank 0's rows to every rank, write summary.json and the plot."""
    cfg, env, device, run_dir = run.cfg, run.env, run.device, run.run_dir
    applied = run.applied
    # Inductor skips CUDA graphs it cannot capture safely (batch norm mutates its running
    # statistics, for one), so whether they were applied is read back, not assumed.
    applied["cuda_graphs"] = (cfg.compile and cfg.cuda_graphs and device.type == "cuda"
                              and run.step > run.first_step and cuda_graph_skips() == run.graph_skips)
    # What each rank holds (its shards under FSDP/TP) and its peak, for the memory table (dlscale bench memory).
    memory = distributed.all_gather_object(memory_row(run.model, run.optimizer, device))
    # Rank 0 wrote the files; it hands their rows to the others (which may not share its file system).
    history, step_rows = distributed.broadcast_object(
        (read_rows(run_dir / VAL_FILE), read_rows(run_dir / TRAIN_FILE)) if env.is_main else None)
    final = {k: v for k, v in history[-1].items() if k not in ("epoch", "step")} if history else {}
    # float32 convolutions on an Ampere or newer GPU run on TF32 tensor cores: MFU is against that peak.
    peak_name = peak_precision(device, run.policy.name)
    peak = peak_flops(device, peak_name)
    utilisation = mfu(meter.samples_per_s, run.flops, peak)  # per device
    result = Result(config=cfg, run_dir=run_dir, device=str(device), final=final, history=history,
                    steps=step_rows, samples_per_s=meter.aggregate(run.layout.data_ranks), steps_done=run.step,
                    total_steps=run.total_steps, seconds=time.perf_counter() - started, preempted=preempted,
                    model=run.model, peak_lr=run.peak_lr, noise_scale=run.noise.b_simple, applied=applied,
                    mfu=utilisation)
    if env.is_main:
        summary = {"samples_per_s": result.samples_per_s, "samples_per_s_per_rank": meter.samples_per_s,
                   "world_size": env.world_size, "nodes": max(1, env.world_size // max(1, env.local_world_size)),
                   "global_batch_size": cfg.global_batch_size, "steps_done": run.step, "total_steps": run.total_steps,
                   "seconds": result.seconds, "device": str(device), "preempted": preempted, "peak_lr": run.peak_lr,
                   "flops_per_sample": run.flops, "mfu": utilisation,
                   "mfu_peak": {"precision": peak_name, "flops_per_s": peak}, "applied": applied,
                   "threads": run.threads.to_dict(), "memory_per_rank": memory,
                   **({"noise_scale": run.noise.b_simple} if cfg.noise_scale_every else {}), **final}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        run.logger.summary(summary)
        if cfg.plot and not preempted:
            from .plots import loss_curves
            loss_curves(run_dir, title=f"{cfg.name}: global batch {cfg.global_batch_size} on {device}").savefig(
                run_dir / "loss_curve.png", dpi=120)
        print(result.summary(), flush=True)
    run.logger.close()
    return result


def train_quietly(cfg: TrainConfig | str | None = None, /, **overrides: Any) -> Result:
    """:func:`train` with its console lines kept in ``output.log`` in the run directory, not printed.

    For sweeps and repeated runs, in a notebook or a benchmark: the progress bar (if on) still
    shows, and each run's lines stay readable in its own folder.
    """
    cfg = _as_config(cfg, overrides)
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            return train(cfg)
    finally:  # (also when the run stops with an error: the log says why)
        cfg.resolved_run_dir.mkdir(parents=True, exist_ok=True)
        (cfg.resolved_run_dir / "output.log").write_text(output.getvalue())


if __name__ == "__main__":
    # ``python -m dlscale.train [CONFIG] [key=value ...]`` is ``dlscale train``. Only running this
    # file as a script reaches the CLI; importing the engine never does.
    from dlscale.cli import main as cli_main

    sys.exit(cli_main(["train", *sys.argv[1:]]))
