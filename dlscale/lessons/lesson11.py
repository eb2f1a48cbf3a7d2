"""Lesson 11, how many nodes: its question, conclusion and exercise checks (11.1-11.3: the breakdown from raw
timings, a predicted efficiency, the cheapest run)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from dlscale.bench.breakdown import ALONE, FULL, MEMORY, breakdown_parts
from dlscale.lessons.lesson_tools import Question, passed
from dlscale.scaling.collectives import Link, ring_allreduce

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "LARGEST_LOSS",
    "breakdown_conclusions",
    "check_breakdown",
    "check_cheapest",
    "check_predicted_efficiency",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _largest_part(result: dict[str, Any]) -> str | None:
    row = max(result["rows"], key=lambda r: r["size"])
    if row["size"] == min(r["size"] for r in result["rows"]):
        return None
    top, second = sorted(("io", "communication", "rest"), key=lambda p: -row[p])[:2]
    if result.get("rounds", 1) > 1 and row["range"][top][0] <= row["range"][second][1]:
        return "d"  # (the rounds disagree on which part is largest: the same rule as breakdown_conclusions)
    return {"io": "a", "communication": "b", "rest": "c"}[top]


LARGEST_LOSS = Question(
    "at the largest size of the breakdown, the largest part of the lost efficiency is...",
    {
        "a": "exposed I/O (the loader)",
        "b": "exposed communication (the all-reduce)",
        "c": "the rest (compute that does not scale: ranks sharing cores)",
        "d": "too close to tell: the rounds disagree on which part is largest",
    },
    _largest_part,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


_PART_NAMES = {"io": "exposed I/O", "communication": "exposed communication", "rest": "the rest"}


def breakdown_conclusions(result: dict[str, Any]) -> list[str]:
    """The breakdown (``bench_breakdown``): per size, the loss and its largest part, whether the rounds agree on
    which part that is, and the bucket size that hid the most communication."""
    lines = []
    for row in result["rows"][1:]:
        parts = sorted(("io", "communication", "rest"), key=lambda p: -row[p])
        top, second = parts[0], parts[1]
        low_top, _ = row["range"][top]
        _, high_second = row["range"][second]
        sure = (
            "one round only: run more to know how sure that is"
            if result["rounds"] < 2
            else "every round agrees"
            if low_top > high_second
            else f"but the rounds overlap with {_PART_NAMES[second]} ({100 * row['range'][second][0]:.0f} to "
            f"{100 * high_second:.0f}%): run more rounds or steps before acting on it"
        )
        lines.append(
            f"{row['size']} {result['unit']}: {100 * row['efficiency']:.0f}% efficient; of the "
            f"{100 * row['loss']:.0f}% lost, {_PART_NAMES[top]} is the largest part "
            f"({100 * row[top]:.0f}%), {sure}"
        )
        exposed = row.get("exposed_communication_ms")
        if exposed and len(exposed) > 1:
            best = min(exposed, key=exposed.get)
            others = ", ".join(f"{mb} MiB {ms:.2f} ms" for mb, ms in exposed.items() if mb != best)
            lines.append(
                f"buckets of {best} MiB left the least communication exposed ({exposed[best]:.2f} ms per "
                f"step; {others})"
            )
    return lines


# -- the exercises' checks -----------------------------------------------------------------------------------


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def check_breakdown(breakdown: Callable[[dict, dict], dict]) -> None:
    """11.1: exposed I/O, exposed communication and the rest, from step times at n ranks and at one rank."""
    # one rank already waits 2 ms for its loader (12 against 10); at two ranks the loader adds no more
    ref = {FULL: 0.012, MEMORY: 0.010}
    at_two = {FULL: 0.016, MEMORY: 0.014, ALONE: 0.011}
    got = breakdown(dict(at_two), dict(ref))
    want = breakdown_parts(at_two, ref)
    assert set(got) >= {"io", "communication", "rest"}, (
        f"return a dict with 'io', 'communication' and 'rest' (got keys {sorted(got)})"
    )
    if _close(got["io"], 0.002 / 0.016):
        raise AssertionError(
            "exposed I/O came out as 12.5%, what the loader adds at two ranks; one rank already "
            "waited as long for it. The part of the lost efficiency is how much that wait grew: "
            "subtract the one-rank difference (full - data in memory) too"
        )
    if _close(got["communication"], 0.003 / 0.012):
        raise AssertionError(
            "the parts are fractions of the step at n ranks, t_full(n), not of the one-rank "
            "step: divide by the larger time, so that efficiency plus the parts is 100%"
        )
    for part in ("io", "communication", "rest"):
        assert _close(got[part], want[part]), (
            f"{part}: got {got[part]:.4f}, expected {want[part]:.4f} (= {_formula(part)})"
        )
    rng = random.Random(11)
    for _ in range(20):  # any timings: the parts add up to the lost efficiency
        ref = {FULL: rng.uniform(0.01, 0.02), MEMORY: rng.uniform(0.005, 0.01)}
        t = {FULL: rng.uniform(0.02, 0.04), MEMORY: rng.uniform(0.015, 0.02), ALONE: rng.uniform(0.01, 0.015)}
        got = breakdown(dict(t), dict(ref))
        total = got["io"] + got["communication"] + got["rest"]
        assert _close(total, 1 - ref[FULL] / t[FULL]), (
            f"for t={t} and ref={ref} your parts add up to {total:.4f}, but the lost efficiency is "
            f"{1 - ref[FULL] / t[FULL]:.4f}: each part must be the growth of one cost from one rank to n"
        )
    passed("11.1")


def _formula(part: str) -> str:
    return {
        "io": "((t_full(n) - t_mem(n)) - (t_full(1) - t_mem(1))) / t_full(n)",
        "communication": "(t_mem(n) - t_alone(n)) / t_full(n)",
        "rest": "(t_alone(n) - t_mem(1)) / t_full(n)",
    }[part]


def predicted_efficiency(
    step_seconds: float, gradient_bytes: float, ranks: int, alpha: float, beta: float, overlap: float
) -> float:
    """The reference for 11.2: one rank's step over the step plus the exposed part of a ring all-reduce."""
    comm = ring_allreduce(gradient_bytes, ranks, Link(alpha, beta))
    return step_seconds / (step_seconds + (1 - overlap) * comm)


