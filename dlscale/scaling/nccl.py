"""NCCL's own choice of all-reduce algorithm and protocol, by its tuning model.

NCCL does not run one all-reduce: for every call it prices each algorithm (ring, tree) with each protocol (LL,
LL128, Simple) and runs the fastest. Its price is a latency plus the bytes over a bandwidth,

    time = latency(algorithm, protocol) + bytes / bandwidth(algorithm, protocol),

both set once per communicator from the machine's topology. This module is that model, read from
NVIDIA/nccl at tag ``v2.30.7-1`` (``src/graph/tuning.cc``: ``ncclTunerConstantsDefaults``, ``ncclTopoTuneModel``,
``treeCorrectionFactor``, ``ncclTopoGetAlgoTime``; the choice in ``src/enqueue.cc``, ``topoGetAlgoInfo``):

- **Latency**, µs: a base per algorithm and protocol (ring 6.6/14/8.4, tree 6.8/14/8.4 for LL/LL128/Simple) plus
  a hardware latency per step, by link (NVLink, PCIe, network). A ring all-reduce over ``p`` ranks on ``N`` nodes
  takes ``2(p-1)`` steps, ``2(N-1)`` of them between nodes; each step inside a node costs at least the network's
  post overhead when the ring spans nodes (1 µs on Intel CPUs, 2 on AMD; three times that with Simple). A tree
  takes ``2((p/N - 1)·intra + log2(N)·net)``. With one GPU per node every step between nodes pays the tree's
  network latency. A multi-node ring with Simple is slower to fill than its steps say (the "plateau effect"): its
  latency is multiplied by 1.4, 1.9 before Ampere, once each rank's share of a channel is 64 bytes or more.
- **Bandwidth**, GB/s: the channels' bus bandwidth, then a factor per protocol — LL sends 8 bytes of data in 16
  (half, capped by ``llMaxBws``), LL128 120 bytes in 128 (0.92 on a ring, 120/128 on a tree between nodes, 7/9 on
  one node, capped per channel) — and for the tree 0.92 of it (``busBw * .92``: 0.9 in NCCL 2.5-2.7, 0.92 since
  2.8) capped per channel, LL's a further 1/3.8. The ring's bus bandwidth becomes the rate of the whole buffer by
  ``p / 2(p-1)``, the tree's by one half. The tree's rate is corrected again by message size,
  ``treeCorrectionFactor[protocol][log2(bytes/64)]`` for 64 B to 512 MiB ("trees are not perfectly sticking to
  the model for medium sizes").
- **Which protocols**: LL and Simple always; LL128 from Volta on, with NVLink between the node's GPUs, and between
  nodes only where each GPU reaches its NIC through a PCIe switch (Hopper and later: also through a peer GPU).

The choice is the fastest (ties to the tree, then to LL before LL128 before Simple: NCCL's loop order).

**Which release** (:attr:`NcclNode.version`): a run of an older NCCL could not choose what its release did not have,
so the choice is made among what that release had (:data:`INTRODUCED`), each priced by the constants above. NCCL 2.0
had the ring and Simple only; LL came in 2.1 (the user guide's ``NCCL_LL_THRESHOLD``, "since 2.1"), the tree in 2.4
(tag ``v2.4.2-1``: "Add tree algorithms for allreduce"), LL128 in 2.5 (tag ``v2.5.6-1``: "Add LL128 Protocol", with
the model-based tuning this module reads). Before 2.5 NCCL chose by size thresholds, not by this model
(``NCCL_LL_THRESHOLD``, ``NCCL_TREE_THRESHOLD``); the model's choice among the same algorithms stands in for them.

What NCCL reads that the model takes as given (:class:`NcclNode`): the GPUs' generation, the CPU's vendor, NVLink
or PCIe inside the node, the channels its topology search found, and whether LL128 may cross the network. The bus
bandwidth is the site's: on one node the link between its GPUs, across nodes the node's network (every GPU's share
of the NICs) or that link if it is slower. Not modelled: NVLink SHARP (NVLS, NVLS-tree) on NVSwitch nodes of
Hopper and later, CollNet (in-network reduction), PAT (reduce-scatter and all-gather with one GPU per node), the
topology search itself (its quantized speeds, the tree's own channels: taken as the ring's) and a tuner plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The NCCL release the constants come from (NVIDIA/nccl, tag v2.30.7-1, src/graph/tuning.cc).
NCCL_VERSION = "2.30.7"
#: NCCL's protocols, in its order.
PROTOCOLS = ("LL", "LL128", "Simple")
#: NCCL's two all-reduce algorithms the model prices, in its order (the tree first: it wins ties).
NCCL_ALGORITHMS = ("tree", "ring")
#: The first NCCL release (major, minor) of each algorithm and protocol that NCCL 2.0 did not have (the ring and
#: Simple it did): LL from 2.1 (``NCCL_LL_THRESHOLD``, "since 2.1", NCCL's user guide), the tree from 2.4 (tag
#: v2.4.2-1), LL128 from 2.5 (tag v2.5.6-1).
INTRODUCED = {"LL": (2, 1), "tree": (2, 4), "LL128": (2, 5)}
#: GPU generations as NCCL indexes its tables (compute capability below 8, 8, 9, 10 and above).
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")

#: ``baseLatencies``, µs, per algorithm, for LL, LL128, Simple.
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
#: ``hwLatencies``, µs per step, per link and algorithm, for LL, LL128, Simple.
HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
#: ``llMaxBws``, GB/s: on one node by GPU generation (rows of :data:`GENERATIONS`), between nodes by CPU (row 0
#: Intel, row 1 AMD); columns: 1 node, 2 nodes, more.
LL_MAX_GBS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (2 * 141.0, 2 * 45.0, 2 * 35.0))
#: ``perChMaxRingLL128Bws``, ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws``: GB/s per channel, by GPU generation;
#: columns: 1 node, 2 nodes, more.
RING_LL128_PER_CHANNEL_GBS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
TREE_LL128_PER_CHANNEL_GBS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
TREE_PER_CHANNEL_GBS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
#: The tree's share of the bus bandwidth (``busBw * .92``; NCCL 2.5-2.7 had 0.9).
TREE_BANDWIDTH = 0.92
#: ``treeCorrectionFactor``: the tree's bandwidth by message size, index ``log2(bytes / 64)`` for 0 to 22 (64 B up
#: to 512 MiB; none from 512 MiB), per protocol.
TREE_CORRECTION = {
    "LL": (
        *(1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5),
        *(0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0),
    ),
    "LL128": (
        *(1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6),
        *(0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0),
    ),
    "Simple": (
        *(0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5),
        *(0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9),
    ),
}
#: ``getNetOverhead``, µs: the least a ring's step inside a node costs when the ring spans nodes (three times it
#: with Simple).
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}
#: The most channels a communicator has (``MAXCHANNELS``).
MAX_CHANNELS = 64


@dataclass(frozen=True)
class NcclNode:
    """What NCCL's tuning model reads of a node besides its bandwidth.

    ``compute_capability``: the GPUs' (6.0 P100, 7.0 V100, 8.0 A100, 9.0 H100, 10.0 B200); ``cpu``: ``intel``,
    ``amd`` or ``other``; ``nvlink``: the node's GPUs joined by NVLink (else PCIe); ``channels``: the rings (and
    trees) NCCL's topology search finds, before it doubles them (None: one per GPU, one per NIC on a node with a
    NIC per GPU); ``nic_near_gpu``: each GPU reaches its NIC through a PCIe switch (before Hopper) or a peer GPU
    (Hopper on), which LL128 needs between nodes; ``version``: the NCCL release the node runs, which limits the choice
    to the algorithms and protocols it had (:data:`INTRODUCED`; by default today's, every one).
    """

    compute_capability: float = 8.0
    cpu: str = "intel"
    nvlink: bool = True
    channels: int | None = None
    nic_near_gpu: bool = True
    version: str = NCCL_VERSION

    def __post_init__(self) -> None:
        if self.cpu not in NET_OVERHEAD_US:
            raise ValueError(f"cpu must be one of {', '.join(NET_OVERHEAD_US)}, not {self.cpu!r}")
        if self.channels is not None and not 1 <= self.channels <= MAX_CHANNELS:
            raise ValueError(f"channels must be 1 to {MAX_CHANNELS}, not {self.channels}")
        if release(self.version) < (2, 0):
            raise ValueError(f"version must be an NCCL 2 release (2.0 or later), not {self.version!r}")

    def has(self, name: str) -> bool:
        """Whether this node's NCCL release had the algorithm or protocol ``name`` (the ring and Simple: always)."""
        return release(self.version) >= INTRODUCED.get(name, (2, 0))

    @property
    def generation(self) -> int:
        """The row of NCCL's tables (``compCapIndex``)."""
        cc = self.compute_capability
        return 3 if cc >= 10 else 2 if cc >= 9 else 1 if cc >= 8 else 0

    def describe(self) -> str:
        """The node as NCCL's tuning model reads it, in words."""
        gpu = GENERATIONS[self.generation] if self.compute_capability >= 7 else "pre-Volta"
        return (
            f"{gpu} GPUs (compute capability {self.compute_capability:g}), "
            f"{self.cpu} CPU, {'NVLink' if self.nvlink else 'PCIe'} inside the node, "
            f"{self.channels or 'one per GPU'} channels, LL128 between nodes "
            f"{'allowed' if self.nic_near_gpu or self.compute_capability < 7 else 'off (NICs far from the GPUs)'}"
            + ("" if all(map(self.has, INTRODUCED)) else f", only what NCCL {self.version} had")
        )


def release(version: str) -> tuple[int, int]:
    """An NCCL version's (major, minor): ``"2.0.5"`` -> (2, 0)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        raise ValueError(f"version must be like 2.4 or 2.30.7, not {version!r}") from None
    return major, minor


def _log2i(n: int) -> int:
    """NCCL's ``log2i``: floor(log2(n)), -1 for 0."""
    return n.bit_length() - 1


def nccl_tables(nodes: int, gpus_per_node: int, bus_gbs: float, node: NcclNode) -> dict[tuple[str, str], tuple]:
    """NCCL's latency (µs) and bandwidth (GB/s, of the whole buffer) of each enabled (algorithm, protocol) for an
    all-reduce over ``nodes`` × ``gpus_per_node`` ranks whose channels give ``bus_gbs`` of bus bandwidth: what
    ``ncclTopoTuneModel`` sets for the communicator (``comm->latencies``, ``comm->bandwidths``), for those the node's
    NCCL release had."""
    ranks = nodes * gpus_per_node
    gen = node.generation
    column = min(nodes, 3) - 1
    channels = node.channels or gpus_per_node
    ll_max = LL_MAX_GBS[gen if nodes == 1 else (1 if node.cpu == "amd" else 0)][column]
    steps = 2 * (ranks - 1)
    inter_steps = 0 if nodes == 1 else 2 * (nodes - 1)
    ll128 = (
        node.compute_capability >= 7
        and (node.nvlink or gpus_per_node == 1)
        and (nodes == 1 or node.nic_near_gpu or node.compute_capability >= 9)
    )
    intra_link = "nvlink" if node.nvlink else "pci"
    tables = {}
    for algorithm in NCCL_ALGORITHMS:
        for p, protocol in enumerate(PROTOCOLS):
            if (protocol == "LL128" and not ll128) or not (node.has(algorithm) and node.has(protocol)):
                continue
            bus = bus_gbs
            if algorithm == "ring" and protocol == "LL":
                bus = min(ll_max, bus * 0.5)
            if algorithm == "ring" and protocol == "LL128":
                bus = min(bus * 0.92, channels * RING_LL128_PER_CHANNEL_GBS[gen][column])
            if algorithm == "tree":
                bus = min(bus * TREE_BANDWIDTH, channels * TREE_PER_CHANNEL_GBS[gen][column])
                if protocol == "LL":
                    bus = min(bus / 3.8, ll_max)
                if protocol == "LL128":
                    share = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
                    bus = min(bus * share, channels * TREE_LL128_PER_CHANNEL_GBS[gen][column])
            rate = bus * ranks / steps if algorithm == "ring" else bus * 0.5
            latency = BASE_LATENCY_US[algorithm][p]
            intra = HW_LATENCY_US[intra_link][algorithm][p]
            inter = HW_LATENCY_US["net"]["tree" if gpus_per_node == 1 else algorithm][p]
            if algorithm == "ring":
                overhead = 0.0 if nodes == 1 else NET_OVERHEAD_US[node.cpu] * (3 if protocol == "Simple" else 1)
                latency += (steps - inter_steps) * max(intra, overhead) + inter_steps * inter
            else:
                latency += 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * inter)
            tables[algorithm, protocol] = (latency, rate)
    return tables


