"""α and β fitted from ``dlscale bench allreduce``'s rows, and how well the fit predicts what it did not see.

The fit is a least-squares one of ``t = a·α + b·β`` over the measured rows, where ``a`` and ``b``
are the algorithm's counts of messages and bytes per rank (for a ring all-reduce ``2(p-1)`` and
``2(p-1)/p·n``). Each row is weighted by one over its time, so a 4 KiB message counts as much as
a 64 MiB one: the fit minimises the relative error, and α (set by the small messages) is not
lost under β (set by the large ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dlscale.errors import DlscaleError
from dlscale.scaling.collectives import Link, allreduce


def _terms(n_bytes: float, ranks: int, algorithm: str) -> tuple[float, float]:
    """(messages, bytes) on the critical path of one all-reduce, the coefficients of α and β."""
    if algorithm == "ring":
        return 2 * (ranks - 1), 2 * (ranks - 1) / ranks * n_bytes
    rounds = 2 * math.ceil(math.log2(ranks))
    return rounds, rounds * n_bytes


class LinkFitError(DlscaleError, ValueError):
    """All-reduce times that cannot give α and β; the message names the file or what is missing."""


def read_allreduce(path: str | Path) -> list[dict]:
    """The rows of a ``dlscale bench allreduce`` result (``allreduce.json``), checked: each has a message size
    (bytes) above 0, a time (ms) above 0 and a whole number of ranks, and at least two sizes were timed on
    two or more ranks (what a fit of α and β needs)."""
    path = Path(path)
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LinkFitError(
            f"{path} cannot be read ({getattr(err, 'strerror', None) or err}): give the allreduce.json "
            f"that `dlscale bench allreduce` wrote"
        ) from None

    def good(row: object) -> bool:
        return (
            isinstance(row, dict)
            and all(
                isinstance(row.get(k), (int, float))
                and not isinstance(row.get(k), bool)
                and math.isfinite(row[k])
                and row[k] > 0
                for k in ("bytes", "ms")
            )
            and isinstance(row.get("world_size"), int)
            and row["world_size"] >= 1
        )

    if not isinstance(rows, list) or not all(good(row) for row in rows):
        raise LinkFitError(
            f"{path} is not an all-reduce result: every row needs bytes and ms above 0 and a whole "
            f"world_size (rerun `dlscale bench allreduce`)"
        )
    if len({r["bytes"] for r in rows if r["world_size"] > 1}) < 2:
        raise LinkFitError(
            f"{path} has fewer than two message sizes timed on two or more ranks: fitting α and β "
            f"needs at least two (rerun `dlscale bench allreduce` with its default sizes)"
        )
    return rows


def fit_link(rows: Iterable[dict], algorithm: str = "ring", name: str = "fitted") -> Link:
    """The :class:`Link` whose α and β best predict ``rows`` (``bytes``, ``ms``, ``world_size`` each).

    Neither is allowed below zero: a negative α (which a noisy fit of large messages alone can
    give) is set to zero and β fitted alone.
    """
    rows = [r for r in rows if r["world_size"] > 1]
    if len({r["bytes"] for r in rows}) < 2:
        raise LinkFitError("fitting α and β needs all-reduce times of at least two message sizes")
    seconds = np.array([r["ms"] / 1000 for r in rows])
    terms = np.array([_terms(r["bytes"], r["world_size"], algorithm) for r in rows]) / seconds[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(terms, np.ones(len(rows)), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.linalg.lstsq(terms[:, 1:], np.ones(len(rows)), rcond=None)[0][0])
    return Link(alpha=float(alpha), beta=max(float(beta), 1e-15), name=name)


def predict_allreduce(link: Link, rows: Iterable[dict], algorithm: str = "ring") -> list[dict]:
    """Each measured row beside the model's time: bytes, ranks, measured and predicted ms, and their ratio."""
    out = []
    for r in rows:
        predicted = 1000 * allreduce(r["bytes"], r["world_size"], link, algorithm)
        out.append(
            {
                "bytes": r["bytes"],
                "ranks": r["world_size"],
                "measured_ms": r["ms"],
                "predicted_ms": predicted,
                "ratio": predicted / r["ms"],
            }
        )
    return out


def worst_ratio(rows: list[dict]) -> float:
    """The largest factor by which a prediction missed, either way (1.0 = every prediction exact)."""
    return max(max(r["ratio"], 1 / r["ratio"]) for r in rows)
