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
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.scaling.collectives import Link

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

    def describe(self) -> str:
        return (f"{self.name}: {self.gpus_per_node} GPUs per node; inside a node {self.inside.describe()}; "
                f"between nodes, per GPU, {self.between.describe()} (α assumed; source: {self.source})")


PERLMUTTER = Site(
    "Perlmutter", 4,
    inside=Link(ASSUMED_ALPHA_INSIDE, 1 / 100e9, "NVLink 3, 4 links × 25 GB/s per pair"),
    between=Link(ASSUMED_ALPHA_BETWEEN, 1 / 25e9, "Slingshot 11, one 25 GB/s NIC per GPU"),
    source="https://docs.nersc.gov/systems/perlmutter/architecture/")

FRONTIER = Site(
    "Frontier", 8,
    inside=Link(ASSUMED_ALPHA_INSIDE, 1 / 50e9, "Infinity Fabric, 50 GB/s on the slowest pair a ring crosses"),
    between=Link(ASSUMED_ALPHA_BETWEEN, 1 / 12.5e9, "Slingshot, one 25 GB/s NIC per 2 GCDs"),
    source="https://docs.olcf.ornl.gov/systems/frontier_user_guide.html")

SITES = {"perlmutter": PERLMUTTER, "frontier": FRONTIER}


def here(link: Link, ranks_per_node: int = 1) -> Site:
    """This machine as a site: one fitted link for both levels (the local cluster's nodes share one loopback)."""
    return Site("this machine", ranks_per_node, inside=link, between=link,
                source="fitted here from dlscale bench allreduce")
