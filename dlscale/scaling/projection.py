"""A model's step time and efficiency from 1 to 1,024 nodes: compute from a measurement, communication from the α–β model.

Weak scaling, every GPU keeping its batch: a step is the compute of one GPU's batch plus the part
of the communication that the compute does not hide,

    step(N) = batch · seconds_per_sample + (1 - overlap) · comm(N),

with ``comm`` the layout's collectives on the site's links (:func:`~dlscale.scaling.collectives.layout_seconds`)
and ``overlap`` the share hidden behind the backward pass (DDP's buckets), which ``dlscale bench
breakdown`` measures (:func:`overlap_from_breakdown`). Efficiency is against one GPU, which
communicates nothing: ``compute / step(N)``. Everything the curve rests on is printed beside it
(:func:`assumptions`): a projection is only as good as those lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import RangeError, check_range
from dlscale.reporting.tables import markdown_table
from dlscale.scaling.collectives import Link, allreduce, layout_seconds
from dlscale.scaling.sites import Site

#: Node counts of a projection: 1, 2, 4, ..., 1,024.
NODES = tuple(2 ** i for i in range(11))

#: ResNet-50's parameter count, the familiar yardstick of data-parallel scaling studies (25.6 M; He et al. 2016).
RESNET50_PARAMETERS = 25_557_032
#: ResNet-50's FLOPs per training sample at 224×224: 4.1 G multiply-adds forward (He et al. 2016), 2 FLOPs each,
#: and the backward pass about twice the forward.
RESNET50_TRAIN_FLOPS = 3 * 2 * 4.1e9


@dataclass(frozen=True)
class Workload:
    """What a projection needs of a model: its gradient, its compute per sample, the batch and the layout."""

    name: str
    parameters: int
    seconds_per_sample: float       # one GPU's compute per sample (forward, backward, optimizer)
    per_gpu_batch: int
    bytes_per_value: int = 4        # of each gradient value sent (2 with bf16 gradients)
    layout: str = "ddp"             # or "fsdp"
    overlap: float = 0.0            # share of the communication hidden behind compute (0 = none)
    compute_source: str = "entered"  # where seconds_per_sample comes from

    def __post_init__(self) -> None:
        check_range("parameters", self.parameters, 1)
        check_range("seconds per sample", self.seconds_per_sample, 0, above=True)
        check_range("per-GPU batch", self.per_gpu_batch, 1)
        check_range("bytes per value", self.bytes_per_value, 1, 8)
        # At most all of the communication can hide behind compute: more would give an efficiency above 100%.
        check_range("overlap (the share of communication hidden)", self.overlap, 0, 1)
        if self.layout not in ("ddp", "fsdp"):
            raise RangeError(f"layout must be ddp or fsdp, not {self.layout!r}")

    @property
    def gradient_bytes(self) -> float:
        return self.parameters * self.bytes_per_value

    @property
    def compute_seconds(self) -> float:
        return self.per_gpu_batch * self.seconds_per_sample


def project(workload: Workload, site: Site, nodes: tuple[int, ...] = NODES) -> list[dict]:
    """One row per node count: compute, communication and its exposed part, step time, efficiency, samples/s."""
    rows = []
    for n in nodes:
        comm = layout_seconds(workload.layout, workload.gradient_bytes, site.gpus_per_node, n, site.inside,
                              site.between)
        step = workload.compute_seconds + (1 - workload.overlap) * comm
        rows.append({"nodes": n, "gpus": n * site.gpus_per_node, "compute_s": workload.compute_seconds,
                     "communication_s": comm, "exposed_s": step - workload.compute_seconds, "step_s": step,
                     "efficiency": workload.compute_seconds / step,
                     "samples_per_s": n * site.gpus_per_node * workload.per_gpu_batch / step})
    return rows


def largest_efficient(rows: list[dict], at_least: float) -> int | None:
    """The most nodes whose predicted efficiency is still ``at_least`` (None if even one node is below)."""
    fitting = [r["nodes"] for r in rows if r["efficiency"] >= at_least]
    return max(fitting) if fitting else None


def overlap_from_breakdown(exposed_seconds: float, gradient_bytes: float, ranks: int, link: Link) -> float:
    """The share of a step's all-reduce that the backward pass hid: one minus what the breakdown saw exposed
    over what the fitted model says the whole all-reduce takes (clipped to 0..1)."""
    whole = allreduce(gradient_bytes, ranks, link)
    return min(1.0, max(0.0, 1 - exposed_seconds / whole)) if whole > 0 else 0.0


def assumptions(workload: Workload, site: Site) -> str:
    """The lines a projection rests on, to print beside its curve."""
    return "\n".join([
        f"model: {workload.name}, {workload.parameters / 1e6:.3g} M parameters, gradients of "
        f"{workload.gradient_bytes / 2**20:.3g} MiB ({workload.bytes_per_value} bytes per value)",
        f"compute: {workload.seconds_per_sample * 1e3:.3g} ms per sample per GPU ({workload.compute_source}), "
        f"batch {workload.per_gpu_batch} per GPU (weak scaling)",
        f"layout: {workload.layout}; overlap: {workload.overlap:.0%} of the communication hidden",
        f"site: {site.name}, {site.gpus_per_node} GPUs per node",
        f"inside a node: {site.inside.describe()}",
        f"between nodes, per GPU: {site.between.describe()}",
        f"source: {site.source}",
        "not modelled: congestion between jobs, stragglers, the network's topology, I/O",
    ])


def format_projection(rows: list[dict]) -> str:
    """A projection as a Markdown table: per node count, compute, communication, its exposed part, efficiency."""
    return markdown_table(["nodes", "GPUs", "compute (ms)", "communication (ms)", "exposed (ms)", "efficiency"],
                          [(r["nodes"], r["gpus"], f"{r['compute_s'] * 1e3:.3g}", f"{r['communication_s'] * 1e3:.3g}",
                            f"{r['exposed_s'] * 1e3:.3g}", f"{r['efficiency']:.0%}") for r in rows])


def workload_for(cfg, per_gpu_batch: int, peak_flops: float, mfu: float, overlap: float = 0.0,
                 bytes_per_value: int = 4, name: str | None = None) -> Workload:
    """The :class:`Workload` of the kit's model that ``cfg`` describes: parameters and FLOPs per sample counted on
    the meta device (no memory, no kernel), compute per sample = FLOPs / (``peak_flops`` × ``mfu``)."""
    import torch
    from torch import nn

    from dlscale.models import build_model, count_parameters
    from dlscale.profiling import count_flops

    with torch.device("meta"):
        model = build_model(cfg)
        flops = count_flops(build_model(cfg), (1, cfg.image_size, cfg.image_size), nn.MSELoss(), 3).per_sample
    return Workload(name or f"{cfg.name} ({cfg.model})", count_parameters(model), flops / (peak_flops * mfu),
                    per_gpu_batch, bytes_per_value, "ddp", overlap,
                    f"{flops / 1e9:.3g} GFLOP per sample at {mfu:.0%} of {peak_flops / 1e12:.0f} TFLOP/s")