def check_predicted_efficiency(predict: Callable[[float, float, int, float, float, float], float]) -> None:
    """11.2: the efficiency at ``ranks`` from one rank's step time, the gradient, α, β and the overlap."""
    step, gradient, alpha, beta = 0.02, 100e6, 1e-4, 1e-9  # 20 ms of compute; 100 MB of gradients at 1 GB/s
    mistakes = {
        "you counted the bytes of one pass only (a reduce-scatter): a ring all-reduce is a reduce-scatter and an "
        "all-gather, so each rank sends 2(p-1)/p of the buffer": lambda p, o: (
            step / (step + (1 - o) * ((p - 1) * alpha + (p - 1) / p * gradient * beta))
        ),
        "each rank sends 2(p-1)/p of the buffer, not all of it twice (leave out the (p-1)/p and the model "
        "ignores that a ring splits the buffer into p chunks)": lambda p, o: (
            step / (step + (1 - o) * (2 * (p - 1) * alpha + 2 * gradient * beta))
        ),
        "the overlap hides that share of the communication: multiply the all-reduce by (1 - overlap)": lambda p, o: (
            step / (step + ring_allreduce(gradient, p, Link(alpha, beta)))
        ),
        "a ring of p ranks makes 2(p-1) steps, each costing α once: the latency term is 2(p-1)α": lambda p, o: (
            step / (step + (1 - o) * (2 * p * alpha + 2 * (p - 1) / p * gradient * beta))
        ),
    }
    for ranks, overlap in ((2, 0.0), (4, 0.5), (16, 0.25)):
        got = predict(step, gradient, ranks, alpha, beta, overlap)
        want = predicted_efficiency(step, gradient, ranks, alpha, beta, overlap)
        if _close(got, want):
            continue
        for why, wrong in mistakes.items():
            if _close(got, wrong(ranks, overlap)):
                raise AssertionError(f"at {ranks} ranks with overlap {overlap}: {why}")
        raise AssertionError(
            f"at {ranks} ranks with overlap {overlap}: got {got:.4f}, expected {want:.4f}: "
            f"step / (step + (1 - overlap) · (2(p-1)·α + 2(p-1)/p·n·β))"
        )
    assert _close(predict(step, gradient, 1, alpha, beta, 0.0), 1.0), "one rank sends nothing: its efficiency is 1"
    passed("11.2")


def _run(name: str, nodes: int, hours: float | None) -> dict:
    return {"run": name, "nodes": nodes, "hours_to_target": hours}


def check_cheapest(cheapest: Callable[[list[dict], float], str | None]) -> None:
    """11.3: the run with the fewest node-hours among those that reached the target within the deadline."""
    runs = [
        _run("1 node", 1, 10.0),  # 10 node-hours, misses a 6-hour deadline
        _run("2 nodes", 2, 5.5),  # 11 node-hours: the cheapest on time
        _run("4 nodes", 4, 3.0),  # 12
        _run("8 nodes", 8, 2.0),  # 16: the fastest
        _run("16 nodes", 16, None),
    ]  # never reached the target (its batch was too large)
    got = cheapest([dict(r) for r in runs], 6.0)
    if got == "8 nodes":
        raise AssertionError(
            "you chose the fastest run; the question is the cheapest one (fewest node-hours: "
            "nodes × hours) that still meets the deadline"
        )
    if got == "1 node":
        raise AssertionError("1 node is the cheapest, but it takes 10 h and the deadline is 6 h")
    if got == "16 nodes":
        raise AssertionError("16 nodes never reached the target (its time is None): it cannot be chosen")
    if got == "4 nodes":
        raise AssertionError(
            "4 nodes takes 3 h on 4 nodes, 12 node-hours; 2 nodes takes 11: compare nodes × hours, not hours alone"
        )
    assert got == "2 nodes", f"got {got!r}, expected '2 nodes' (11 node-hours, 5.5 h)"
    assert cheapest([dict(r) for r in runs], 1.0) is None, "no run meets a 1-hour deadline: return None"
    assert cheapest([dict(r) for r in runs], 24.0) == "1 node", (
        "with a day to spare, 1 node (10 node-hours) is cheapest"
    )
    passed("11.3")
