"""Repeated measurements: the median of several rounds and their spread.

On a shared machine (a login node, a laptop with a browser open, a Jupyter server used by a
room) one measurement can be off by more than the effect it is meant to show. Every throughput
comparison in the lessons runs each setting several times, the settings taking turns so that a
slow spell hits all of them, and reports the median with the lowest and highest round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Hashable


@dataclass
class Spread:
    """The rounds of one measurement."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def relative_spread(self) -> float:
        """(highest - lowest) / median: 0.1 means the rounds disagree by 10%."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def __str__(self) -> str:
        return f"{self.median:,.0f} (rounds {self.low:,.0f}-{self.high:,.0f})"


def measure_rounds(
    measures: dict[Hashable, Callable[[], float]], rounds: int = 3, progress: bool = False
) -> dict[Hashable, Spread]:
    """Call every measure once per round, in turn, and collect the values per key.

    The order reverses every other round (a b, b a, a b, ...), so no measure always runs right after the same
    other one — in one process, each inherits what the one before left (its garbage, warm or cold caches): with a
    fixed order the engine, always run after its recipe, read 1.017x the recipe's time in `bench parity`, and 1.00x
    with the order reversed every other round. The garbage collector runs before each measure, outside it."""
    import gc

    from tqdm.auto import tqdm

    spreads = {key: Spread() for key in measures}
    order = list(measures)
    with tqdm(total=rounds * len(measures), desc="rounds", unit="run", disable=not progress) as bar:
        for round_number in range(rounds):
            for key in order if round_number % 2 == 0 else reversed(order):
                gc.collect()
                spreads[key].values.append(float(measures[key]()))
                bar.update()
    return spreads


def clearly_faster(fast: Spread, slow: Spread) -> bool:
    """True when every round of ``fast`` beat every round of ``slow`` (no overlap of the ranges)."""
    return fast.low > slow.high
