"""``dlscale bench overlap``: what an all-reduce running beside the backward pass costs it (lesson 11).

On every rank (two or more, under torchrun or ``--nproc``), the engine's model (its config) does a forward pass on a
batch of its own input shape, untimed, then a backward pass timed three ways, in turns over blocks:

- **backward alone**;
- **all-reduce alone**: the model's gradient's bytes, in DDP's buckets of 25 MiB, one after another;
- **backward beside the all-reduce**: the same all-reduces started (asynchronously) as the backward pass starts,
  the backward pass timed to its own end (on a GPU its stream alone: NCCL's kernels run on their own).

The ranks start each timed pass together (a barrier) and each figure is the slowest rank's. The slow-down factor is
the backward pass's extra time over the seconds the all-reduce ran beside it,

    factor = (backward beside − backward alone) / min(all-reduce alone, backward beside),

the ``slowdown`` of ``dlscale project`` measured here (:mod:`~dlscale.scaling.slowdown`; ``--slowdown
overlap.json``). With gloo on a CPU the all-reduce's threads take cores from the compute's; with NCCL on a GPU its
kernels take SMs and memory bandwidth. On a CPU whose cores the ranks already fill, the factor says what
oversubscription costs as much as what the all-reduce does: read it with the threads it names.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dlscale.reporting.tables import markdown_table

#: DDP's default bucket, bytes: the all-reduce beside the backward pass goes out in messages of this size.
BUCKET_BYTES = 25 * 2**20
ALONE, ALLREDUCE, BESIDE = "backward alone", "all-reduce alone", "backward beside the all-reduce"


def slowdown_factor(backward_alone: float, allreduce_alone: float, backward_beside: float) -> float:
    """Extra backward seconds per second of all-reduce beside it (0 when nothing ran beside it)."""
    overlapped = min(allreduce_alone, backward_beside)
    return max(0.0, backward_beside - backward_alone) / overlapped if overlapped > 0 else 0.0


def _buckets(gradient_bytes: int, device: torch.device) -> list[torch.Tensor]:
    """Float32 buffers holding ``gradient_bytes`` in DDP's buckets of :data:`BUCKET_BYTES`."""
    sizes = [BUCKET_BYTES] * (gradient_bytes // BUCKET_BYTES) + [gradient_bytes % BUCKET_BYTES]
    return [torch.ones(max(1, size // 4), device=device) for size in sizes if size]


def _timers(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, buckets: list[torch.Tensor]) -> dict:
    """The three timed passes, each returning its seconds on this rank."""
    import torch.distributed as dist

    on_gpu = x.device.type == "cuda"

    def compute_done() -> None:  # (the compute's own stream: NCCL's kernels beside it are not waited for)
        if on_gpu:
            torch.cuda.current_stream().synchronize()

    def backward(beside: bool) -> Callable[[], float]:
        def run() -> float:
            model.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            compute_done()
            dist.barrier()
            start = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in buckets] if beside else []
            loss.backward()
            compute_done()
            seconds = time.perf_counter() - start
            for work in works:
                work.wait()
            if on_gpu:
                torch.cuda.synchronize()
            return seconds

        return run

    def allreduce() -> float:
        dist.barrier()
        start = time.perf_counter()
        for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
            work.wait()
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return {ALONE: backward(False), ALLREDUCE: allreduce, BESIDE: backward(True)}


def bench_overlap(cfg, blocks: int = 10, out_dir: str | Path = "runs/overlap") -> dict[str, Any] | None:
    """Time the backward pass of ``cfg``'s model alone and beside an all-reduce of its gradient's bytes, on every
    rank of the job (run it on every rank); rank 0 writes ``overlap.json`` into ``out_dir`` and returns the result,
    the others None."""
    from dlscale import distributed
    from dlscale.bench.allreduce import slowest_rank
    from dlscale.models import build_model
    from dlscale.runtime.devices import cpu_name
    from dlscale.runtime.threads import apply_threads

    env = distributed.init(cfg.device)
    if not env.distributed:
        raise distributed.DistributedError(
            "bench overlap needs several ranks (an all-reduce of one sends nothing): run it under torchrun, srun "
            "or mpirun, or pass --nproc N to start N local processes"
        )
    threads = apply_threads(requested=cfg.threads)
    device = torch.device(env.device)
    torch.manual_seed(cfg.seed + env.rank)
    model = build_model(cfg).to(device)
    x = torch.randn(cfg.micro_batch(env.world_size), 1, cfg.image_size, cfg.image_size, device=device)
    y = torch.randn(len(x), model(x[:1]).shape[-1], device=device)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    timers = _timers(model, x, y, _buckets(gradient_bytes, device))
    for timer in timers.values():  # (warm-up: the first passes allocate)
        timer()
    seconds: dict[str, list[float]] = {name: [] for name in timers}
    for block in range(blocks):
        for name in timers if block % 2 == 0 else reversed(list(timers)):
            seconds[name].append(slowest_rank(timers[name](), device))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    per_block = [slowdown_factor(seconds[ALONE][i], seconds[ALLREDUCE][i], seconds[BESIDE][i]) for i in range(blocks)]
    result = {
        "machine": cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "backend": env.backend,
        "ranks": env.world_size,
        "threads": threads.count,
        "model": f"{cfg.model} ({cfg.name})",
        "per_rank_batch": len(x),
        "gradient_bytes": gradient_bytes,
        "buckets": len(_buckets(gradient_bytes, torch.device("meta"))),
        "blocks": blocks,
        "ms": {name: 1000 * value for name, value in median.items()},
        "range_ms": {name: (1000 * min(v), 1000 * max(v)) for name, v in seconds.items()},
        "slowdown": slowdown_factor(median[ALONE], median[ALLREDUCE], median[BESIDE]),
        "slowdown_range": (min(per_block), max(per_block)),
    }
    if env.rank == 0:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "overlap.json").write_text(json.dumps(result, indent=1) + "\n")
    distributed.shutdown()
    return result if env.rank == 0 else None


def format_overlap(result: dict[str, Any]) -> str:
    """The three passes (median ms, the blocks' range) and the slow-down factor."""
    table = markdown_table(
        ["pass", "ms (slowest rank)", "blocks' range"],
        [
            (name, f"{ms:.1f}", "{:.1f} to {:.1f}".format(*result["range_ms"][name]))
            for name, ms in result["ms"].items()
        ],
    )
    low, high = result["slowdown_range"]
    return (
        f"{table}\n\nslow-down of the overlapped backward pass: {result['slowdown']:.2f} s per second of all-reduce "
        f"beside it (blocks: {low:.2f} to {high:.2f}); {result['model']}, batch {result['per_rank_batch']} per rank, "
        f"{result['gradient_bytes'] / 2**20:.3g} MiB of gradient in {result['buckets']} bucket(s), "
        f"{result['backend']} on {result['ranks']} ranks of {result['threads']} thread(s), {result['machine']}, "
        f"torch {result['torch']}."
    )
