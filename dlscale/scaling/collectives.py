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

**Which algorithm.** NCCL picks one per call from its own cost model: rings for large messages,
the double binary tree (Sanders, Speck and Träff 2009) where the ring's ``2(p-1)·α`` outgrows the
message — many nodes, small buckets — and a protocol for each: LL for small messages, LL128 for
medium, Simple for large. Two binary trees, each carrying half of the message in pipelined chunks,
give every rank a logarithmic latency, ``2⌈log2 p⌉·α``, at the ring's bandwidth term ``2·n·β`` on
paper — but NCCL's own tuning model rates its tree lower: 0.92 of the bandwidth, times a
correction by message size that halves it from 128 KiB to 2 MiB (:data:`NCCL_TREE_CORRECTION`),
and the textbook double tree here does the same (:func:`double_tree_allreduce`).

``algorithm="auto"`` on two levels (:func:`hierarchical_allreduce`) is NCCL's own choice where the
site runs NCCL (a :class:`~dlscale.scaling.nccl.NcclNode`): every (algorithm, protocol) priced by
NCCL's tuning model with its constants (:mod:`dlscale.scaling.nccl`, NCCL 2.30.7), the fastest
of those the site's NCCL release had taken, and the call priced at that; elsewhere (RCCL, gloo, a
link fitted on this machine) it is the cheapest of the textbook algorithms above, on the site's α
and β. :func:`allreduce_choice` says which.

