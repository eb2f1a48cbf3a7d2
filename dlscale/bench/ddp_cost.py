"""``dlscale bench ddp-cost``: what DDP itself costs the engine's step, nothing sent (lesson 11).

The engine's own step (:func:`~dlscale.training.step.train_step`: zero, forward, backward, optimizer) on one rank,
its batches already in memory, timed as it is and wrapped in DistributedDataParallel over a process group of one
(gloo on a CPU, NCCL on a GPU): every all-reduce is a world of one, so what the wrapper adds is DDP's own work — the
autograd hooks, the copies into and out of the buckets (``gradient_as_bucket_view=False``, torch's default; the
engine's ``true`` skips them), the all-reduce call and its future per bucket. At several ``bucket_cap_mb`` (one
bucket, and buckets down to one tensor each) and one or more model sizes, the wrappers taking turns in short blocks
so that a slow spell of a shared machine hits all of them (on a CPU the process's CPU time is what is timed: other
processes move it far less than the wall clock), the overheads are fitted to a price per bucket and a
price per byte (:func:`~dlscale.scaling.ddp_cost.fit_ddp_cost`): the ``ddp`` term of ``dlscale project`` measured on
this machine (``--ddp-cost ddp_cost.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from dlscale.reporting.tables import markdown_table

#: The bucket caps a run compares by default, MiB: one bucket for the models here, a few, one tensor each.
DDP_COST_BUCKETS_MB = (25.0, 1.0, 0.01)
NO_DDP = "no DDP"


@contextlib.contextmanager
def world_of_one(device: torch.device) -> Iterator[None]:
    """A default process group of one rank in this process (gloo on a CPU, NCCL on a GPU), removed on the way out:
    DDP needs one, and with one rank nothing crosses a link."""
    import torch.distributed as dist

    from dlscale.distributed import DistributedError

    if dist.is_initialized():
        raise DistributedError(
            "bench ddp-cost times DDP over a world of one and starts its own process group: run it in a "
            "process that has none (not under torchrun)"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def bucket_count(ddp: torch.nn.Module) -> int | None:
    """The buckets ``ddp`` sends now (after its first steps it rebuilds them in the order the gradients came), or
    None where this torch does not say. (A private call of torch's Reducer, fenced here.)"""
    try:
        return len(ddp.reducer._get_zeros_like_grad_buckets())
    except (AttributeError, RuntimeError):
        return None


def _endless(loader) -> Iterator:
    while True:
        yield from loader


def _time_steps(run, model: torch.nn.Module, batches: Iterator, steps: int) -> float:
    """Seconds per step of the engine's step with ``model`` as the step's module: on a GPU the wall clock (the
    device synchronized), on a CPU the process's CPU time (its own threads and gloo's: what the step costs this
    process, which other processes on a shared machine do not move as they move the wall clock)."""
    from dlscale.training.step import train_step

    stepping = dataclasses.replace(run, step_model=model)
    on_gpu = run.device.type == "cuda"
    clock = time.perf_counter if on_gpu else time.process_time
    if on_gpu:
        torch.cuda.synchronize()
    start = clock()
    for _ in range(steps):
        train_step(stepping, batches)
    if on_gpu:
        torch.cuda.synchronize()
    return (clock() - start) / steps


def measure_model(
    cfg,
    label: str,
    device: torch.device,
    buckets_mb: Iterable[float],
    blocks: int,
    steps: int,
    progress: bool = False,
) -> dict[str, Any]:
    """One model (``cfg``, named ``label``): the engine's step without DDP and under DDP at each bucket cap (the
    config's ``gradient_as_bucket_view``), ``blocks`` blocks of ``steps`` steps each in turns (the order reversed
    every other block); the median seconds per step of each. The model is not compiled either way."""
    from torch.nn.parallel import DistributedDataParallel
    from tqdm.auto import tqdm

    from dlscale.distributed import DistEnv
    from dlscale.training.setup import build_run

    run = build_run(cfg, DistEnv(device="cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"))
    device_ids = [run.device.index or 0] if run.device.type == "cuda" else None
    as_view = cfg.gradient_as_bucket_view
    wrappers: dict[str, torch.nn.Module] = {NO_DDP: run.model}
    for mb in buckets_mb:
        # (every wrapper's hooks stay on the parameters, but a DDP module's fire only after its own forward)
        wrappers[f"{mb:g} MiB"] = DistributedDataParallel(
            run.model, device_ids=device_ids, bucket_cap_mb=mb, gradient_as_bucket_view=as_view
        )
    batches = _endless(run.train_loader)
    for model in wrappers.values():  # (warm-up: DDP rebuilds its buckets after its first step)
        _time_steps(run, model, batches, 3)
    seconds: dict[str, list[float]] = {name: [] for name in wrappers}
    order = list(wrappers)
    with tqdm(total=blocks * len(order), desc=f"ddp-cost {label}", disable=not progress) as bar:
        for block in range(blocks):
            for name in order if block % 2 == 0 else reversed(order):
                seconds[name].append(_time_steps(run, wrappers[name], batches, steps))
                bar.update()
    gradient_bytes = sum(p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad)
    return {
        "model": label,
        "blocks_ms": {name: [1000 * value for value in values] for name, values in seconds.items()},
        "gradient_bytes": gradient_bytes,
        "tensors": sum(1 for p in run.model.parameters() if p.requires_grad),
        "per_rank_batch": cfg.global_batch_size,
        "ways": [
            {
                "way": name,
                "buckets": 0 if name == NO_DDP else bucket_count(model),
                "ms": 1000 * statistics.median(seconds[name]),
                "range_ms": (1000 * min(seconds[name]), 1000 * max(seconds[name])),
            }
            for name, model in wrappers.items()
        ],
    }


def bench_ddp_cost(
    cfg,
    sizes: Iterable[dict[str, Any]] = ({},),
    buckets_mb: Iterable[float] = DDP_COST_BUCKETS_MB,
    blocks: int = 20,
    steps: int = 4,
    out_dir: str | Path = "runs/ddp_cost",
    progress: bool = True,
) -> dict[str, Any]:
    """Measure DDP's own cost on one rank for each model size (``sizes``: config overrides, e.g. ``{"width": 64}``)
    at each bucket cap, fit a price per bucket and per byte, and write ``ddp_cost.json`` into ``out_dir``.

    The config's ``gradient_as_bucket_view`` says whether DDP copies the gradients (false, torch's default) or
    views them (true, the engine's default); its data are read into memory first (``data_in_memory``).
    """
    from dlscale.config import load_config
    from dlscale.runtime.devices import cpu_name, resolve_device
    from dlscale.scaling.ddp_cost import DdpPoint, fit_ddp_cost

    out_dir = Path(out_dir)
    device = resolve_device(cfg.device)
    buckets_mb = list(buckets_mb)
    # (batches in memory: the loader is not what is measured; no compile: the same module with and without DDP)
    quiet = {"data_in_memory": True, "compile": False, "progress": False, "plot": False, "checkpoint_every": 0}
    models = []
    with world_of_one(device):
        for i, overrides in enumerate(sizes):
            size_cfg = load_config(
                None, {**cfg.to_dict(), **quiet, **overrides, "resume": False, "run_dir": str(out_dir / f"size{i}")}
            )
            label = cfg.model + "".join(f", {key} {value}" for key, value in overrides.items())
            models.append(measure_model(size_cfg, label, device, buckets_mb, blocks, steps, progress))
    points = []
    for model in models:
        alone = next(w["ms"] for w in model["ways"] if w["way"] == NO_DDP)
        for way in model["ways"]:
            way["overhead_ms"] = way["ms"] - alone
            if way["way"] != NO_DDP and way["buckets"] is not None:
                points.append(
                    DdpPoint(model["model"], way["buckets"], model["gradient_bytes"], way["overhead_ms"] / 1e3)
                )
    machine = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    where = (
        f"{machine}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{'wall clock' if device.type == 'cuda' else 'CPU time'}, "
        f"{'views' if cfg.gradient_as_bucket_view else 'copies'} (gradient_as_bucket_view="
        f"{str(cfg.gradient_as_bucket_view).lower()})"
    )
    fit = fit_ddp_cost(points, where)
    spread = _block_spread(models, blocks)
    result = {
        "machine": machine,
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "clock": "wall (device synchronized)" if device.type == "cuda" else "the process's CPU time",
        "gradient_as_bucket_view": cfg.gradient_as_bucket_view,
        "blocks": blocks,
        "steps": steps,
        "models": models,
        "fit": {
            "per_bucket_s": fit.per_bucket_s,
            "per_byte_s": fit.per_byte_s,
            "per_step_s": fit.per_step_s,
            "source": where,
        },
        "fit_quartiles": spread,  # (the same fit on each block alone: its lower and upper quartiles)
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ddp_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _block_spread(models: list[dict[str, Any]], blocks: int) -> dict[str, tuple[float, float]]:
    """How far the prices move from block to block: the fit on each block's own overheads (every way of a block ran
    in the same stretch of time), and the lower and upper quartiles of each price over the blocks."""
    from dlscale.scaling.ddp_cost import DdpPoint, fit_ddp_cost

    fits = []
    for block in range(blocks):
        points = []
        for model in models:
            alone = model["blocks_ms"][NO_DDP][block]
            for way in model["ways"]:
                if way["way"] != NO_DDP and way["buckets"] is not None:
                    extra = (model["blocks_ms"][way["way"]][block] - alone) / 1e3
                    points.append(DdpPoint(model["model"], way["buckets"], model["gradient_bytes"], extra))
        with contextlib.suppress(ValueError):
            fits.append(fit_ddp_cost(points))

    def quartiles(values: list[float]) -> tuple[float, float]:
        q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        return q[0], q[2]

    return {
        price: quartiles([getattr(fit, price) for fit in fits])
        for price in ("per_bucket_s", "per_byte_s", "per_step_s")
        if fits
    }


def format_ddp_cost(result: dict[str, Any]) -> str:
    """Each model's step by way (median ms and the blocks' range), DDP's overhead over the step alone, and the
    fitted prices."""
    rows = []
    for model in result["models"]:
        alone = next(w["ms"] for w in model["ways"] if w["way"] == NO_DDP)
        for way in model["ways"]:
            low, high = way["range_ms"]
            rows.append(
                (
                    model["model"],
                    f"{model['gradient_bytes'] / 2**20:.3g}",
                    way["way"],
                    "-" if way["buckets"] is None else way["buckets"],
                    f"{way['ms']:.2f} ({low:.1f} to {high:.1f})",
                    "-" if way["way"] == NO_DDP else f"{way['overhead_ms']:+.2f} ({way['overhead_ms'] / alone:+.1%})",
                )
            )
    table = markdown_table(["model", "gradient (MiB)", "DDP", "buckets", "ms per step", "DDP's own cost (ms)"], rows)
    fit, spread = result["fit"], result.get("fit_quartiles", {})

    def price(key: str, scale: float, unit: str) -> str:
        low_high = spread.get(key)
        return f"{fit[key] * scale:.3g} {unit}" + (
            f" (blocks' quartiles {low_high[0] * scale:.3g} to {low_high[1] * scale:.3g})" if low_high else ""
        )

    return (
        f"{table}\n\nDDP's own cost: {price('per_step_s', 1e6, 'µs per step')} + "
        f"{price('per_bucket_s', 1e6, 'µs per bucket')} + {price('per_byte_s', 1e12, 'ps per byte of gradient')}; "
        f"{fit['source']}; median of {result['blocks']} blocks of {result['steps']} steps, the ways in turns."
    )
