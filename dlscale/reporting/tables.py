"""Markdown tables: what the benchmarks print and what docs/benchmarks.md records.

Every command that reports rows (``dlscale bench ...``, ``dlscale report``, lesson 07's sweep)
formats its cells and hands them here, so all tables look alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """``rows`` of already formatted cells under ``header``, as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