**Buckets.** DDP does not send the gradient as one message: it all-reduces buckets of
``bucket_cap_mb`` (25 MiB by default) as the backward pass fills them, so a step pays the latency
once per bucket (:func:`buckets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlscale.scaling.nccl import TREE_BANDWIDTH, TREE_CORRECTION, NcclNode, nccl_choice


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
    """Seconds for a ring all-gather into ``n_bytes`` (each rank brings ``n/p``): the same cost as the
    reduce-scatter."""
    return ring_reduce_scatter(n_bytes, ranks, link)


def tree_allreduce(n_bytes: float, ranks: int, link: Link) -> float:
    """Seconds for a binomial-tree reduce then broadcast: ``2⌈log2 p⌉·(α + n·β)``."""
    if ranks <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * (link.alpha + n_bytes * link.beta)


#: NCCL's own correction of the tree's bandwidth for its Simple protocol (the one large buckets use), by message
#: size in powers of two from 64 B up to 512 MiB: "Trees are not perfectly sticking to the model for medium sizes"
#: (``treeCorrectionFactor`` in NCCL's src/graph/tuning.cc, the same from 2.11 to 2.30.7; index
#: ``log2(bytes / 64)``, 0 to 22). From 128 KiB to 2 MiB (indices 11 to 14) the tree moves half the bytes per second
#: its bandwidth term says.
NCCL_TREE_CORRECTION = TREE_CORRECTION["Simple"]
#: NCCL rates a tree's bus bandwidth at 0.92 of the channels' (``busBw * .92`` in the same file since NCCL 2.8;
#: 0.9 in 2.5-2.7).
NCCL_TREE_BANDWIDTH = TREE_BANDWIDTH


def tree_bandwidth_share(call_bytes: float) -> float:
    """The share of the link's bandwidth NCCL's tuning model gives its tree for one call of ``call_bytes``: 0.92
    times the correction for that size (NCCL indexes it by ``log2(bytes / 64)``; 512 MiB and above: none)."""
    index = max(0, (max(0, int(call_bytes)) >> 6).bit_length() - 1)
    correction = NCCL_TREE_CORRECTION[index] if index < len(NCCL_TREE_CORRECTION) else 1.0
    return NCCL_TREE_BANDWIDTH * correction


def double_tree_allreduce(n_bytes: float, ranks: int, link: Link, call_bytes: float | None = None) -> float:
    """Seconds for NCCL's double binary tree: ``2⌈log2 p⌉·α + 2·n·β / share`` (two pipelined trees, half the
    message each), ``share`` NCCL's own rating of the tree's bandwidth for a call of ``call_bytes`` (default
    ``n_bytes``; :func:`tree_bandwidth_share`)."""
    if ranks <= 1:
        return 0.0
    share = tree_bandwidth_share(n_bytes if call_bytes is None else call_bytes)
    return 2 * math.ceil(math.log2(ranks)) * link.alpha + 2 * n_bytes * link.beta / share


ALLREDUCE = {"ring": ring_allreduce, "tree": tree_allreduce, "double_tree": double_tree_allreduce}
#: What ``--algorithm`` accepts: one of :data:`ALLREDUCE`, or ``auto`` for the cheapest of them.
ALGORITHMS = ("auto", *ALLREDUCE)


def _price(name: str, n_bytes: float, ranks: int, link: Link, call_bytes: float | None) -> float:
    if name == "double_tree":
        return double_tree_allreduce(n_bytes, ranks, link, call_bytes)
    return ALLREDUCE[name](n_bytes, ranks, link)


def choose_allreduce(n_bytes: float, ranks: int, link: Link, call_bytes: float | None = None) -> str:
    """The modelled all-reduce algorithm that is cheapest for this message, ranks and link (ties go to the ring);
    ``call_bytes`` is the whole call's size, which NCCL's tree correction reads (default ``n_bytes``)."""
    return min(ALLREDUCE, key=lambda name: _price(name, n_bytes, ranks, link, call_bytes))


def allreduce(
    n_bytes: float, ranks: int, link: Link, algorithm: str = "ring", call_bytes: float | None = None
) -> float:
    """Seconds for an all-reduce by ``algorithm`` (``ring``, ``tree``, ``double_tree``, or ``auto``: the cheapest)."""
    if algorithm == "auto":
        algorithm = choose_allreduce(n_bytes, ranks, link, call_bytes)
    if algorithm not in ALLREDUCE:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {algorithm!r}")
    return _price(algorithm, n_bytes, ranks, link, call_bytes)


def buckets(n_bytes: float, bucket_bytes: float | None) -> list[tuple[float, int]]:
    """The messages a gradient of ``n_bytes`` goes out as, as (size, how many): full buckets of ``bucket_bytes`` and
    the rest (one message when ``bucket_bytes`` is None). Counted, not listed: a tiny bucket makes billions."""
    if not bucket_bytes or n_bytes <= bucket_bytes:
        return [(n_bytes, 1)]
    full = int(n_bytes // bucket_bytes)
    rest = n_bytes - full * bucket_bytes
    return [(bucket_bytes, full)] + ([(rest, 1)] if rest > 0 else [])


def nccl_bus_gbs(gpus_per_node: int, nodes: int, inside: Link, between: Link) -> float:
    """The bus bandwidth, GB/s, that NCCL's channels get on these links: on one node the link between its GPUs;
    across nodes the node's network (``between`` is each GPU's share of it) or, if slower, the link inside."""
    if nodes <= 1:
        return inside.bandwidth / 1e9
    network = gpus_per_node * between.bandwidth
    return (min(network, inside.bandwidth) if gpus_per_node > 1 else network) / 1e9


def hierarchical_allreduce(
    n_bytes: float,
    gpus_per_node: int,
    nodes: int,
    inside: Link,
    between: Link,
    algorithm: str = "ring",
    nccl: NcclNode | None = None,
) -> float:
    """Seconds for an all-reduce over ``nodes`` × ``gpus_per_node`` ranks on two levels.

    Reduce-scatter inside the node, all-reduce of each GPU's ``n/g`` share between the nodes (each
    GPU over its share of the NICs: ``between`` is per GPU), all-gather inside the node. With
    ``algorithm="auto"`` on a site that runs NCCL (``nccl``), the call is priced as NCCL's tuning model
    prices its own choice (:func:`~dlscale.scaling.nccl.nccl_choice`) instead.
    """
    g = gpus_per_node
    if algorithm == "auto" and nccl is not None:
        return nccl_choice(n_bytes, nodes, g, nccl_bus_gbs(g, nodes, inside, between), nccl)[2]
    return (
        ring_reduce_scatter(n_bytes, g, inside)
        + allreduce(n_bytes / g, nodes, between, algorithm, call_bytes=n_bytes)
        + ring_allgather(n_bytes, g, inside)
    )


def allreduce_choice(
    n_bytes: float,
    gpus_per_node: int,
    nodes: int,
    inside: Link,
    between: Link,
    algorithm: str = "auto",
    nccl: NcclNode | None = None,
) -> str:
    """The algorithm :func:`hierarchical_allreduce` prices a call of ``n_bytes`` with, as a projection reports it:
    NCCL's ``algorithm/protocol`` (``ring/LL128``) under ``auto`` on an NCCL site, the cheapest textbook algorithm
    between nodes under ``auto`` elsewhere, or the one asked for."""
    if algorithm != "auto":
        return algorithm
    if nccl is not None:
        g = gpus_per_node
        chosen, protocol, _ = nccl_choice(n_bytes, nodes, g, nccl_bus_gbs(g, nodes, inside, between), nccl)
        return f"{chosen}/{protocol}"
    return choose_allreduce(n_bytes / gpus_per_node, nodes, between, n_bytes) if nodes > 1 else "ring"


def two_level_reduce_scatter(n_bytes: float, gpus_per_node: int, nodes: int, inside: Link, between: Link) -> float:
    """Seconds for a reduce-scatter over every GPU of ``nodes`` nodes, on two levels: inside the node each GPU keeps
    ``n/g``, then between the nodes each GPU reduce-scatters its ``n/g`` with its peers (the same local rank on
    every node), so the network carries ``(N-1)/N·n/g`` per GPU instead of a flat ring's ``(p-1)/p·n``."""
    return ring_reduce_scatter(n_bytes, gpus_per_node, inside) + ring_reduce_scatter(
        n_bytes / gpus_per_node, nodes, between
    )


def two_level_allgather(n_bytes: float, gpus_per_node: int, nodes: int, inside: Link, between: Link) -> float:
    """Seconds for the all-gather that undoes :func:`two_level_reduce_scatter` (the same cost, the other way)."""
    return two_level_reduce_scatter(n_bytes, gpus_per_node, nodes, inside, between)


@dataclass(frozen=True)
class Communication:
    """A step's communication as the model prices it: seconds, the algorithm between nodes, the messages sent."""

    seconds: float
    algorithm: str
    messages: int


def layout_communication(
    layout: str,
    gradient_bytes: float,
    gpus_per_node: int,
    nodes: int,
    inside: Link,
    between: Link,
    algorithm: str = "auto",
    bucket_bytes: float | None = None,
    nccl: NcclNode | None = None,
) -> Communication:
    """The communication per step of a data-parallel layout whose gradients are ``gradient_bytes``.

    ``ddp``: a two-level all-reduce of each bucket. ``fsdp`` (ZeRO-3): two all-gathers of the
    parameters (forward, backward) and one reduce-scatter of the gradients, each on two levels:
    1.5 times DDP's bytes, on every link. Each bucket (``bucket_bytes``; FSDP's units play the
    same part) pays the latency once. ``algorithm`` is the all-reduce's (``auto``: NCCL's choice
    for the bucket where ``nccl`` describes the site's NCCL, else the cheapest textbook algorithm
    between nodes; reduce-scatter and all-gather are rings, as in NCCL).
    """
    if layout not in ("ddp", "fsdp"):
        raise ValueError(f"layout must be 'ddp' or 'fsdp', not {layout!r}")
    messages = buckets(gradient_bytes, bucket_bytes)
    count = sum(n for _, n in messages)
    g = gpus_per_node
    if layout == "fsdp":
        seconds = sum(
            n
            * (
                2 * two_level_allgather(m, g, nodes, inside, between)
                + two_level_reduce_scatter(m, g, nodes, inside, between)
            )
            for m, n in messages
        )
        return Communication(seconds, "ring", count)
    # (auto: each bucket's own choice, as NCCL chooses per call; the largest bucket's is reported)
    seconds = sum(n * hierarchical_allreduce(m, g, nodes, inside, between, algorithm, nccl) for m, n in messages)
    chosen = allreduce_choice(messages[0][0], g, nodes, inside, between, algorithm, nccl)
    return Communication(seconds, chosen if nodes > 1 else "ring", count)


def layout_seconds(
    layout: str,
    gradient_bytes: float,
    gpus_per_node: int,
    nodes: int,
    inside: Link,
    between: Link,
    algorithm: str = "ring",
    bucket_bytes: float | None = None,
    nccl: NcclNode | None = None,
) -> float:
    """Seconds of :func:`layout_communication` (one message and rings unless told otherwise)."""
    return layout_communication(
        layout, gradient_bytes, gpus_per_node, nodes, inside, between, algorithm, bucket_bytes, nccl
    ).seconds


#: A link whose cost in seconds is the bytes one rank sends (α = 0, β = 1 s per byte): the wire's volume, not its time.
BYTES_ONLY = Link(0.0, 1.0, "bytes sent")


def data_parallel_bytes(parameters: int, ranks: int, bytes_per_value: int = 4) -> dict[str, float]:
    """Bytes one rank sends per step under DDP and FSDP, for a model of ``parameters`` values (lesson 10's table):
    DDP's ring all-reduce sends ``2(N-1)/N`` of the gradients, FSDP's two all-gathers and one reduce-scatter
    ``3(N-1)/N``, 1.5 times DDP's."""
    n = parameters * bytes_per_value
    return {
        "DDP": ring_allreduce(n, ranks, BYTES_ONLY),
        "FSDP": layout_seconds("fsdp", n, ranks, 1, BYTES_ONLY, BYTES_ONLY),
    }


def tensor_parallel_bytes(
    batch: int, tokens: int, width: int, blocks: int, ranks: int, bytes_per_value: int = 4
) -> float:
    """Bytes one rank sends per step when each of ``blocks`` transformer blocks is split over ``ranks``: four
    all-reduces of the activations per block (the attention's and the MLP's outputs forward, their input gradients
    backward), each of ``batch × tokens × width`` values."""
    return 4 * blocks * ring_allreduce(batch * tokens * width * bytes_per_value, ranks, BYTES_ONLY)
