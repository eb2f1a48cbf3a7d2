"""Everything a run works with, checked and then built once: :func:`build_run` -> :class:`Run`.

First the checks that need the job (the parallel plan, the device), so a config that cannot
run stops before any data is read or model built; then construction in PyTorch's order:
threads, seed, data, model, precision, the step model (tensor parallelism and FSDP in place,
or DDP then compiled: before the optimizer, because FSDP and TP replace the parameters by
DTensors; with a pipeline, each of this rank's stages so, and the schedule that runs them),
optimizer and gradient sync, schedule; then resume or a fresh start, and the logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlscale import distributed
from dlscale.checkpoint import (
    CheckpointError,
    check_writable,
    clear_checkpoints,
    list_checkpoints,
    load_latest_checkpoint,
    restore_training,
    step_of,
)
from dlscale.config import ConfigError, TrainConfig
from dlscale.config.resume_check import check_resume
from dlscale.config.train_config import ModelSection
from dlscale.data.loader import InMemoryBatches, rank_loaders, target_names
from dlscale.data.shards import data_identity
from dlscale.distributed import DistEnv, horovod_backend
from dlscale.distributed.grad_sync import GradientSync, gradient_sync
from dlscale.distributed.parallelize import (
    ParallelPlan,
    build_step_model,
    cuda_graph_skips,
    plan_parallelism,
    uncompiled,
)
from dlscale.distributed.pipeline import Pipeline, PipelineForward, build_pipeline, pipeline_stages, rank_part
from dlscale.metrics.memory import reset_peak
from dlscale.metrics.noise_scale import NoiseScaleEstimator, NoiseScaleProbe
from dlscale.metrics.steplog import StepLog
from dlscale.metrics.tracking import MetricsLogger
from dlscale.models import build_model, count_parameters, is_channels_last, model_spec
from dlscale.models.registry import ModelSpec
from dlscale.optim.factory import build_optimizer
from dlscale.optim.schedules import scale_lr, warmup_schedule
from dlscale.profiling import FlopCount, count_flops, nvtx_backend
from dlscale.runtime.devices import to_device
from dlscale.runtime.precision import Precision
from dlscale.runtime.threads import ThreadChoice, apply_threads
from dlscale.training.passes import ForwardBackward, pipelined, whole_model


@dataclass
class Run:
    """Everything one training run works with, built once by :func:`build_run`."""

    cfg: TrainConfig
    env: DistEnv
    plan: ParallelPlan  # how the ranks share the work (DDP, Horovod, FSDP, tensor parallel, pipeline)
    device: torch.device
    model: nn.Module  # for checkpoints and evaluation: plain, or itself sharded under FSDP/TP; a pipeline's: its stages
    step_model: nn.Module  # what the step calls: compiled and/or DDP-wrapped; the model under FSDP/TP (and a pipeline)
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    grad_sync: GradientSync  # what the step asks to keep micro-batches local, synchronize, clip and step
    scheduler: Any
    scaler: torch.amp.GradScaler
    policy: Precision
    train_loader: Any
    val_loader: Any
    data_root: Path
    data_identity: str | None  # the shards' digest (dlscale.data.data_identity), checked on a resume
    names: list[str]
    steps_per_epoch: int
    total_steps: int
    peak_lr: float
    flops: FlopCount  # per sample, and how much of it is convolutions (which peak MFU compares with)
    noise_scale: NoiseScaleEstimator  # the gradient-noise estimate (lesson 07), saved in checkpoints
    logger: MetricsLogger
    step_log: StepLog
    threads: ThreadChoice  # torch's CPU threads in this process, and why
    step: int = 0
    first_step: int = 0  # where this process started (the resumed step, or 0)
    resumed_from: Path | None = None
    graph_skips: int = 0  # inductor's CUDA-graph skips before the first step
    noise_probe: NoiseScaleProbe | None = None
    #: one micro-batch's forward and backward (dlscale.training.passes): the whole model's, or a pipeline's schedule
    forward_backward: ForwardBackward = whole_model
    pipeline: Pipeline | None = None  # this rank's stages and their schedule, with pipeline_parallel > 1
    eval_model: nn.Module | None = None  # what validation calls for predictions: the model, or the pipeline forward
    applied: dict[str, Any] = field(default_factory=dict)
    thread_changes: list[tuple[int, int, int, int]] = field(default_factory=list)  # (step, from, to, busy CPUs)

    @property
    def run_dir(self) -> Path:
        return self.cfg.resolved_run_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@functools.lru_cache(maxsize=16)
def model_flops(spec: ModelSpec, model: ModelSection, input_shape: tuple[int, ...], targets: int) -> FlopCount:
    """FLOPs per sample of the model a model section describes, counted once per architecture and input shape in a
    process (a sweep's rounds, a benchmark's turns, a lesson's repeated runs train the same model again).

    Counted on a twin on the meta device: no memory, no kernel on the GPU, nothing collective. The model's own FLOPs
    leave out what activation checkpointing recomputes (counted apart: it is hardware work, not the model's).
    """

    def counted(checkpointing: bool) -> FlopCount:
        with torch.device("meta"):
            twin = spec.build(
                dataclasses.replace(model, activation_checkpointing=checkpointing), input_shape, targets, 0
            )
            return count_flops(twin, input_shape, nn.MSELoss(), targets)

    flops = counted(False)
    if model.activation_checkpointing:
        flops = dataclasses.replace(flops, recomputed=counted(True).per_sample - flops.per_sample)
    return flops


def check_fits(cfg: TrainConfig, device: torch.device, plan: ParallelPlan) -> None:
    """The checks that need the job: a :class:`ConfigError` that says what to change, before anything is built."""
    if plan.sharded and cfg.val_samples % plan.data_ranks:
        # (every rank must run as many forward passes: FSDP gathers each block from all of them)
        raise ConfigError(
            f"val_samples={cfg.val_samples} must split evenly over the {plan.data_ranks} "
            f"data-parallel ranks with FSDP or tensor parallelism; choose a multiple of "
            f"{plan.data_ranks}"
        )
    if cfg.sync_batchnorm and device.type != "cuda":
        raise ConfigError("sync_batchnorm=true needs GPUs (torch's SyncBatchNorm is CUDA-only); on CPUs use norm=group")
    if cfg.noise_scale_every and cfg.micro_batch(plan.data_ranks) < 2:
        raise ConfigError("noise_scale_every needs a per-rank batch of at least 2 samples")
    if cfg.noise_scale_every and plan.data_parallel == "horovod":
        raise ConfigError(
            "noise_scale_every works with DDP only: under Horovod its extra backward pass would set "
            "off an all-reduce; launch with torchrun/srun/mpirun, or set noise_scale_every=0"
        )
    if plan.pipeline > 1 and cfg.per_rank_batch(plan.data_ranks) % cfg.pipeline_microbatches:
        batch = cfg.per_rank_batch(plan.data_ranks)
        raise ConfigError(
            f"config key 'pipeline_microbatches'={cfg.pipeline_microbatches} must divide the per-rank batch {batch} "
            f"(global_batch_size={cfg.global_batch_size} over {plan.data_ranks} data-parallel rank(s)); choose a "
            f"divisor of {batch}"
        )


def build_run(cfg: TrainConfig, env: DistEnv) -> Run:
    """Check, then build the :class:`Run`: data, model, optimizer, schedule, precision, resume or start afresh."""
    device = torch.device(env.device)
    check_writable(cfg.resolved_run_dir)  # (before the data and the training, not at the first checkpoint)
    threads = apply_threads(requested=cfg.threads)  # before any kernel runs: from the CPUs this process was given
    seed_everything(cfg.seed)
    plan = plan_parallelism(cfg.sections.parallel, env)
    check_fits(cfg, device, plan)

    train_loader, val_loader, data_root = rank_loaders(cfg, env, device, plan.data_rank, plan.data_ranks)
    # What the run trains on, by content, however it came (the synthetic set, a generated or a user's folder, a staged
    # copy): a resume on other data is refused, whichever way either set was given.
    identity = data_identity(data_root)
    dataset = train_loader.dataset
    # A sharded transformer is built on the meta device (no memory), sharded, then each rank allocates and
    # initializes its own shards only: no rank ever holds the whole model (FSDP2's pattern).
    on_meta = plan.sharded and model_spec(cfg.model).meta_init
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        model = build_model(cfg, dataset.input_shape[0], dataset.num_targets)
    if cfg.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    policy = Precision.resolve(cfg.precision, device)
    if device.type == "cuda":  # (cuDNN's autotuner: set per run, since a notebook's earlier run may have set it)
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    if plan.data_parallel == "fsdp" and policy.name == "bf16":
        policy = dataclasses.replace(policy, fsdp_casts=True)
    model = model.to(policy.param_dtype) if on_meta else model.to(device, policy.param_dtype)
    if cfg.data_in_memory:  # (the breakdown's run without a loader: the batches already on the device)
        train_loader = InMemoryBatches(
            train_loader, lambda x, y: to_device(x, y, device, cfg.channels_last, policy.param_dtype)
        )
    loss_fn = nn.MSELoss()
    flops = model_flops(model_spec(cfg.model), cfg.sections.model, tuple(dataset.input_shape), dataset.num_targets)
    # (before the optimizer: FSDP and TP make DTensors of the parameters)
    pipeline = None
    if plan.pipeline > 1:  # this rank's stages, each prepared as a model is; the model is then the rank's part
        model, pipeline = _pipeline_part(cfg, env, plan, policy, model, on_meta, device, loss_fn)
        step_model = model
    else:
        step_model = build_step_model(model, env, cfg.sections.parallel, cfg.sections.model, plan, policy)
        if on_meta:
            model.to_empty(device=device)
            model.init_weights(cfg.seed)
    reset_peak(device)  # the memory table's peak is the sharded layout's, not the whole model's before it
    peak_lr = scale_lr(cfg.lr, cfg.base_batch, cfg.global_batch_size, cfg.lr_scaling)
    optimizer, grad_sync = gradient_sync(
        plan.data_parallel,
        step_model,
        build_optimizer(cfg.sections.optim, model, lr=peak_lr),
        model,
        cfg.horovod_fp16_compression,
        cfg.grad_accumulation,
        across_stages=pipeline.group if pipeline else None,
    )
    steps_per_epoch = len(train_loader) // cfg.grad_accumulation
    total_steps = min(cfg.epochs * steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch)
    warmup = round(cfg.warmup_epochs * steps_per_epoch) if cfg.warmup_epochs else cfg.warmup_steps
    start_factor = cfg.warmup_start_factor or (cfg.lr / peak_lr if peak_lr > cfg.lr else None)
    scheduler = warmup_schedule(optimizer, min(warmup, total_steps), total_steps, cfg.decay, start_factor)
    scaler = policy.grad_scaler()  # enabled only for fp16; otherwise its calls pass straight through
    noise_scale = NoiseScaleEstimator(decay=0.9)

    step, resumed_from = _resume_or_start_afresh(
        cfg, env, plan, model, optimizer, scheduler, scaler, noise_scale, identity
    )
    if plan.data_parallel == "horovod":  # Horovod's idiom: every rank starts from rank 0's state
        horovod_backend.broadcast_initial_state(model, optimizer, resumed=resumed_from is not None)
    if env.is_main:
        cfg.save(cfg.resolved_run_dir / "config.yaml")
    names = target_names(data_root, dataset.num_targets)
    logger = MetricsLogger(
        cfg.sections.logging,
        cfg.resolved_run_dir,
        cfg.name,
        cfg.to_dict(),
        resume_step=step if resumed_from else None,
        is_main=env.is_main,
        val_columns=["mse", "r2", *(f"r2_{n}" for n in names)],
    )
    layer_names = {p: n for n, p in model.named_parameters()}
    step_log = StepLog(
        logger,
        [layer_names[p] for g in optimizer.param_groups for p in g["params"]]
        if hasattr(optimizer, "trust_ratios")
        else [],
    )
    run = Run(
        cfg=cfg,
        env=env,
        plan=plan,
        device=device,
        model=model,
        step_model=step_model,
        loss_fn=loss_fn,
        optimizer=optimizer,
        grad_sync=grad_sync,
        scheduler=scheduler,
        scaler=scaler,
        policy=policy,
        train_loader=train_loader,
        val_loader=val_loader,
        data_root=data_root,
        data_identity=identity,
        names=names,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        peak_lr=peak_lr,
        flops=flops,
        noise_scale=noise_scale,
        logger=logger,
        step_log=step_log,
        threads=threads,
        step=step,
        first_step=step,
        resumed_from=resumed_from,
        graph_skips=cuda_graph_skips() if cfg.cuda_graphs else 0,
        noise_probe=(
            NoiseScaleProbe(cfg.noise_scale_every, noise_scale, logger.log_noise_scale)
            if cfg.noise_scale_every
            else None
        ),
        forward_backward=pipelined(pipeline) if pipeline else whole_model,
        pipeline=pipeline,
        eval_model=PipelineForward(model, pipeline) if pipeline else model,
    )
    run.applied = applied_settings(run)
    if env.is_main:
        print(_start_line(run), flush=True)
    return run


def _pipeline_part(
    cfg: TrainConfig,
    env: DistEnv,
    plan: ParallelPlan,
    policy: Precision,
    model: nn.Module,
    on_meta: bool,
    device: torch.device,
    loss_fn: nn.Module,
) -> tuple[nn.Module, Pipeline]:
    """This rank's stages of ``model``, each split, sharded and materialized as a whole model is, then as one module
    (the rank's part: what the optimizer, the clipping and the checkpoint hold) and the pipeline that runs them."""
    stages = pipeline_stages(model, plan.pipeline, plan.pipeline_rank, cfg.pipeline_virtual_stages)
    for stage in stages:
        build_step_model(stage, env, cfg.sections.parallel, cfg.sections.model, plan, policy)
        if on_meta:  # (each stage draws its parameters' values in the whole model: the same start as one process)
            stage.to_empty(device=device)
            stage.init_weights(cfg.seed)
    pipeline = build_pipeline(
        stages,
        plan.mesh,
        cfg.pipeline_schedule,
        cfg.pipeline_microbatches,
        cfg.pipeline_virtual_stages,
        cfg.per_rank_batch(plan.data_ranks),
        device,
        loss_fn,
    )
    return rank_part(stages), pipeline


def _resume_or_start_afresh(
    cfg: TrainConfig,
    env: DistEnv,
    plan: ParallelPlan,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    noise_scale: NoiseScaleEstimator,
    identity: str | None = None,
) -> tuple[int, Path | None]:
    """Load the newest checkpoint (``resume=true``) or clear an earlier run's; every rank waits for both.

    Returns (the step to continue from, the checkpoint's path or None). A resume never removes
    a checkpoint: the newest stays until a newer one is renamed into place, so a run that dies
    again before its next one resumes from the same point. Only a fresh start clears the
    checkpoints of an earlier run in this folder.
    """
    step, resumed_from = 0, None
    if cfg.resume:
        changes: list[str] = []

        def check(saved: dict[str, Any] | None, path: Path) -> None:  # (the last one checked is the one resumed from)
            changes[:] = check_resume(saved, cfg, path, identity)

        found = load_latest_checkpoint(cfg.resolved_run_dir, model, optimizer, check=check)
        if changes and env.is_main:
            print(f"dlscale: resuming with changed settings: {'; '.join(changes)}", flush=True)
        if found:
            resumed_from, ckpt = found
            if plan.sharded and "model" in ckpt:
                raise CheckpointError(
                    f"{resumed_from} was written by a run whose ranks each held the whole "
                    f"model; resume it without FSDP, tensor or pipeline parallelism, or start afresh with "
                    f"resume=false"
                )
            step = restore_training(ckpt, model, optimizer, scheduler, scaler, noise_scale)
            del ckpt
    elif env.is_main:
        _clear_earlier_run(cfg.resolved_run_dir)
    distributed.barrier()  # every rank has loaded (or rank 0 has cleared) before any rank goes on
    return step, resumed_from


def _clear_earlier_run(run_dir: Path) -> None:
    """A fresh start in a folder with an earlier run's checkpoints removes them, and says how many and how not to.

    Removed, not refused: the lessons, ``make demo`` and a sweep re-run the same folders on purpose, and a resume is
    always asked for (resume=true). The line names what went, so a forgotten resume=true is seen at once.
    """
    earlier = list_checkpoints(run_dir)
    removed = clear_checkpoints(run_dir)
    if earlier:
        print(
            f"dlscale: starting afresh in {run_dir}: removed the earlier run's {len(earlier)} checkpoint(s), "
            f"the newest of step {step_of(earlier[-1])} (to continue a run, pass resume=true)",
            flush=True,
        )
    elif removed:
        print(f"dlscale: starting afresh in {run_dir}: removed {removed} half-written checkpoint(s)", flush=True)


def applied_settings(run: Run) -> dict[str, Any]:
    """What the run really uses (summary.json's ``applied``): settings read back from the live objects."""
    optimizer, loader, plan = run.optimizer, run.train_loader, run.plan
    horovod = plan.data_parallel == "horovod"
    return {
        "device": str(run.device),
        "precision": run.policy.name,
        "grad_scaler": run.scaler.is_enabled(),
        "channels_last": is_channels_last(run.model),
        "cudnn_benchmark": run.device.type == "cuda" and torch.backends.cudnn.benchmark,
        "compiled": run.cfg.compile,
        "cuda_graphs": False,  # known after the first steps (the loop's finish)
        "world_size": run.env.world_size,
        "launcher": run.env.launcher,
        "backend": run.env.backend,
        "ddp": isinstance(uncompiled(run.step_model), nn.parallel.DistributedDataParallel),
        "horovod": horovod,
        "fsdp": plan.data_parallel == "fsdp",
        "tensor_parallel": plan.tensor_parallel,
        "pipeline_parallel": plan.pipeline,
        "pipeline_schedule": run.cfg.pipeline_schedule if plan.pipeline > 1 else None,
        "pipeline_microbatches": run.cfg.pipeline_microbatches if plan.pipeline > 1 else None,
        "data_parallel_ranks": plan.data_ranks,
        "model": run.cfg.model,
        "activation_checkpointing": run.cfg.activation_checkpointing and run.cfg.model == "vit",
        "horovod_fp16_compression": horovod and run.cfg.horovod_fp16_compression,
        "optimizer": type(optimizer).__name__,
        "optimizer_foreach": bool(optimizer.defaults.get("foreach")),
        "optimizer_fused": bool(optimizer.defaults.get("fused")),
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "data_dir": str(run.data_root),
        "nvtx": nvtx_backend(),
    }


def _start_line(run: Run) -> str:
    cfg, plan, dataset = run.cfg, run.plan, run.train_loader.dataset
    where = f"resuming from {run.resumed_from.name} at step {run.step}" if run.resumed_from else "starting afresh"
    split = f" ({plan.describe()})" if plan.sharded else ""
    held = " in rank 0's stages" if plan.pipeline > 1 else ""
    return (
        f"dlscale: {cfg.name} on {run.env.describe()}{split}, {count_parameters(run.model):,} parameters{held}, "
        f"{len(dataset):,} maps {tuple(dataset.input_shape)} from {run.data_root}, {run.total_steps} steps of "
        f"batch {cfg.global_batch_size}, {cfg.optimizer} at peak lr {run.peak_lr:.3g}, {run.policy.name}"
        f"{', compiled' if cfg.compile else ''}; {where}; writing to {run.run_dir}"
    )
