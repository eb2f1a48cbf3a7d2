"""DDP's own cost per step, beside the all-reduce: what wrapping a model in DistributedDataParallel costs a step
even when there is nothing to send.

    ddp(step) = per_step + buckets · per_bucket + gradient_bytes · per_byte

A step costs DDP's forward: its Python around the reducer, and the broadcast of the model's buffers (batch norm's
running statistics; ``broadcast_buffers=True`` by default). A bucket costs its launch: the all-reduce call and the
future DDP waits on, the copy kernels it starts, the reducer's bookkeeping when the bucket closes. A byte costs the
copies of the gradient into its bucket and back out (``gradient_as_bucket_view=False`` is torch's default) and,
in this fit, whatever else grows with the model: an autograd hook per gradient, the reducer's per-tensor marks.
Those grow with the tensors, not the bytes; the bytes are the size that a projection knows of every model, so they
carry them (:func:`fit_ddp_cost` says how well; a model of few large tensors is overcharged:
``docs/scaling-validation.md``, the SC22 U-Net).

Two sets of prices, each with its source (:class:`DdpCost`):

- **on a GPU** (:data:`PUBLISHED_DDP_COST`, the default of a projection): PyTorch's DDP benchmark
  (pytorch/pytorch, ``benchmarks/distributed/ddp/README.md``: PyTorch 1.4, one V100 of a DGX-1, batch 32, fp32)
  measured one GPU without DDP and with DDP on one GPU — ResNet-50 329 → 319 images/s and ResNet-101 197 → 187
  (3–5% of the step), ResNeXt-50 220 → 217, ResNeXt-101 77 → 75 — and the same models at ``bucket_cap_mb=1``
  against 25 on one GPU (0.3–1.2% slower). The price per bucket is the slope of the cost against the buckets
  within each model, the price per byte what is left over the gradient's bytes (:func:`fit_ddp_cost`);
- **on this machine** (:func:`measured_ddp_cost`): ``dlscale bench ddp-cost``, the engine's step with and without
  DDP on one rank (gloo, world size 1) at several ``bucket_cap_mb``, fitted the same way.

The projection adds ``ddp(step)`` to every step of DDP on more than one GPU (:mod:`~dlscale.scaling.projection`).
Not counted: FSDP's own bookkeeping (its layout has no term of this kind here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import RangeError, check_range
from dlscale.scaling.overlap import DDP_BUCKET_MB, DDP_FIRST_BUCKET_BYTES, bucket_schedule, published_layers


@dataclass(frozen=True)
class DdpCost:
    """DDP's own seconds per step: a price per bucket, a price per byte of the gradient and one per step, and where
    they come from."""

    per_bucket_s: float
    per_byte_s: float
    source: str = ""
    per_step_s: float = 0.0

    def __post_init__(self) -> None:
        check_range("DDP's cost per bucket (s)", self.per_bucket_s, 0)
        check_range("DDP's cost per byte (s)", self.per_byte_s, 0)
        check_range("DDP's cost per step (s)", self.per_step_s, 0)

    def seconds(self, buckets: int, gradient_bytes: float) -> float:
        """DDP's own cost of one step that sends ``buckets`` buckets holding ``gradient_bytes`` in all."""
        return self.per_step_s + buckets * self.per_bucket_s + gradient_bytes * self.per_byte_s

    def describe(self) -> str:
        """The prices as the assumptions print them."""
        return (
            (f"{self.per_step_s * 1e6:.3g} µs per step + " if self.per_step_s else "")
            + f"{self.per_bucket_s * 1e6:.3g} µs per bucket + {self.per_byte_s * 1e12:.3g} ps per byte of gradient"
            + (f" ({self.source})" if self.source else "")
        )


#: No DDP cost at all: the all-reduce alone, as the model had it before DDP's own cost was priced.
NO_DDP_COST = DdpCost(0.0, 0.0, "not counted")


@dataclass(frozen=True)
class DdpPoint:
    """One measured overhead: a model (its name), the buckets DDP sent, the gradient's bytes, and the seconds per
    step DDP added over the same step without it."""

    model: str
    buckets: int
    gradient_bytes: float
    seconds: float


