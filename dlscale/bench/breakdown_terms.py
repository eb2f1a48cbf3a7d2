"""The breakdown's exposed communication, split into the terms of the scaling model (lesson 11).

``dlscale bench breakdown`` measures the communication a DDP step pays at each size as one difference, the step
with its data in memory less the same step with every rank alone (:mod:`dlscale.bench.breakdown`). The scaling
model (:mod:`dlscale.scaling.projection`) says what that difference holds:

    measured = ddp + exposed + slowdown · hidden,    exposed + hidden = allreduce,

DDP's own cost (:mod:`~dlscale.scaling.ddp_cost`: ``dlscale bench ddp-cost``'s prices, or the published ones), the
all-reduce left exposed after the backward pass, and the backward pass slowed by the part it hid
(:mod:`~dlscale.scaling.slowdown`: ``dlscale bench overlap``'s factor, or the published one), with ``allreduce``
the whole all-reduce per step priced on a link (α and β fitted by ``dlscale bench allreduce``). Given the three
prices, the measured difference gives the exposed part,

    exposed = (measured − ddp − slowdown · allreduce) / (1 − slowdown),   held between 0 and the whole all-reduce,

and the three terms are reported as shares of the full step, as the breakdown's parts are. They add up to the
measured part: the exposed all-reduce is what the other two leave (so a price that is off shows there, and a
negative one says the prices claim more than was measured).
"""

from __future__ import annotations

from typing import Any

from dlscale.bench.breakdown import ALONE, FULL, MEMORY
from dlscale.scaling.collectives import Link, buckets, layout_communication
from dlscale.scaling.ddp_cost import PUBLISHED_DDP_COST, DdpCost
from dlscale.scaling.slowdown import OVERLAP_SLOWDOWN

#: The terms, in the order the table prints them.
TERMS = ("ddp", "slowdown", "allreduce")


def split_communication(
    measured_s: float,
    full_s: float,
    allreduce_s: float,
    gradient_bytes: float,
    bucket_count: int,
    ddp_cost: DdpCost = PUBLISHED_DDP_COST,
    slowdown: float = OVERLAP_SLOWDOWN,
) -> dict[str, float]:
    """One size's measured communication (``measured_s`` seconds per step, of a ``full_s`` step) as DDP's own cost,
    the overlap's slow-down and the exposed all-reduce, each a share of ``full_s``; ``allreduce_s`` is the whole
    all-reduce per step, ``bucket_count`` the buckets it goes out in."""
    ddp = ddp_cost.seconds(bucket_count, gradient_bytes)
    exposed = (measured_s - ddp - slowdown * allreduce_s) / (1 - slowdown) if slowdown < 1 else allreduce_s
    hidden = allreduce_s - min(allreduce_s, max(0.0, exposed))
    slowed = slowdown * hidden
    return {
        "ddp": ddp / full_s,
        "slowdown": slowed / full_s,
        "allreduce": (measured_s - ddp - slowed) / full_s,
        "hidden_ms": 1000 * hidden,
        "allreduce_ms": 1000 * allreduce_s,
    }


def add_communication_terms(
    result: dict[str, Any],
    link: Link,
    ddp_cost: DdpCost = PUBLISHED_DDP_COST,
    slowdown: float = OVERLAP_SLOWDOWN,
    bucket_mb: float = 25.0,
    sources: tuple[str, str] = ("published", "published"),
) -> dict[str, Any]:
    """Split each DDP row's exposed communication of a breakdown (``bench_breakdown``'s result) into its terms, the
    whole all-reduce priced on ``link`` (every rank on it, in buckets of ``bucket_mb``); returns ``result`` with a
    ``terms`` dict on each row that has communication, and what the prices rest on."""
    for row in result["rows"]:
        if ALONE not in row["ms"] or result.get("layout") != "DDP":
            continue
        gradient = float(row["gradient_bytes"])
        nodes = int(row.get("nodes", 1))
        per_node = max(1, int(row["ranks"]) // nodes)
        whole = layout_communication("ddp", gradient, per_node, nodes, link, link, "auto", bucket_mb * 2**20)
        measured, full = (row["ms"][MEMORY] - row["ms"][ALONE]) / 1000, row["ms"][FULL] / 1000
        count = sum(n for _, n in buckets(gradient, bucket_mb * 2**20))
        row["terms"] = {
            "measured": measured / full,
            **split_communication(measured, full, whole.seconds, gradient, count, ddp_cost, slowdown),
        }
    result["terms_from"] = {
        "ddp_cost": f"{ddp_cost.describe()} [{sources[0]}]",
        "slowdown": f"{slowdown:.3g} s per second hidden [{sources[1]}]",
        "allreduce": f"the α-β model on {link.describe()}, buckets of {bucket_mb:g} MiB",
    }
    return result
