"""A model's step time and efficiency from 1 to 1,024 nodes: compute from a measurement, communication from the α–β
model.

Weak scaling, every GPU keeping its batch: a step is the compute of one GPU's batch, DDP's own cost, the part of
the communication that the compute does not hide, and what the hidden part costs the compute beside it,

    step(N) = compute + ddp + (comm(N) - hidden(N)) + slowdown · hidden(N),
    hidden(N) = min(overlap · comm(N), backward),

with ``comm`` the layout's collectives on the site's links, bucket by bucket — DDP's buckets as DDP
fills them, whole layers each (:meth:`Workload.schedule`), at any overlap — each bucket with NCCL's
own choice of algorithm and protocol on a site that runs NCCL, the cheapest textbook algorithm
elsewhere (:func:`~dlscale.scaling.collectives.hierarchical_allreduce`), and
``overlap`` the share that DDP's buckets can hide behind the backward pass. Only the backward pass
can hide it — the first bucket is ready when backward starts, the last when it ends — so no
overlap hides more than the backward time (:attr:`Workload.backward_seconds`, two thirds of the
compute by default: the backward pass is about twice the forward). ``dlscale bench breakdown``
measures the overlap (:func:`overlap_from_breakdown`); ``overlap=AUTO`` estimates it at each size from DDP's
bucket schedule of the model's layers (:mod:`dlscale.scaling.overlap`), the default of ``dlscale project``.

The two terms beside the communication, each with a published default and a bench that measures it:

- ``ddp``: DDP's own cost per step, a price per bucket and per byte of gradient (:mod:`~dlscale.scaling.ddp_cost`;
  PyTorch's DDP benchmark: 3-5% of a step on one V100; ``dlscale bench ddp-cost`` here), on every step of DDP on
  more than one GPU;
- ``slowdown``: the extra compute per second of hidden communication (:mod:`~dlscale.scaling.slowdown`; 0.189,
  Lee et al. 2025; ``dlscale bench overlap`` here).

Efficiency is against a baseline: one GPU, which communicates nothing (``compute / step(N)``), or
one node (``step(1) / step(N)``: what a published weak-scaling curve that starts at one node
reports). Everything the curve rests on is printed beside it (:func:`assumptions`): a projection
is only as good as those lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import RangeError, check_range
from dlscale.reporting.tables import markdown_table
from dlscale.scaling.collectives import (
    ALGORITHMS,
    Link,
    allreduce,
    allreduce_choice,
    hierarchical_allreduce,
    layout_communication,
)
from dlscale.scaling.ddp_cost import PUBLISHED_DDP_COST, DdpCost
from dlscale.scaling.nccl import NCCL_VERSION
from dlscale.scaling.overlap import (
    DDP_BUCKET_MB,
    DDP_FIRST_BUCKET_BYTES,
    Layer,
    Schedule,
    bucket_schedule,
    scheduled_overlap,
    uniform_layers,
)
from dlscale.scaling.sites import Site
from dlscale.scaling.slowdown import OVERLAP_SLOWDOWN, OVERLAP_SLOWDOWN_SOURCE, slowdown_seconds

#: Node counts of a projection: 1, 2, 4, ..., 1,024.
NODES = tuple(2**i for i in range(11))
#: What an efficiency is measured against.
BASELINES = ("gpu", "node")
#: The backward pass's share of a step's compute, by default: about twice the forward pass, so two thirds.
BACKWARD_SHARE = 2 / 3
#: The overlap a projection estimates from DDP's bucket schedule (:mod:`dlscale.scaling.overlap`) at each size.
AUTO = "auto"
#: The first bucket by DDP's own rule: 1 MiB when ``bucket_cap_mb`` is left at its default (25 MiB), as large as
#: the others when it is given (torch's ``_DDPBucketAssignment``: ``first_bucket_bytes_cap`` is
#: ``_DEFAULT_FIRST_BUCKET_BYTES`` only ``if bucket_cap_mb is None``).
AS_DDP = "ddp"

#: ResNet-50's parameter count, the familiar yardstick of data-parallel scaling studies (25.6 M; He et al. 2016).
RESNET50_PARAMETERS = 25_557_032
#: ResNet-50 training throughput reported for one A100 with mixed precision, images per second: about 2,600
#: (NVIDIA's DeepLearningExamples, ResNet-50 v1.5 for PyTorch, A100 80 GB, AMP). A projection starts from a
#: measured or reported throughput, not an assumed share of the peak: 30% of 312 TFLOP/s would be about 3,800.
RESNET50_A100_IMAGES_PER_S = 2600.0


@dataclass(frozen=True)
class Workload:
    """What a projection needs of a model: its gradient, its compute per sample, the batch and the layout."""

    name: str
    parameters: int
    seconds_per_sample: float  # one GPU's compute per sample (forward, backward, optimizer)
    per_gpu_batch: int
    bytes_per_value: int = 4  # of each gradient value sent (2 with bf16 gradients)
    layout: str = "ddp"  # or "fsdp"
    overlap: float | str = 0.0  # share of the communication hidden behind the backward pass, or AUTO: estimated
    compute_source: str = "entered"  # where seconds_per_sample comes from
    backward_share: float = BACKWARD_SHARE  # of the compute: the most that any overlap can hide behind
    bucket_mb: float | None = DDP_BUCKET_MB  # DDP's bucket_cap_mb: one message, and one latency, per bucket (None: one)
    algorithm: str = "auto"  # between nodes: ring, tree, double_tree, or auto (NCCL's choice; else the cheapest)
    layers: tuple[Layer, ...] | None = None  # the model's layers, which DDP's buckets hold whole (None: even pieces)
    layers_source: str = ""  # where the layers come from
    # DDP's first bucket: AS_DDP (1 MiB at the default cap of 25 MiB, else as the others: an explicit 25 cannot be
    # told from the default and is read as it), a size in MiB, or None (as the others)
    first_bucket_mb: float | str | None = AS_DDP
    ddp_cost: DdpCost = PUBLISHED_DDP_COST  # DDP's own cost per bucket and per byte (ddp layout, more than one GPU)
    slowdown: float = OVERLAP_SLOWDOWN  # extra compute per second of communication hidden behind it
    slowdown_source: str = OVERLAP_SLOWDOWN_SOURCE

    def __post_init__(self) -> None:
        check_range("parameters", self.parameters, 1)
        check_range("seconds per sample", self.seconds_per_sample, 0, above=True)
        check_range("per-GPU batch", self.per_gpu_batch, 1)
        check_range("bytes per value", self.bytes_per_value, 1, 8)
        # At most all of the communication can hide behind compute: more would give an efficiency above 100%.
        if self.overlap != AUTO:
            check_range("overlap (the share of communication hidden)", self.overlap, 0, 1)
        check_range("backward share (of the compute)", self.backward_share, 0, 1)
        # (at 1 a hidden second costs what an exposed one does: above it, overlapping would be worse than not)
        check_range("slow-down of the overlapped compute", self.slowdown, 0, 1)
        if self.bucket_mb is not None:
            check_range("bucket size (MiB)", self.bucket_mb, 0, above=True)
        if self.first_bucket_mb == AS_DDP or self.first_bucket_mb is None:
            pass
        elif isinstance(self.first_bucket_mb, str):
            raise RangeError(f"first bucket must be a size in MiB, None or {AS_DDP!r}, not {self.first_bucket_mb!r}")
        else:
            check_range("first bucket size (MiB)", self.first_bucket_mb, 0, above=True)
        if self.layout not in ("ddp", "fsdp"):
            raise RangeError(f"layout must be ddp or fsdp, not {self.layout!r}")
        if self.algorithm not in ALGORITHMS:
            raise RangeError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")

    @property
    def gradient_bytes(self) -> float:
        return self.parameters * self.bytes_per_value

    @property
    def compute_seconds(self) -> float:
        return self.per_gpu_batch * self.seconds_per_sample

    @property
    def backward_seconds(self) -> float:
        """The compute that communication can hide behind: the backward pass."""
        return self.backward_share * self.compute_seconds

    @property
    def first_bucket_bytes(self) -> float | None:
        """DDP's first bucket, bytes (None: as large as the others)."""
        if self.first_bucket_mb == AS_DDP:
            return DDP_FIRST_BUCKET_BYTES if self.bucket_mb == DDP_BUCKET_MB else None
        return self.first_bucket_mb * 2**20 if self.first_bucket_mb else None

    def schedule(self) -> Schedule:
        """DDP's buckets for this model, in the order the backward pass fills them (:func:`bucket_schedule`): whole
        layers each (DDP never splits a tensor), the first closing at :attr:`first_bucket_bytes`."""
        bucket = self.bucket_mb * 2**20 if self.bucket_mb else None
        first = self.first_bucket_bytes
        if self.layers:
            return bucket_schedule(self.layers, self.bytes_per_value, bucket, first, self.layers_source)
        even = "assumed: the backward pass makes the gradient's bytes at an even rate (no layer table given)"
        return bucket_schedule(uniform_layers(self.parameters), self.bytes_per_value, bucket, first, even)

    def describe_overlap(self) -> str:
        """The overlap as the assumptions print it."""
        if self.overlap != AUTO:
            return f"{self.overlap:.0%} of the communication hidden, at most the backward pass"
        if self.layout != "ddp":
            return "none estimated for fsdp (its all-gathers' prefetch is not modelled): nothing hidden"
        if not self.layers:
            return (
                "estimated at each size from DDP's bucket schedule, assuming the backward pass makes the "
                "gradient's bytes at an even rate (no layer table given); the buckets sent in order on one link"
            )
        return (
            f"estimated at each size from DDP's bucket schedule of {self.layers_source or 'the given layers'} "
            "(each layer's backward time in proportion to its forward operations; the buckets sent in order on "
            "one link)"
        )


