"""The pipeline's bubble, measured: each stage's step time, the share of it the stage idles, and the activations it
holds at most, beside the textbook idle share ``(p - 1) / (v·m + p - 1)`` (lesson 10, the pipeline).

:func:`bench_pipeline` starts ``stages`` local ranks (torchrun) that each run :func:`measure_pipeline`: the
config's ViT cut into stages (:mod:`dlscale.distributed.pipeline`), random maps, and a few steps of each schedule
and micro-batch count after one untimed step (the stages learn their shapes in it). On every rank, each step:

- ``step_ms``: the schedule's step, from a barrier (every stage starts together) to its end; the median step;
- ``busy_ms``: the time in the stage's own forwards and backwards (torch's ``PipelineStage.forward_one_chunk``,
  ``backward_one_chunk`` and ``backward_weight_one_chunk``); the rest of the step it waits for a neighbour's
  activations or gradients (or sends): ``idle_share = 1 - busy / step``;
- ``peak_activation_bytes``: the most bytes autograd held for backward passes still to come on that stage
  (:class:`dlscale.metrics.memory.HeldActivations`: tensors counted as saved and as released; parameters not).
  On a GPU the allocator's peak would count the same and more; on a CPU nothing else tells activations apart.

The textbook share assumes every micro-batch's forward and backward take the same time on every stage and a send
takes none; the measured one also holds the embedding on the first stage, the head and loss on the last, the sends
and, on a CPU shared with other processes, the time another process had the core (keep ``stages`` at most the
CPUs, each rank one thread).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dlscale.reporting.tables import markdown_table

#: What each row holds, in the order the table shows it.
COLUMNS = (
    "schedule",
    "stages",
    "microbatches",
    "virtual_stages",
    "stage",
    "step_ms",
    "busy_ms",
    "idle_share",
    "textbook_bubble",
    "peak_activation_bytes",
)


def runnable(schedules: Iterable[str], microbatches: Iterable[int], stages: int, virtual: int) -> Iterator:
    """(schedule, micro-batches, stages per rank) for each run, leaving out what the schedule cannot run: 1F1B
    below ``stages`` micro-batches (its warm-up puts one in every stage), interleaved-1f1b above ``stages`` unless a
    multiple (it runs them in rounds of ``stages``), as the config refuses them."""
    for schedule in schedules:
        for count in microbatches:
            if schedule == "1f1b" and count < stages:
                continue
            if schedule == "interleaved-1f1b" and count > stages and count % stages:
                continue
            yield schedule, count, virtual if schedule == "interleaved-1f1b" else 1


@contextmanager
def time_stages(stages: list[Any], busy: list[float]) -> Iterator[None]:
    """Add the time each of ``stages`` spends in its own forwards and backwards to ``busy[0]``."""
    methods = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")

    def timing(method: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                busy[0] += time.perf_counter() - start

        return timed

    for stage in stages:  # (the instance's attribute shadows the class's method; removed again below)
        for name in methods:
            setattr(stage, name, timing(getattr(stage, name)))
    try:
        yield
    finally:
        for stage in stages:
            for name in methods:
                delattr(stage, name)


def measure_pipeline(
    cfg: Any,
    schedules: Iterable[str] = ("gpipe", "1f1b"),
    microbatches: Iterable[int] = (1, 2, 4, 8),
    virtual: int = 2,
    steps: int = 3,
) -> list[dict[str, Any]]:
    """Time each schedule at each micro-batch count on this job's ranks (one stage per rank; ``virtual`` per rank
    for interleaved-1f1b); run on every rank. Returns every stage's rows on rank 0 (an empty list elsewhere).

    ``cfg`` is a :class:`~dlscale.config.TrainConfig` with ``model=vit``: its width, depth and image size make the
    model, its ``global_batch_size`` the batch of one step, cut into each micro-batch count (which must divide it).
    """
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    from dlscale import distributed
    from dlscale.data.synthetic import TARGET_NAMES
    from dlscale.distributed.pipeline import build_pipeline, pipeline_stages, textbook_bubble
    from dlscale.metrics.memory import HeldActivations
    from dlscale.models import build_model

    env = distributed.init("cpu")
    stages = env.world_size
    mesh = init_device_mesh("cpu", (stages, 1, 1), mesh_dim_names=("pp", "dp", "tp"))
    generator = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.global_batch_size, 1, cfg.image_size, cfg.image_size, generator=generator)
    y = torch.randn(cfg.global_batch_size, len(TARGET_NAMES), generator=generator)
    rows = []
    for schedule, count, per_rank in runnable(schedules, microbatches, stages, virtual):
        with torch.device("meta"):
            whole = build_model(cfg)
        modules = pipeline_stages(whole, stages, env.rank, per_rank)
        for module in modules:
            module.to_empty(device="cpu")
            module.init_weights(cfg.seed)
        pipeline = build_pipeline(
            modules, mesh, schedule, count, per_rank, cfg.global_batch_size, torch.device("cpu"), nn.MSELoss()
        )
        pipeline.forward_backward(x, y)  # (untimed: the stages learn their shapes, and the kernels warm up)
        times, busy_times, peak = [], [], 0
        for _ in range(steps):
            busy = [0.0]
            for module in modules:
                module.zero_grad(set_to_none=True)
            dist.barrier()  # (every stage starts the step together)
            with time_stages(pipeline.stages, busy), HeldActivations(nn.ModuleList(modules)) as held:
                start = time.perf_counter()
                pipeline.forward_backward(x, y)
                times.append(time.perf_counter() - start)
            busy_times.append(busy[0])
            peak = max(peak, held.peak)
        step, busy_s = statistics.median(times), statistics.median(busy_times)
        row = {
            "schedule": schedule,
            "stages": stages,
            "microbatches": count,
            "virtual_stages": per_rank,
            "stage": env.rank,
            "step_ms": 1000 * step,
            "busy_ms": 1000 * busy_s,
            "idle_share": max(0.0, 1 - busy_s / step),
            "textbook_bubble": textbook_bubble(stages, count, per_rank),
            "peak_activation_bytes": peak,
        }
        rows.extend(distributed.all_gather_object(row))
    return rows if env.is_main else []


def bench_pipeline(
    cfg: Any = "vit-tiny",
    stages: int = 2,
    schedules: Iterable[str] = ("gpipe", "1f1b"),
    microbatches: Iterable[int] = (1, 2, 4, 8),
    virtual: int = 2,
    steps: int = 3,
    out_dir: str | Path = "runs/pipeline",
) -> list[dict[str, Any]]:
    """Measure the pipeline's bubble on ``stages`` local ranks (one thread each) and return the rows, one per stage of
    each schedule and micro-batch count (:data:`COLUMNS`); also written to ``out_dir/pipeline.json``.

    ``cfg`` is a config name or :class:`~dlscale.config.TrainConfig` (its ViT needs ``stages × virtual`` blocks
    for interleaved-1f1b, ``stages`` otherwise: the depth is raised to that where it is less).
    """
    from dlscale.config import TrainConfig, load_config
    from dlscale.jobs.local_ranks import run_local, torchrun_command

    cfg = cfg if isinstance(cfg, TrainConfig) else load_config(cfg)
    schedules, microbatches = list(schedules), list(microbatches)
    if stages < 2:
        raise ValueError(f"a pipeline has 2 stages or more; got stages={stages}")
    uneven = [count for count in microbatches if count < 1 or cfg.global_batch_size % count]
    if uneven:
        raise ValueError(
            f"micro-batch counts must divide global_batch_size={cfg.global_batch_size}; {uneven[0]} does not"
        )
    blocks = stages * (virtual if "interleaved-1f1b" in schedules else 1)
    values = {**cfg.to_dict(), "depth": max(cfg.depth, blocks), "pipeline_parallel": 1}
    out = Path(out_dir) / "pipeline.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"schedules": schedules, "microbatches": list(microbatches), "virtual": virtual, "steps": steps}
    arguments = ["dlscale.bench.pipeline", str(out), json.dumps(settings), json.dumps(_plain(values))]
    run_local(torchrun_command(stages, arguments), f"the pipeline's measurement on {stages} ranks", threads=1)
    return json.loads(out.read_text())


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def format_pipeline(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table: each stage's step, its idle share beside the textbook's, its activations."""
    return markdown_table(
        ["schedule", "p", "m", "v", "stage", "step ms", "busy ms", "idle", "textbook", "activations KiB"],
        [
            (
                r["schedule"],
                r["stages"],
                r["microbatches"],
                r["virtual_stages"],
                r["stage"],
                f"{r['step_ms']:.1f}",
                f"{r['busy_ms']:.1f}",
                f"{r['idle_share']:.2f}",
                f"{r['textbook_bubble']:.2f}",
                f"{r['peak_activation_bytes'] / 1024:,.0f}",
            )
            for r in rows
        ],
    )


def _main(argv: list[str]) -> None:
    """Under torchrun: ``python -m dlscale.bench.pipeline OUT SETTINGS CONFIG`` (the last two as JSON)."""
    from dlscale import distributed
    from dlscale.config import TrainConfig

    out, settings, values = Path(argv[0]), json.loads(argv[1]), json.loads(argv[2])
    try:
        rows = measure_pipeline(TrainConfig(**values), **settings)
        if rows:
            out.write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        distributed.shutdown(drain=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
