"""The α–β cost of the collectives data-parallel training runs (Thakur, Rabenseifner and Gropp 2005).

A message of ``n`` bytes between two ranks costs ``α + n·β``: α the latency of one message, β the
seconds per byte (one over the bandwidth). The ring algorithms split the buffer into ``p`` chunks
and pass them ``p - 1`` times around the ring, so each rank sends ``(p-1)/p·n`` bytes in a
reduce-scatter or an all-gather and twice that in an all-reduce (a reduce-scatter then an
all-gather): ``2(p-1)/p·n`` is the least any all-reduce must send per rank (Patarasuk and Yuan
2009), which makes the ring bandwidth-optimal and its latency term ``2(p-1)·α`` the price. The
binomial tree reduces and then broadcasts in ``⌈log2 p⌉`` rounds of whole messages: fewer
messages, more bytes; it wins for small messages on many ranks.

Two levels (:func:`hierarchical_allreduce`): reduce-scatter inside each node over the fast link
(NVLink, Infinity Fabric), all-reduce each GPU's ``1/g`` share between nodes over the network
(each GPU with its share of the node's NICs), all-gather inside the node again — how NCCL and
RCCL use a node's links when a job spans nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One level of the network as the α–β model sees it: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float
    beta: float
    name: str = ""

    @property
    def bandwidth(self) -> float:
        """Bytes per second (1/β)."""
        return 1 / self.beta if self.beta > 0 else math.inf

    def describe(self) -> str:
        label = f"{self.name}: " if self.name else ""
        return f"{label}α = {self.alpha * 1e6:.3g} µs, 1/β = {self.bandwidth / 1e9:.3g} GB/s"


def ring_allreduce(n_bytes: float, ranks: int, link: Link) -> float:
    """Seconds for a ring all-reduce of ``n_bytes`` over ``ranks``: ``2(p-1)·α + 2(p-1)/p·n·β``."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * link.alpha + 2 * (ranks - 1) / ranks * n_bytes * link.beta


def ring_reduce_scatter(n_bytes: float, ranks: int, link: Link) -> float:
    """Seconds for a ring reduce-scatter of ``n_bytes`` (each rank keeps ``n/p``): ``(p-1)·α + (p-1)/p·n·β``."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * link.alpha + (ranks - 1) / ranks * n_bytes * link.beta


def ring_allgather(n_bytes: float, ranks: int, link: Link) -> float:
    """Seconds for a ring all-gather into ``n_bytes`` (each rank brings ``n/p``): the same cost as the reduce-scatter."""
    return ring_reduce_scatter(n_bytes, ranks, link)


def tree_allreduce(n_bytes: float, ranks: int, link: Link) -> float:
    """Seconds for a binomial-tree reduce then broadcast: ``2⌈log2 p⌉·(α + n·β)``."""
    if ranks <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * (link.alpha + n_bytes * link.beta)


ALLREDUCE = {"ring": ring_allreduce, "tree": tree_allreduce}


def allreduce(n_bytes: float, ranks: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for an all-reduce by ``algorithm`` (``ring`` or ``tree``)."""
    return ALLREDUCE[algorithm](n_bytes, ranks, link)


def hierarchical_allreduce(n_bytes: float, gpus_per_node: int, nodes: int, inside: Link, between: Link,
                           algorithm: str = "ring") -> float:
    """Seconds for an all-reduce over ``nodes`` × ``gpus_per_node`` ranks on two levels.

    Reduce-scatter inside the node, all-reduce of each GPU's ``n/g`` share between the nodes (each
    GPU over its share of the NICs: ``between`` is per GPU), all-gather inside the node.
    """
    g = gpus_per_node
    return (ring_reduce_scatter(n_bytes, g, inside) + allreduce(n_bytes / g, nodes, between, algorithm)
            + ring_allgather(n_bytes, g, inside))


def layout_seconds(layout: str, gradient_bytes: float, gpus_per_node: int, nodes: int, inside: Link,
                   between: Link) -> float:
    """Communication seconds per step of a data-parallel layout whose gradients are ``gradient_bytes``.

    ``ddp``: one two-level all-reduce of the gradients. ``fsdp`` (ZeRO-3): two all-gathers of the
    parameters (forward, backward) and one reduce-scatter of the gradients, over every rank as one
    ring, which crosses the network wherever the job spans nodes (the slower link sets the pace).
    """
    if layout == "ddp":
        return hierarchical_allreduce(gradient_bytes, gpus_per_node, nodes, inside, between)
    if layout == "fsdp":
        ranks, link = gpus_per_node * nodes, between if nodes > 1 else inside
        return 2 * ring_allgather(gradient_bytes, ranks, link) + ring_reduce_scatter(gradient_bytes, ranks, link)
    raise ValueError(f"layout must be 'ddp' or 'fsdp', not {layout!r}")
