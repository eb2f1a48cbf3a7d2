"""How much of DDP's all-reduce the backward pass hides, estimated from the bucket schedule.

The backward pass produces the gradients last layer first. DDP packs them, in that order, into buckets of whole
tensors (the first of 1 MiB when ``bucket_cap_mb`` is left at its default, the rest of ``bucket_cap_mb``, 25 MiB
by default; every bucket of ``bucket_cap_mb`` when it is given: torch's Reducer after its first step), and
starts a bucket's all-reduce as soon as its last gradient is ready. The buckets share one link, in order: a
bucket starts when it is ready and the one before it has gone. Whatever is still being sent when the backward pass
ends is exposed; the rest was hidden (Li et al. 2020, "PyTorch Distributed", VLDB: the bucket schedule and the
overlap it gives).

    start(i) = max(ready(i), end(i-1)),   end(i) = start(i) + allreduce(bucket i),
    exposed  = max(0, end(last) - backward),   overlap = 1 - exposed / Σ allreduce(bucket i)

It is bounded by construction: the last bucket is ready only when the backward pass ends, so at least its
all-reduce is exposed, and nothing hides more than the backward pass. When a gradient is ready is the share of the
backward pass done by then: each layer's backward time is taken in proportion to its forward floating-point
operations (a layer table: :func:`published_layers`, :func:`model_layers`), or, with no table, every byte of the
gradient equally (:func:`uniform_layers`, said as an assumption wherever it is used).

What the hidden part still costs — the all-reduce slowing the backward pass it overlaps (the two share the GPU's
memory and SMs) — is priced apart (:mod:`~dlscale.scaling.slowdown`), as the projection adds it; not modelled: the
backward pass, slowed, hiding a little more, and the optimizer step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: DDP's ``bucket_cap_mb`` when it is not given, MiB.
DDP_BUCKET_MB = 25.0
#: torch's Reducer caps the first bucket of the order the gradients arrive in at 1 MiB
#: (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``) when ``bucket_cap_mb`` is left at its default: the first
#: all-reduce starts early. Given a ``bucket_cap_mb``, the first bucket has that cap too.
DDP_FIRST_BUCKET_BYTES = 2**20

_PUBLISHED = Path(__file__).with_name("published_layers.json")
#: The models with a layer table (``dlscale project --layers``).
PUBLISHED_MODELS = ("inception_v3", "resnet101", "resnet50", "vgg16")


@dataclass(frozen=True)
class Layer:
    """One module that holds parameters: how many, and its forward floating-point operations per sample."""

    parameters: int
    flops: float


@dataclass(frozen=True)
class Schedule:
    """The buckets in the order the backward pass fills them: each one's bytes and the share of the backward pass
    done when its last gradient is ready (0 to 1)."""

    sizes: tuple[float, ...]
    ready: tuple[float, ...]
    source: str  # where the layers come from


def published_layers(name: str) -> tuple[Layer, ...]:
    """The layer table of a published case's model (``resnet50``, ``resnet101``, ``inception_v3``, ``vgg16``),
    written by ``scripts/published_layers.py`` from torchvision's models, in the order they register."""
    table = json.loads(_PUBLISHED.read_text())
    if name not in table:
        raise KeyError(f"no layer table for {name!r}: one of {', '.join(sorted(table))}")
    return tuple(Layer(int(p), float(f)) for p, f in table[name])


def uniform_layers(parameters: int, pieces: int = 1000) -> tuple[Layer, ...]:
    """A gradient whose bytes the backward pass produces at an even rate: the assumption when no table is given."""
    share, rest = divmod(parameters, pieces)
    return tuple(Layer(share + (1 if i < rest else 0), 1.0) for i in range(pieces) if share or i < rest)


def model_layers(model, example) -> tuple[Layer, ...]:
    """The layer table of a torch ``model`` on ``example`` (one batch): each module holding parameters, in the order
    it registers them, with its forward operations per sample counted by torch's FlopCounterMode. Run it on the meta
    device to count without memory or kernels."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(example)
    counted = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    prefix, batch = type(model).__name__, max(1, len(example))

    def key(name: str) -> str:
        return f"{prefix}.{name}" if name else prefix

    rows = []
    for name, module in model.named_modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if own:  # (a module's count includes its children's: they are layers of their own)
            children = sum(
                counted.get(key(f"{name}.{child}" if name else child), 0) for child, _ in module.named_children()
            )
            rows.append(Layer(own, (counted.get(key(name), 0) - children) / batch))
    return tuple(rows)


def bucket_schedule(
    layers: Sequence[Layer],
    bytes_per_value: int,
    bucket_bytes: float | None,
    first_bucket_bytes: float | None = DDP_FIRST_BUCKET_BYTES,
    source: str = "",
) -> Schedule:
    """DDP's buckets for ``layers`` (in registration order): filled last layer first, a bucket closing once it holds
    ``first_bucket_bytes`` (the first) or ``bucket_bytes`` (the rest; None: one bucket), each ready when the backward
    pass has done its layers, the time of a layer in proportion to its operations (to its parameters if none are
    counted)."""
    backward = list(reversed(layers))
    weights = [layer.flops for layer in backward]
    if not sum(weights) > 0:
        weights = [float(layer.parameters) for layer in backward]
    total = sum(weights)
    sizes, ready = [], []
    filled, done = 0.0, 0.0
    for layer, weight in zip(backward, weights):
        filled += layer.parameters * bytes_per_value
        done += weight / total
        cap = first_bucket_bytes if not sizes and first_bucket_bytes and bucket_bytes else bucket_bytes
        if cap and filled >= cap:
            sizes.append(filled)
            ready.append(min(done, 1.0))
            filled = 0.0
    if filled > 0:
        sizes.append(filled)
        ready.append(1.0)
    ready[-1] = 1.0  # (the last bucket holds the first layer: ready when the backward pass ends)
    return Schedule(tuple(sizes), tuple(ready), source)


@dataclass(frozen=True)
class Overlap:
    """What the schedule gives one step: the communication, the part still running after the backward pass."""

    communication: float  # seconds, every bucket's all-reduce
    exposed: float  # seconds after the backward pass ends
    buckets: int

    @property
    def hidden(self) -> float:
        """Seconds of communication hidden behind the backward pass (never below 0: rounding of a sum that hides
        nothing once gave -1e-16, printed as -0%)."""
        return max(0.0, self.communication - self.exposed)

    @property
    def share(self) -> float:
        """The overlap: the share of the communication hidden (0 when there is none)."""
        return self.hidden / self.communication if self.communication > 0 else 0.0


def scheduled_overlap(schedule: Schedule, backward_seconds: float, allreduce: Callable[[float], float]) -> Overlap:
    """The buckets of ``schedule`` sent one after another on one link as the backward pass (``backward_seconds``)
    makes them ready, each taking ``allreduce(bytes)`` seconds."""
    end = 0.0
    total = 0.0
    for size, ready in zip(schedule.sizes, schedule.ready):
        cost = allreduce(size)
        end = max(ready * backward_seconds, end) + cost
        total += cost
    return Overlap(total, max(0.0, end - backward_seconds), len(schedule.sizes))
