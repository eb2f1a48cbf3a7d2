"""Published link figures of two sites' GPU nodes, the α–β model's input for a projection.

Bandwidths are the vendors' and centres' published peaks, per direction; α (the latency of one
message, a few microseconds for NCCL over NVLink or Slingshot) is not published per link and is
an assumption, stated as one wherever a projection prints its assumptions. A ring between nodes
gives each GPU its share of the node's NICs.

Perlmutter (NERSC), GPU nodes: 4 NVIDIA A100; each pair of GPUs joined by 4 third-generation NVLink
links of 25 GB/s per direction (100 GB/s per direction per pair); 4 HPE Slingshot 11 NICs of
25 GB/s (200 Gb/s) per direction, one per GPU.
Source: https://docs.nersc.gov/systems/perlmutter/architecture/

Frontier (OLCF): 4 AMD MI250X = 8 GCDs; the 2 GCDs of one MI250X joined by Infinity Fabric at
200 GB/s, GCDs of different MI250X at 50–100 GB/s (a ring through all 8 crosses a 50 GB/s pair);
4 Slingshot NICs of 25 GB/s per node, one per MI250X, so two GCDs share one.
Source: https://docs.olcf.ornl.gov/systems/frontier_user_guide.html (System Overview, Node Types)

Any other cluster is a :func:`machine`: GPUs per node and the two links, given on the command line
(``dlscale project --gpus-per-node 4 --inside-gbs 300 --between-gbs 25``) or in a YAML file
(:func:`load_machine`, ``dlscale project --machine my-cluster.yaml``)::

    name: My cluster
    gpus_per_node: 4
    inside: {bandwidth_gbs: 300, latency_us: 5}        # GB/s per direction between GPUs of a node
    between: {bandwidth_gbs: 25, latency_us: 10}       # each GPU's share of the node's NICs
    source: https://my-centre.example/docs/system      # where the figures come from
    nccl: {compute_capability: 8.0, cpu: amd, nvlink: true, channels: 4, nic_near_gpu: true, version: "2.30.7"}

``nccl`` is what NCCL's tuning model reads of the node (:class:`~dlscale.scaling.nccl.NcclNode`; any key left out
takes its default, the whole key left out: an A100-class node of NVIDIA GPUs running today's NCCL; ``version``, a
release, limits NCCL's choice to what it had), or ``false`` for a machine that
does not run NCCL (the cheapest textbook algorithm is then taken). The α's above are used by the textbook
algorithms only: NCCL's choice is priced with NCCL's own latencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import DlscaleError, RangeError, check_range
from dlscale.scaling.collectives import Link
from dlscale.scaling.nccl import NcclNode

#: Assumed, not published: the latency of one message inside a node and between nodes.
ASSUMED_ALPHA_INSIDE = 5e-6
ASSUMED_ALPHA_BETWEEN = 10e-6


@dataclass(frozen=True)
class Site:
    """A site's GPU node as the model sees it: GPUs per node, the link inside it, each GPU's share between nodes."""

    name: str
    gpus_per_node: int
    inside: Link
    between: Link
    source: str
    nccl: NcclNode | None = None  # what NCCL's tuning model reads of the node; None: not an NCCL machine

    def describe(self) -> str:
        return (
            f"{self.name}: {self.gpus_per_node} GPUs per node; inside a node {self.inside.describe()}; "
            f"between nodes, per GPU, {self.between.describe()} (α assumed; source: {self.source})"
            + (f"; NCCL's tuning model reads {self.nccl.describe()}" if self.nccl else "")
        )


PERLMUTTER = Site(
    "Perlmutter",
    4,
    inside=Link(ASSUMED_ALPHA_INSIDE, 1 / 100e9, "NVLink 3, 4 links × 25 GB/s per pair"),
    between=Link(ASSUMED_ALPHA_BETWEEN, 1 / 25e9, "Slingshot 11, one 25 GB/s NIC per GPU"),
    source="https://docs.nersc.gov/systems/perlmutter/architecture/",
    # A100 (8.0), AMD EPYC 7763, NVLink 3; one channel per NIC; LL128 over the network assumed allowed (the
    # GPU-NIC path is not published)
    nccl=NcclNode(compute_capability=8.0, cpu="amd", nvlink=True, channels=4, nic_near_gpu=True),
)

FRONTIER = Site(
    "Frontier",
    8,
    inside=Link(ASSUMED_ALPHA_INSIDE, 1 / 50e9, "Infinity Fabric, 50 GB/s on the slowest pair a ring crosses"),
    between=Link(ASSUMED_ALPHA_BETWEEN, 1 / 12.5e9, "Slingshot, one 25 GB/s NIC per 2 GCDs"),
    source="https://docs.olcf.ornl.gov/systems/frontier_user_guide.html",
    nccl=None,  # RCCL: its own tuning tables for the MI250X, not modelled (the cheapest textbook algorithm)
)

SITES = {"perlmutter": PERLMUTTER, "frontier": FRONTIER}


def site_from_link(link: Link, ranks_per_node: int = 1) -> Site:
    """This machine as a site: one fitted link for both levels (the local cluster's nodes share one loopback)."""
    return Site(
        "this machine", ranks_per_node, inside=link, between=link, source="fitted here from dlscale bench allreduce"
    )


class MachineError(DlscaleError, ValueError):
    """A machine description that cannot be used; the message names the file and key and what to write."""


def machine(
    name: str,
    gpus_per_node: int,
    inside_gbs: float,
    between_gbs: float,
    inside_latency_us: float = ASSUMED_ALPHA_INSIDE * 1e6,
    between_latency_us: float = ASSUMED_ALPHA_BETWEEN * 1e6,
    source: str = "entered",
    nccl: NcclNode | None = NcclNode(),
) -> Site:
    """A cluster of one's own: GPUs per node, the bandwidth (GB/s per direction) and latency (µs) inside a node, and
    each GPU's share of the network between nodes. Every figure is range-checked. ``nccl``: what NCCL's tuning
    model reads of the node (by default an A100-class node: :class:`~dlscale.scaling.nccl.NcclNode`), None for a
    machine that does not run NCCL."""
    check_range("GPUs per node", gpus_per_node, 1)
    for label, value in (
        ("bandwidth inside a node (GB/s)", inside_gbs),
        ("bandwidth between nodes (GB/s)", between_gbs),
    ):
        check_range(label, value, 0, above=True)
    for label, value in (
        ("latency inside a node (µs)", inside_latency_us),
        ("latency between nodes (µs)", between_latency_us),
    ):
        check_range(label, value, 0)
    return Site(
        name,
        int(gpus_per_node),
        inside=Link(inside_latency_us * 1e-6, 1 / (inside_gbs * 1e9), f"{inside_gbs:g} GB/s"),
        between=Link(between_latency_us * 1e-6, 1 / (between_gbs * 1e9), f"{between_gbs:g} GB/s per GPU"),
        source=source,
        nccl=nccl,
    )


def load_machine(path: str | Path) -> Site:
    """The :func:`machine` a YAML file describes (the keys in this module's docstring)."""
    import yaml

    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise MachineError(
            f"{path} cannot be read ({getattr(err, 'strerror', None) or type(err).__name__}): give a "
            f"YAML file with gpus_per_node, inside and between"
        ) from None
    if not isinstance(spec, dict):
        raise MachineError(f"{path} is not a mapping: write gpus_per_node, inside and between as keys")
    unknown = set(spec) - {"name", "gpus_per_node", "inside", "between", "source", "nccl"}
    if unknown:
        raise MachineError(
            f"{path}: unknown key {sorted(unknown)[0]!r}; the keys are name, gpus_per_node, inside, between, source "
            f"and nccl"
        )

    def link(key: str) -> tuple[float, float | None]:
        value = spec.get(key)
        if not isinstance(value, dict) or not isinstance(value.get("bandwidth_gbs"), (int, float)):
            raise MachineError(
                f"{path}: {key} needs bandwidth_gbs (GB/s per direction), and may have latency_us, "
                f"e.g. {key}: {{bandwidth_gbs: 25, latency_us: 10}}"
            )
        extra = set(value) - {"bandwidth_gbs", "latency_us"}
        if extra:
            raise MachineError(f"{path}: unknown key {key}.{sorted(extra)[0]}; a link has bandwidth_gbs and latency_us")
        return value["bandwidth_gbs"], value.get("latency_us")

    (inside_gbs, inside_us), (between_gbs, between_us) = link("inside"), link("between")
    gpus = spec.get("gpus_per_node")
    if not isinstance(gpus, int) or isinstance(gpus, bool):
        raise MachineError(f"{path}: gpus_per_node must be a whole number, not {gpus!r}")
    nccl = _nccl_node(path, spec.get("nccl", {}))
    try:
        return machine(
            str(spec.get("name") or path.stem),
            gpus,
            inside_gbs,
            between_gbs,
            ASSUMED_ALPHA_INSIDE * 1e6 if inside_us is None else inside_us,
            ASSUMED_ALPHA_BETWEEN * 1e6 if between_us is None else between_us,
            str(spec.get("source") or path),
            nccl,
        )
    except RangeError as err:
        raise MachineError(f"{path}: {err}") from None


_NCCL_KEYS = {
    "compute_capability": (int, float),
    "cpu": str,
    "nvlink": bool,
    "channels": int,
    "nic_near_gpu": bool,
    "version": str,
}


def _nccl_node(path: Path, value) -> NcclNode | None:
    """The ``nccl`` key of a machine file: a mapping of :class:`NcclNode`'s fields (the rest default), or false."""
    if value is False:
        return None
    if not isinstance(value, dict):
        raise MachineError(f"{path}: nccl must be a mapping of {', '.join(_NCCL_KEYS)}, or false, not {value!r}")
    for key, given in value.items():
        if key not in _NCCL_KEYS:
            raise MachineError(f"{path}: unknown key nccl.{key}; nccl has {', '.join(_NCCL_KEYS)}")
        kind = _NCCL_KEYS[key]
        if key == "version" and not isinstance(given, str):  # (YAML reads 2.30 as the number 2.3)
            raise MachineError(f'{path}: nccl.version must be quoted, as "2.30.7" (the release), not {given!r}')
        if not isinstance(given, kind) or (isinstance(given, bool) and kind is not bool):
            raise MachineError(f"{path}: nccl.{key} cannot be {given!r}")
    try:
        return NcclNode(**value)
    except ValueError as err:
        raise MachineError(f"{path}: nccl: {err}") from None