def fit_ddp_cost(points: Sequence[DdpPoint], source: str = "") -> DdpCost:
    """Prices per bucket, per byte and per step from overheads measured at several bucket counts of one or more
    models.

    The price per bucket is the slope of the overhead against the buckets within each model (each model's mean
    taken out: the bytes do not change with the buckets). What each model's mean overhead leaves over its buckets is
    then fitted against its bytes: with two or more sizes of gradient, a straight line (its intercept the price per
    step, its slope the price per byte); with one, through the origin (the price per step is then in the price per
    byte). A price that the noise makes negative is held at 0 (DDP cannot make a step faster by sending more), and
    the others fitted without it.
    """
    models: dict[str, list[DdpPoint]] = {}
    for point in points:
        models.setdefault(point.model, []).append(point)
    if not models:
        raise RangeError("no DDP overhead measured: nothing to fit")
    means = {
        name: (
            sum(p.buckets for p in rows) / len(rows),
            sum(p.seconds for p in rows) / len(rows),
            rows[0].gradient_bytes,
        )
        for name, rows in models.items()
    }
    spread = sum((p.buckets - means[p.model][0]) ** 2 for p in points)
    if spread == 0:
        raise RangeError("every measurement sent as many buckets: the price per bucket needs two bucket counts")
    slope = sum((p.buckets - means[p.model][0]) * (p.seconds - means[p.model][1]) for p in points) / spread
    per_bucket = max(0.0, slope)
    leftover = [(size, seconds - per_bucket * buckets) for buckets, seconds, size in means.values()]
    per_step, per_byte = 0.0, _through_origin(leftover)
    if len({size for size, _ in leftover}) > 1:
        x = sum(size for size, _ in leftover) / len(leftover)
        y = sum(rest for _, rest in leftover) / len(leftover)
        slope = sum((size - x) * (rest - y) for size, rest in leftover) / sum((size - x) ** 2 for size, _ in leftover)
        if slope >= 0 and y - slope * x >= 0:
            per_step, per_byte = y - slope * x, slope
        elif slope < 0:  # (the bytes cost nothing measurable: the rest is per step)
            per_step, per_byte = max(0.0, y), 0.0
    return DdpCost(per_bucket, per_byte, source, per_step)


def _through_origin(points: list[tuple[float, float]]) -> float:
    """The least-squares slope through the origin, held at 0 or above."""
    return max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))


#: PyTorch's DDP benchmark (pytorch/pytorch, benchmarks/distributed/ddp/README.md): on one V100 of a DGX-1, batch
#: 32, fp32, PyTorch 1.4. Per model: images/s without DDP and with DDP on one GPU (p50 of the first table), and from
#: the README's comparison of bucket_cap_mb=1 against 25 (its "diff" table): how much slower 1 MiB ran on one GPU
#: (p75) and that run's seconds per step.
DDP_BENCHMARK_ONE_GPU = {
    "resnet50": (329.0, 319.0, 0.003, 0.101),
    "resnet101": (197.0, 187.0, 0.012, 0.172),
    "resnext50_32x4d": (220.0, 217.0, 0.010, 0.149),
    "resnext101_32x8d": (77.0, 75.0, 0.008, 0.427),
}
DDP_BENCHMARK_BATCH = 32
DDP_BENCHMARK_SOURCE = "PyTorch's DDP benchmark on one V100 (pytorch/pytorch benchmarks/distributed/ddp/README.md)"


def published_points() -> list[DdpPoint]:
    """The overheads of :data:`DDP_BENCHMARK_ONE_GPU`, each model at DDP's default buckets (25 MiB, the first of 1
    MiB) and at ``bucket_cap_mb=1``, its buckets counted from its layer table as DDP fills them."""
    points = []
    for model, (alone, wrapped, slower_at_1mib, step_at_1mib) in DDP_BENCHMARK_ONE_GPU.items():
        layers = published_layers(model)
        size = 4 * sum(layer.parameters for layer in layers)
        default = len(bucket_schedule(layers, 4, DDP_BUCKET_MB * 2**20, DDP_FIRST_BUCKET_BYTES).sizes)
        small = len(bucket_schedule(layers, 4, 2**20, None).sizes)
        overhead = DDP_BENCHMARK_BATCH / wrapped - DDP_BENCHMARK_BATCH / alone
        points.append(DdpPoint(model, default, size, overhead))
        points.append(DdpPoint(model, small, size, overhead + slower_at_1mib * step_at_1mib))
    return points


#: DDP's own cost on a GPU, fitted by :func:`fit_ddp_cost` to :func:`published_points` (34.6 µs per bucket, 32.6 ps
#: per byte; no price per step: the line through the four models' bytes meets 0 below it): 3.55 ms a step for
#: ResNet-50's 102 MB in 5 buckets, 3.6% of its 97 ms; the four models' measured 2.0-11.1 ms met within 2.7 ms.
#: Rounded; the test refits it.
PUBLISHED_DDP_COST = DdpCost(35e-6, 33e-12, "fitted to " + DDP_BENCHMARK_SOURCE)


def measured_ddp_cost(path: str | Path) -> DdpCost:
    """The prices a ``dlscale bench ddp-cost`` run wrote (its ``ddp_cost.json``), with the machine they were
    measured on; a file that holds none is a :class:`RangeError` naming it."""
    path = Path(path)
    try:
        fit = json.loads(path.read_text())["fit"]
        return DdpCost(float(fit["per_bucket_s"]), float(fit["per_byte_s"]), f"measured: {fit['source']}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise RangeError(
            f"{path} gives no DDP cost ({getattr(err, 'strerror', None) or type(err).__name__}): give the "
            "ddp_cost.json of a `dlscale bench ddp-cost` run"
        ) from None