def _communicator_channels(nodes: int, bus_gbs: float, node: NcclNode, gpus_per_node: int) -> int:
    """``comm->nChannels``: the search's channels doubled when the rings connect, doubled again across nodes of
    Hopper and later when a channel carries more than 45 GB/s."""
    channels = node.channels or gpus_per_node
    doubled = min(MAX_CHANNELS, 2 * channels)
    if node.compute_capability >= 9 and nodes > 1 and bus_gbs / channels > 45 and doubled < 16:
        doubled *= 2
    return doubled


def nccl_allreduce_times(
    n_bytes: float, nodes: int, gpus_per_node: int, bus_gbs: float, node: NcclNode
) -> dict[tuple[str, str], float]:
    """Seconds NCCL's tuning model gives an all-reduce of ``n_bytes`` (each rank's buffer) for each enabled
    (algorithm, protocol) (``ncclTopoGetAlgoTime``, one call)."""
    ranks = nodes * gpus_per_node
    if ranks <= 1:
        return {("ring", "Simple"): 0.0}
    size = max(0, int(n_bytes))
    index = _log2i(size >> 6)
    channels = _communicator_channels(nodes, bus_gbs, node, gpus_per_node)
    times = {}
    for (algorithm, protocol), (latency, rate) in nccl_tables(nodes, gpus_per_node, bus_gbs, node).items():
        if algorithm == "tree" and 0 <= index < len(TREE_CORRECTION[protocol]):
            rate *= TREE_CORRECTION[protocol][index]
        if algorithm == "ring" and protocol == "Simple" and nodes > 1 and size // (channels * ranks) >= 64:
            latency *= 1.9 if node.compute_capability < 8 else 1.4  # (the plateau effect of the ring)
        times[algorithm, protocol] = (latency + size / (1000 * rate)) * 1e-6
    return times


def nccl_choice(
    n_bytes: float, nodes: int, gpus_per_node: int, bus_gbs: float, node: NcclNode
) -> tuple[str, str, float]:
    """NCCL's (algorithm, protocol) for an all-reduce of ``n_bytes``, and its time in seconds: the fastest of
    :func:`nccl_allreduce_times`, ties to the first in NCCL's order."""
    times = nccl_allreduce_times(n_bytes, nodes, gpus_per_node, bus_gbs, node)
    (algorithm, protocol), seconds = min(times.items(), key=lambda item: item[1])  # (min keeps the first of ties)
    return algorithm, protocol, seconds