def project_efficiency(
    workload: Workload, site: Site, nodes: tuple[int, ...] = NODES, baseline: str = "gpu"
) -> list[dict]:
    """One row per node count: compute, communication, the part hidden and the part exposed, DDP's own cost and the
    slow-down of the overlapped compute, step time, efficiency against ``baseline`` (``gpu`` or ``node``), samples/s,
    the algorithm between nodes and the messages per step."""
    if baseline not in BASELINES:
        raise RangeError(f"baseline must be gpu or node, not {baseline!r}")

    # DDP's buckets hold whole layers, at any overlap; FSDP's units are even slices of the gradient
    schedule = workload.schedule() if workload.layout == "ddp" else None
    share = 0.0 if workload.overlap == AUTO else workload.overlap

    def step_at(n: int) -> dict:
        g = site.gpus_per_node
        if schedule is not None:

            def price(size: float) -> float:
                return hierarchical_allreduce(size, g, n, site.inside, site.between, workload.algorithm, site.nccl)

            sent = scheduled_overlap(schedule, workload.backward_seconds, price)
            seconds, messages = sent.communication, sent.buckets
            if workload.overlap == AUTO:
                hidden, bounded = sent.hidden, False
            else:
                hidden = min(share * seconds, workload.backward_seconds)
                bounded = share * seconds > workload.backward_seconds
            algorithm = allreduce_choice(
                max(schedule.sizes), g, n, site.inside, site.between, workload.algorithm, site.nccl
            )
        else:
            comm = layout_communication(
                workload.layout,
                workload.gradient_bytes,
                g,
                n,
                site.inside,
                site.between,
                workload.algorithm,
                workload.bucket_mb * 2**20 if workload.bucket_mb else None,
                site.nccl,
            )
            seconds, algorithm, messages = comm.seconds, comm.algorithm, comm.messages
            hidden = min(share * seconds, workload.backward_seconds)
            bounded = share * seconds > workload.backward_seconds
        # DDP's own cost: on every step of DDP over more than one GPU (one GPU trains without DDP)
        ddp = (
            workload.ddp_cost.seconds(messages, workload.gradient_bytes)
            if workload.layout == "ddp" and n * g > 1
            else 0.0
        )
        slowdown = slowdown_seconds(hidden, workload.slowdown)
        exposed = seconds - hidden
        step = workload.compute_seconds + ddp + exposed + slowdown
        return {
            "nodes": n,
            "gpus": n * site.gpus_per_node,
            "compute_s": workload.compute_seconds,
            "communication_s": seconds,
            "hidden_s": hidden,
            "exposed_s": exposed,
            "ddp_s": ddp,
            "slowdown_s": slowdown,
            "overlap": max(0.0, hidden / seconds) if seconds > 0 else 0.0,
            "overlap_bounded": bounded,
            "step_s": step,
            "samples_per_s": n * site.gpus_per_node * workload.per_gpu_batch / step,
            "algorithm": algorithm,
            "messages": messages,
        }

    rows = [step_at(n) for n in nodes]
    reference = workload.compute_seconds if baseline == "gpu" else step_at(1)["step_s"]
    for row in rows:
        row["efficiency"] = reference / row["step_s"]
        row["baseline"] = baseline
    return rows


