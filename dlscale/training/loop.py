"""The one training loop: ``train(cfg) -> Result``.

The notebooks, ``dlscale train``, ``python -m dlscale.train`` and the Slurm scripts all run
:func:`train`. It reads top to bottom:

- :func:`~dlscale.training.setup.build_run` checks the config against the job, then builds
  the :class:`~dlscale.training.setup.Run` (device, data, model, parallel plan, optimizer and
  schedule, precision, resume or a fresh start);
- :func:`_loop` calls :func:`~dlscale.training.step.train_step` for each optimizer step, logs,
  validates at each epoch end, checkpoints, and stops on a signal (SIGTERM/SIGUSR1, see
  :mod:`dlscale.training.preemption`) after a checkpoint;
- :func:`_finish` writes the summary and returns the :class:`~dlscale.training.result.Result`.

``resume=true`` continues from the latest checkpoint so that every later step logs the same
loss an uninterrupted run would. The optional measurements (the gradient noise scale, the
layer-wise trust ratios) are small objects the step and the loop call explicitly.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from dlscale import distributed
from dlscale.checkpoint import save_training_checkpoint, training_extras
from dlscale.config import ConfigError, TrainConfig, load_config
from dlscale.data.shards import DataError
from dlscale.distributed import PeerFailedError, all_reduce_max_flag, is_peer_failure
from dlscale.distributed.dtensors import local
from dlscale.distributed.parallelize import cuda_graph_skips
from dlscale.errors import DlscaleError
from dlscale.metrics.evaluation import evaluate
from dlscale.metrics.memory import memory_row
from dlscale.metrics.steplog import LOG_BLOCK, DivergedError
from dlscale.metrics.throughput import ThroughputMeter
from dlscale.metrics.tracking import TRAIN_FILE, VAL_FILE, read_rows
from dlscale.profiling import StepProfiler, mfu, peak_flops, peak_precision
from dlscale.runtime.devices import resolve_device
from dlscale.runtime.threads import ThreadWatch
from dlscale.training.folder_lock import own_run_folder
from dlscale.training.preemption import STOP_FILE, StopFlag, mark_stopped
from dlscale.training.result import Result
from dlscale.training.setup import Run, build_run
from dlscale.training.step import train_step

#: ``on_epoch(epoch, metrics) -> stop``: called on rank 0 after each epoch's validation but the last; True
#: stops the run the way a stop signal does (a checkpoint, then the end), as a search prunes a trial.
EpochCallback = Callable[[int, dict[str, float]], bool]


def train(
    cfg: TrainConfig | str | None = None, /, *, on_epoch: EpochCallback | None = None, **overrides: Any
) -> Result:
    """Train the model a config describes and return its :class:`Result`.

    ``cfg`` is a :class:`TrainConfig`, a config name or YAML path, or None (defaults);
    keyword arguments override fields: ``train("tiny", epochs=2)``. ``on_epoch`` sees each
    epoch's validation metrics on rank 0 and may stop the run (:data:`EpochCallback`).
    """
    cfg = _as_config(cfg, overrides)
    started = time.perf_counter()
    requested = resolve_device(cfg.device)  # a clear error if the device is not there
    owns_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    env = distributed.init(
        "auto" if cfg.device == "auto" else str(requested),
        None if cfg.dist_backend == "auto" else cfg.dist_backend,
        cfg.dist_timeout_s,
        data_parallel=cfg.data_parallel,
    )
    # Horovod stays up for the life of the process (it cannot always start again after a shutdown).
    owns_group = owns_group and env.backend != "horovod"
    finished = False
    try:
        with own_run_folder(cfg.resolved_run_dir, env.is_main):  # one run per folder
            run = build_run(cfg, env)
            stopped, meter = _loop(run, on_epoch)
            result = _finish(run, meter, stopped, started)
        finished = True
        return result
    except torch.OutOfMemoryError as err:
        raise OutOfMemoryError(_out_of_memory_message(cfg, env, err)) from err
    except RuntimeError as err:
        if not env.distributed or isinstance(err, DlscaleError) or not is_peer_failure(err):
            raise  # this rank's own error, with its traceback
        raise PeerFailedError(
            f"rank {env.rank} of {env.world_size} stopped: a collective operation failed "
            f"({str(err).splitlines()[0][:200]}). Another rank probably died or was killed; "
            f"resume with resume=true from the last checkpoint"
        ) from err
    finally:
        if owns_group:
            distributed.shutdown(drain=finished)  # after a failure a peer may be gone: no barrier


class OutOfMemoryError(DlscaleError):
    """A rank ran out of device memory; the message says with which batch and what to lower."""


def _out_of_memory_message(cfg: TrainConfig, env: distributed.DistEnv, err: BaseException) -> str:
    micro = cfg.global_batch_size // max(1, env.world_size) // cfg.grad_accumulation
    return (
        f"rank {env.rank} of {env.world_size} ran out of memory on {env.device} with micro-batches of {micro} "
        f"samples (global_batch_size={cfg.global_batch_size} over {env.world_size} rank(s), grad_accumulation="
        f"{cfg.grad_accumulation}, model={cfg.model} width={cfg.width}). Lower global_batch_size, or keep it and "
        f"raise grad_accumulation; precision=bf16, activation_checkpointing=true (vit) or data_parallel=fsdp "
        f"save memory too. ({str(err).splitlines()[0][:200]})"
    )


def _loop(run: Run, on_epoch: EpochCallback | None = None) -> tuple[tuple[str, str], ThroughputMeter]:
    """Steps until the last one, a stop signal or ``on_epoch``'s stop; returns ((why it stopped, in words), the
    meter), why being one of :data:`~dlscale.training.result.STOP_REASONS`."""
    cfg, env = run.cfg, run.env
    sync = (lambda: torch.cuda.synchronize(run.device)) if run.device.type == "cuda" else None
    meter, preempted = ThroughputMeter(sync=sync), False
    run.step_log.time_with(meter, run.plan.data_ranks)  # each logged row: its block's samples/s, all ranks together
    bar = tqdm(
        total=run.total_steps,
        initial=run.step,
        desc=cfg.name,
        unit="step",
        dynamic_ncols=True,
        disable=not (env.is_main and cfg.progress),
        file=sys.stderr,
    )
    say = bar.write if env.is_main else (lambda *args, **kwargs: None)
    # Every rank opens the nsys capture range; the main rank also writes the torch trace.
    profiler = StepProfiler(
        run.run_dir, *(cfg.profile_steps or (0, 0)), run.device, trace=env.is_main, first_step=run.step
    )
    run.model.train()
    # (a neighbour that starts after this run does: one CPU process without loader workers chooses its threads again)
    watch = ThreadWatch(
        run.threads,
        active=run.device.type == "cpu" and env.world_size == 1 and not getattr(run.train_loader, "num_workers", 0),
    )
    # (rank 0 also reads the stop file slurm/launch.sh writes when only the batch shell gets the signal)
    with StopFlag(run.run_dir / STOP_FILE if env.is_main else None) as stop, profiler:
        while run.step < run.total_steps and not preempted:
            epoch, epoch_step = divmod(run.step, run.steps_per_epoch)
            run.train_loader.sampler.set_position(epoch, epoch_step * cfg.per_rank_batch(run.plan.data_ranks))
            batches = iter(run.train_loader)
            while True:
                lr = run.optimizer.param_groups[0]["lr"]  # the LR this step uses
                started = time.perf_counter()
                done = train_step(run, batches)
                if done is None:
                    break
                loss, samples = done
                run.step += 1
                changed = watch.observe(run.step, time.perf_counter() - started)
                if changed:
                    run.thread_changes.append(changed)
                    say(
                        f"dlscale: step {changed[0]}: the steps slowed or a look was due, and {changed[3]} of "
                        f"{watch.cpus} CPUs are busy with other work: {changed[1]} -> {changed[2]} torch thread(s)"
                    )
                profiler.step(run.step)
                run.step_log.add_trust_ratios(run.step, run.optimizer)
                meter.step(samples)
                run.step_log.add(run.step, epoch, loss, lr)
                bar.update()
                if run.step_log.full:
                    bar.set_postfix(loss=f"{run.step_log.flush():.4f}", lr=f"{lr:.2e}")
                end_of_epoch = run.step % run.steps_per_epoch == 0 or run.step == run.total_steps
                if end_of_epoch:
                    meter.pause()  # (first: the device finishes the steps, then validation runs untimed)
                    metrics = _validate(run, epoch, say)
                    if (
                        on_epoch is not None
                        and env.is_main
                        and run.step < run.total_steps
                        and on_epoch(epoch + 1, metrics)
                    ):
                        stop.request(f"stopped after epoch {epoch + 1} by {_name(on_epoch)}")
                stop.poll()
                if ranks_agree_to_stop(run, stop):
                    say(f"dlscale: {stop.reason}; checkpointing at step {run.step} and stopping")
                    preempted = True
                every = cfg.checkpoint_every
                if preempted or run.step == run.total_steps or (every and run.step % every == 0):
                    meter.pause()  # (the checkpoint's time is not a step's)
                    _checkpoint(run, lr)
                    if not end_of_epoch:
                        meter.resume()  # (the next step is timed, whatever the checkpoint interval)
                if preempted and stop.signal_name and env.is_main:  # (not a search's pruning: no requeue)
                    mark_stopped(run.run_dir, stop.reason, run.step)
                if preempted or end_of_epoch:
                    break
    bar.close()
    run.step_log.flush()
    return _stop_reason(preempted, stop, on_epoch), meter


def ranks_agree_to_stop(run: Run, stop: StopFlag) -> bool:
    """Whether every rank stops after this step. One process stops when its flag is up. A signal may reach only some
    ranks, so several ranks agree at block boundaries, through an all-reduce of the flag that each rank joins there
    (a collective: every rank must call this after every step)."""
    if not run.env.distributed:
        return stop.requested
    return run.step % LOG_BLOCK == 0 and all_reduce_max_flag(stop.requested, run.device)


def _stop_reason(stopped: bool, stop: StopFlag, on_epoch: EpochCallback | None) -> tuple[str, str]:
    if not stopped:
        return "completed", "finished"
    if stop.signal_name:
        return "signal", stop.reason
    if stop.requested:  # (the epoch callback: a search's pruner)
        return "callback", stop.reason
    return "peer", "another rank stopped (a signal or its epoch callback)"


def _validate(run: Run, epoch: int, say: Any) -> dict[str, float]:
    run.step_log.flush()
    # (run.eval_model: the model, or under a pipeline its stages forward, the predictions on every rank)
    model = run.model if run.eval_model is None else run.eval_model
    metrics = evaluate(model, run.val_loader, run.device, run.cfg.channels_last, run.names)
    # The error (mse) is the test: a NaN or infinite map or target makes it so. R² alone may be infinite on honest
    # data (one validation map, or a target that is constant: no variance to explain).
    broken = [key for key, value in metrics.items() if not key.startswith("r2") and not math.isfinite(value)]
    if broken:  # (the weights are finite, checked with each logged loss: the validation data are not)
        raise DataError(
            f"validation after epoch {epoch + 1} gave {', '.join(f'{k} {metrics[k]}' for k in broken)}: "
            f"the validation split {run.data_root / 'val'} holds NaN or infinite values (maps or targets); "
            f"find them with `dlscale data check {run.data_root}`, then clean or regenerate the data"
        )
    run.logger.log_validation({"epoch": epoch + 1, "step": run.step, **metrics})
    say(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def _name(callback: Any) -> str:
    return str(getattr(callback, "name", None) or getattr(callback, "__name__", None) or "on_epoch")


def _checkpoint(run: Run, lr: float) -> None:
    """Write the pending rows, then the checkpoint of this step, never one with non-finite weights.

    Rank 0 writes the whole state; under FSDP or tensor parallelism every rank writes its shards.
    """
    run.step_log.flush()  # (stops the run first if a pending loss is not finite)
    finite = bool(torch.stack([torch.isfinite(local(p)).all() for p in run.model.parameters()]).all())
    if run.plan.sharded:  # each rank sees only its shards: all must be finite
        finite = not all_reduce_max_flag(not finite, run.device)
    if not finite:
        # a finite loss can still come before an exploding update
        raise DivergedError(
            f"the weights became non-finite by step {run.step} (lr {lr:.3g}); the checkpoint of "
            f"this step was not written and the last good one is kept. Try a lower lr, a "
            f"longer warmup, grad_clip=1.0 or precision=fp32, then resume=true",
            step=run.step,
        )
    extras = training_extras(
        run.step, run.steps_per_epoch, run.cfg, run.scheduler, run.scaler, run.noise_scale, run.data_identity
    )
    save_training_checkpoint(
        run.run_dir,
        run.step,
        run.model,
        run.optimizer,
        extras,
        sharded=run.plan.sharded,
        is_main=run.env.is_main,
        keep=run.cfg.keep_checkpoints,
    )


def _as_config(cfg: TrainConfig | str | None, overrides: Mapping[str, Any]) -> TrainConfig:
    if isinstance(cfg, TrainConfig):
        return cfg.override(overrides) if overrides else cfg
    if cfg is None or isinstance(cfg, str):
        return load_config(cfg, overrides)
    raise ConfigError(f"train() takes a TrainConfig, a config name or path, or None; got {type(cfg).__name__}")


# -- the end -------------------------------------------------------------------------------------------


def _whole_gradient_bytes(run: Run) -> int:
    """The whole model's gradient bytes, by name from every rank (a pipeline's stages hold different parameters; a
    DTensor's numel is the whole parameter's, so FSDP's and TP's shards count whole, and once)."""
    by_name: dict[str, int] = {}
    for held in distributed.all_gather_object(
        {n: p.numel() * p.element_size() for n, p in run.model.named_parameters() if p.requires_grad}
    ):
        by_name.update(held)
    return sum(by_name.values())


def _finish(run: Run, meter: ThroughputMeter, stopped: tuple[str, str], started: float) -> Result:
    """Read back what was applied, hand rank 0's rows to every rank, write summary.json and the plot."""
    cfg, env, device, run_dir = run.cfg, run.env, run.device, run.run_dir
    applied = run.applied
    # Inductor skips CUDA graphs it cannot capture safely (batch norm mutates its running
    # statistics, for one), so whether they were applied is read back, not assumed.
    applied["cuda_graphs"] = (
        cfg.compile
        and cfg.cuda_graphs
        and device.type == "cuda"
        and run.step > run.first_step
        and cuda_graph_skips() == run.graph_skips
    )
    # What each rank holds (its shards under FSDP/TP) and its peak, for the memory table (dlscale bench memory).
    memory = distributed.all_gather_object(memory_row(run.model, run.optimizer, device))
    # Every rank's own samples/s: a straggler shows as the slowest, which the breakdown takes (dlscale.bench.breakdown).
    each_rank = distributed.all_gather_object(meter.samples_per_s)
    gradient_bytes = _whole_gradient_bytes(run)
    # Rank 0 wrote the files; it hands their rows to the others (which may not share its file system).
    history, step_rows, kept = distributed.broadcast_object(
        (read_rows(run_dir / VAL_FILE), read_rows(run_dir / TRAIN_FILE), _kept_summary(run)) if env.is_main else None
    )
    final = {k: v for k, v in history[-1].items() if k not in ("epoch", "step")} if history else {}
    # float32 convolutions on an Ampere or newer GPU run on TF32 tensor cores (cuDNN's default), float32
    # matmuls do not (cuBLAS's): MFU is against the peak of the kernels that do most of the FLOPs.
    peak_name = peak_precision(device, run.policy.name, convolutions=run.flops.convolution_share >= 0.5)
    peak = peak_flops(device, peak_name)
    utilisation = mfu(meter.samples_per_s, run.flops.per_sample, peak, run.plan.model_ranks)  # per device
    result = Result(
        config=cfg,
        run_dir=run_dir,
        device=str(device),
        final=final,
        history=history,
        steps=step_rows,
        samples_per_s=kept.get("samples_per_s", 0.0) if kept else meter.aggregate(run.plan.data_ranks),
        steps_done=run.step,
        total_steps=run.total_steps,
        seconds=kept.get("seconds", 0.0) if kept else time.perf_counter() - started,
        stop_reason=stopped[0],
        stop_detail=stopped[1],
        model=run.model,
        peak_lr=run.peak_lr,
        noise_scale=run.noise_scale.b_simple,
        applied=applied,
        mfu=utilisation,
    )
    if env.is_main and kept is not None:  # (a resume that trained no step: the run's figures stay as they were)
        done = "is complete" if run.step >= run.total_steps else f"trained no step (at step {run.step})"
        print(f"dlscale: {run_dir} {done}: nothing to train, and its summary.json is kept as it was", flush=True)
    elif env.is_main:
        summary = {
            "samples_per_s": result.samples_per_s,
            "samples_per_s_per_rank": meter.samples_per_s,
            "samples_per_s_each_rank": each_rank,
            "world_size": env.world_size,
            "nodes": max(1, env.world_size // max(1, env.local_world_size)),
            "global_batch_size": cfg.global_batch_size,
            "steps_done": run.step,
            "total_steps": run.total_steps,
            "seconds": result.seconds,
            "device": str(device),
            "preempted": result.preempted,
            "stop_reason": result.stop_reason,
            "stop_detail": result.stop_detail,
            "peak_lr": run.peak_lr,
            "flops_per_sample": run.flops.per_sample,
            "mfu": utilisation,
            **(
                {
                    "recomputed_flops_per_sample": run.flops.recomputed,  # (activation checkpointing's)
                    "hardware_utilisation": mfu(
                        meter.samples_per_s, run.flops.per_sample + run.flops.recomputed, peak, run.plan.model_ranks
                    ),
                }
                if run.flops.recomputed
                else {}
            ),
            "mfu_peak": {"precision": peak_name, "flops_per_s": peak},
            "applied": applied,
            "threads": {**run.threads.to_dict(), "changes": [list(change) for change in run.thread_changes]},
            "memory_per_rank": memory,
            # (what dlscale plan prices: the whole gradient and how the ranks share it)
            "parallel": {
                "data_parallel": run.plan.data_parallel,
                "tensor_parallel": run.plan.tensor_parallel,
                "pipeline_parallel": run.plan.pipeline,
                "gradient_bytes": gradient_bytes,
            },
            **({"noise_scale": run.noise_scale.b_simple} if cfg.noise_scale_every else {}),
            **final,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        run.logger.summary(summary)
        if cfg.plot and result.stop_reason == "completed":
            from dlscale.reporting.plots import loss_curves

            loss_curves(run_dir, title=f"{cfg.name}: global batch {cfg.global_batch_size} on {device}").savefig(
                run_dir / "loss_curve.png", dpi=120
            )
        print(result.summary(), flush=True)
    run.logger.close()
    return result


def _kept_summary(run: Run) -> dict[str, Any] | None:
    """The summary a resumed run leaves as it was because it trained no step (a finished run resumed), else None."""
    path = run.run_dir / "summary.json"
    if run.step > run.first_step or run.resumed_from is None or not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def train_quietly(
    cfg: TrainConfig | str | None = None, /, *, on_epoch: EpochCallback | None = None, **overrides: Any
) -> Result:
    """:func:`train` with its console lines kept in ``output.log`` in the run directory, not printed.

    For sweeps and repeated runs, in a notebook or a benchmark: the progress bar (if on) still
    shows, and each run's lines stay readable in its own folder.
    """
    cfg = _as_config(cfg, overrides)
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            return train(cfg, on_epoch=on_epoch)
    finally:  # (also when the run stops with an error: the log says why)
        cfg.resolved_run_dir.mkdir(parents=True, exist_ok=True)
        (cfg.resolved_run_dir / "output.log").write_text(output.getvalue())
