"""Lesson 02, data loading: its question, reading, conclusion and exercise checks (02.1, 02.2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dlscale.bench.repeats import Spread, clearly_faster
from dlscale.lessons.lesson_tools import Question, Reading, as_number, overlapping, passed

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "FEWEST_WORKERS",
    "LOADER",
    "check_loader_choice",
    "check_staging_payoff",
    "loader_conclusion",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _loader(supply: Spread, demand: Spread) -> str:
    return "a" if clearly_faster(supply, demand) else "b" if clearly_faster(demand, supply) else "c"


LOADER = Question(
    "can one process read and augment maps as fast as the model trains on plain ones?",
    {
        "a": "yes: the loader alone is clearly faster",
        "b": "no: the step would be starved",
        "c": "too close to tell apart",
    },
    _loader,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _workers(measurement) -> tuple[Callable[[Any], bool], str]:
    spreads = measurement.spreads
    best = max(spreads, key=lambda key: spreads[key].median)
    tied = sorted(overlapping(spreads, best))
    fewest = tied[0]
    shows = (
        f"{fewest} worker(s) as fast as any setting you measured ({spreads[fewest]} samples/s; the fastest "
        f"{best}: {spreads[best]})"
    )
    return (lambda answer: as_number(answer) == float(fewest)), shows


FEWEST_WORKERS = Reading(
    "with how many loader workers will you train on this machine: the fewest that are as fast "
    "as any setting you measured?",
    "a number of workers",
    _workers,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def loader_conclusion(supply: Spread, demand: Spread) -> str:
    """Can the loader keep the model fed? ``supply``: the loader alone (one process, samples/s);
    ``demand``: training on plain maps, what the model could take."""
    if clearly_faster(supply, demand):
        return (
            f"One process augments {supply.median:,.0f} samples/s, more than the model's {demand.median:,.0f}: "
            f"moved into one worker, the augmentation can be hidden behind the training entirely. In the "
            f"training process it cannot: there every step pays for it in full."
        )
    if clearly_faster(demand, supply):
        needed = math.ceil(demand.median / supply.median)
        return (
            f"Starved: one process augments only {supply.median:,.0f} samples/s, and the model could take "
            f"{demand.median:,.0f}. Even moved into a worker, one worker cannot keep up; it takes about "
            f"{needed} workers, each with a core of its own."
        )
    return (
        f"Too close to call on this machine: the loader's {supply.low:,.0f}-{supply.high:,.0f} samples/s and the "
        f"model's {demand.low:,.0f}-{demand.high:,.0f} overlap, so one worker is just about enough."
    )


# -- the exercises' checks -----------------------------------------------------------------------------------


def check_loader_choice(choose: Callable[[dict, float], tuple[int, bool]]) -> None:
    """02.1: the fewest workers (then pinned memory off) whose loader rate is at least twice the training rate."""
    table = {
        (0, False): 900.0,
        (0, True): 950.0,
        (1, False): 2100.0,
        (1, True): 2300.0,
        (2, False): 4000.0,
        (2, True): 4400.0,
        (4, False): 4300.0,
        (4, True): 4500.0,
    }
    cases = [(1000.0, (1, False)), (2100.0, (2, True)), (400.0, (0, False)), (5000.0, (4, True))]
    for training_rate, expected in cases:
        answer = tuple(choose(table, training_rate))
        assert answer == expected, (
            f"training at {training_rate:.0f} samples/s: got {answer}, expected {expected}. Keep the settings whose "
            f"loader rate is at least 2x the training rate; among them take the fewest workers (each worker takes a "
            f"CPU core and memory), pinned memory only if it is needed; if none reaches 2x, take the fastest."
        )
    passed("02.1")


def check_staging_payoff(epochs_to_pay_off: Callable[[float, float, float], int | None]) -> None:
    """02.2: the fewest epochs after which staging once and reading locally took less time than reading in place."""
    cases = [
        ((10.0, 4.0, 1.0), 4),
        ((9.0, 4.0, 1.0), 4),
        ((0.5, 4.0, 1.0), 1),
        ((10.0, 1.0, 1.0), None),
        ((10.0, 1.0, 2.0), None),
        ((3.0, 10.0, 1.0), 1),
    ]
    for (stage, in_place, local), expected in cases:
        answer = epochs_to_pay_off(stage, in_place, local)
        assert answer == expected, (
            f"staging {stage:g} s once, an epoch {in_place:g} s in place or {local:g} s locally: got {answer}, "
            f"expected {expected}. After n epochs staging has cost {stage:g} + n x {local:g} s against n x "
            f"{in_place:g} s: the fewest n for which that is strictly less (a tie has not paid yet), or None if a "
            f"local epoch is not faster"
        )
    passed("02.2")