def largest_efficient(rows: list[dict], at_least: float) -> int | None:
    """The most nodes whose predicted efficiency is still ``at_least`` (None if even one node is below)."""
    fitting = [r["nodes"] for r in rows if r["efficiency"] >= at_least]
    return max(fitting) if fitting else None


def overlap_from_breakdown(exposed_seconds: float, gradient_bytes: float, ranks: int, link: Link) -> float:
    """The share of a step's all-reduce that the backward pass hid: one minus what the breakdown saw exposed
    over what the fitted model says the whole all-reduce takes (clipped to 0..1)."""
    return _hidden_share(exposed_seconds, allreduce(gradient_bytes, ranks, link))


def _hidden_share(exposed: float, whole: float) -> float:
    """One minus the exposed share of the whole communication, clipped to 0..1 (0 when the model has none)."""
    return min(1.0, max(0.0, 1 - exposed / whole)) if whole > 0 else 0.0


def overlap_from_breakdown_file(path: str | Path, site: Site) -> tuple[float, str]:
    """The overlap a ``dlscale bench breakdown`` run on ``site`` measured, and one line saying where it comes from:
    its largest size's exposed communication (at the default buckets) against the model's whole communication for
    that size on the site's links. A breakdown that cannot give one is a :class:`RangeError` naming the file."""
    import json

    path = Path(path)
    try:
        result = json.loads(path.read_text())
        rows = [r for r in result["rows"] if r.get("exposed_communication_ms")]
        row = max(rows, key=lambda r: r["ranks"])
        exposed = next(iter(row["exposed_communication_ms"].values())) / 1000  # (the default buckets come first)
        nodes, ranks, gradient = int(row.get("nodes", 1)), int(row["ranks"]), float(row["gradient_bytes"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise RangeError(
            f"{path} gives no overlap ({getattr(err, 'strerror', None) or type(err).__name__}): give "
            f"the breakdown.json of a `dlscale bench breakdown` run of DDP on two or more ranks"
        ) from None
    whole = layout_communication(
        "ddp", gradient, max(1, ranks // nodes), nodes, site.inside, site.between, nccl=site.nccl
    ).seconds
    overlap = _hidden_share(exposed, whole)
    return overlap, (
        f"{overlap:.0%}, from {path}: {exposed * 1e3:.3g} ms exposed of the {whole * 1e3:.3g} ms the "
        f"model gives {ranks} ranks on {nodes} node(s) of {site.name}"
    )


def assumptions(workload: Workload, site: Site, baseline: str = "gpu") -> str:
    """The lines a projection rests on, to print beside its curve."""
    first = workload.first_bucket_bytes
    buckets = (
        f"buckets of {workload.bucket_mb:g} MiB of whole layers"
        + (f" (the first of {first / 2**20:g} MiB, as DDP's default)" if first else "")
        if workload.bucket_mb
        else "one message per step"
    )
    return "\n".join(
        [
            f"model: {workload.name}, {workload.parameters / 1e6:.3g} M parameters, gradients of "
            f"{workload.gradient_bytes / 2**20:.3g} MiB ({workload.bytes_per_value} bytes per value), {buckets}",
            f"compute: {workload.seconds_per_sample * 1e3:.3g} ms per sample per GPU ({workload.compute_source}), "
            f"batch {workload.per_gpu_batch} per GPU (weak scaling)",
            f"layout: {workload.layout}; overlap: {workload.describe_overlap()} (the backward pass: "
            f"{workload.backward_share:.0%} of the compute)",
            f"algorithm between nodes: {workload.algorithm}" + _describe_auto(workload, site),
            (
                f"DDP's own cost: {workload.ddp_cost.describe()}, on every step of DDP over more than one GPU"
                if workload.layout == "ddp"
                else "DDP's own cost: none (fsdp: its own bookkeeping is not priced)"
            ),
            f"overlap slow-down: each second of communication hidden costs the backward pass {workload.slowdown:.3g} "
            f"s more ({workload.slowdown_source})",
            f"site: {site.name}, {site.gpus_per_node} GPUs per node; efficiency against one {baseline}",
            f"inside a node: {site.inside.describe()}",
            f"between nodes, per GPU: {site.between.describe()}",
            f"source: {site.source}",
            "not modelled: congestion between jobs, stragglers, the network's topology, I/O",
        ]
    )


def _describe_auto(workload: Workload, site: Site) -> str:
    """What ``auto`` means on this site, for the assumptions."""
    if workload.algorithm != "auto":
        return ""
    if site.nccl is not None and workload.layout == "ddp":
        return (
            f" (NCCL's own choice of algorithm and protocol for each bucket, priced by NCCL {NCCL_VERSION}'s tuning "
            f"model with its own latencies, not the α below; it reads {site.nccl.describe()})"
        )
    return " (the cheapest of ring, tree and double binary tree for each bucket, NCCL's tree rating included)"


def format_projection(rows: list[dict]) -> str:
    """A projection as a Markdown table: per node count, compute, communication, its exposed part, DDP's own cost,
    the slow-down of the overlapped compute, the algorithm between nodes, efficiency."""
    return markdown_table(
        [
            "nodes",
            "GPUs",
            "compute (ms)",
            "communication (ms)",
            "overlap",
            "exposed (ms)",
            "DDP's own (ms)",
            "overlap slow-down (ms)",
            "algorithm",
            "efficiency",
        ],
        [
            (
                r["nodes"],
                r["gpus"],
                f"{r['compute_s'] * 1e3:.3g}",
                f"{r['communication_s'] * 1e3:.3g}",
                f"{max(0.0, r['overlap']):.0%}" if r["communication_s"] > 0 else "-",
                f"{r['exposed_s'] * 1e3:.3g}" + (" (overlap bounded)" if r["overlap_bounded"] else ""),
                f"{r.get('ddp_s', 0.0) * 1e3:.3g}",
                f"{r.get('slowdown_s', 0.0) * 1e3:.3g}",
                r["algorithm"] if r["nodes"] > 1 else "-",
                f"{r['efficiency']:.0%}",
            )
            for r in rows
        ],
    )


def workload_for(
    cfg,
    per_gpu_batch: int,
    seconds_per_sample: float,
    compute_source: str,
    overlap: float = 0.0,
    bytes_per_value: int = 4,
    name: str | None = None,
) -> Workload:
    """The :class:`Workload` of the kit's model that ``cfg`` describes, its parameters counted on the meta device (no
    memory, no kernel), its compute per sample measured (``compute_source`` says where: a step timed on this
    machine, a published throughput)."""
    import torch

    from dlscale.models import build_model, count_parameters

    with torch.device("meta"):
        model = build_model(cfg)
    return Workload(
        name or f"{cfg.name} ({cfg.model})",
        count_parameters(model),
        seconds_per_sample,
        per_gpu_batch,
        bytes_per_value,
        "ddp",
        overlap,
        compute_source,
    )
