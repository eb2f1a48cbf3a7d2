"""Lesson 09, scaling out: its exercise check (09.1)."""

from __future__ import annotations

from collections.abc import Callable

from dlscale.lessons.lesson_tools import passed

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "check_time_to_solution",
]

# -- the exercise's check ------------------------------------------------------------------------------------


def check_time_to_solution(time_to_solution: Callable[[list[dict], float], str | None]) -> None:
    """09.1: the run that first reaches the target R² soonest in wall-clock time, or None if none does."""

    def run(label: str, seconds_per_epoch: float, r2: list[float]) -> dict:
        return {
            "label": label,
            "seconds_per_epoch": seconds_per_epoch,
            "history": [{"epoch": e, "r2": value} for e, value in enumerate(r2, 1)],
        }

    scaling = [
        run("1 rank", 10.0, [0.2, 0.4, 0.55, 0.6, 0.62, 0.63]),  # reaches 0.5 at 30 s
        run("4 ranks", 3.0, [0.1, 0.2, 0.3, 0.4, 0.45, 0.52]),  # at 18 s
        run("8 ranks", 1.5, [0.05, 0.1, 0.2, 0.3, 0.35, 0.4]),
    ]  # never: its batch is too large
    answer = time_to_solution(scaling, 0.5)
    assert answer != "8 ranks", (
        "you chose the run with the most samples per second, which never reaches R² 0.5: "
        "throughput is not time to solution"
    )
    assert answer == "4 ranks", (
        f"got {answer!r}, expected '4 ranks': the time to the first epoch whose R² reaches "
        f"the target is that epoch times the seconds per epoch (30 s, 18 s, never)"
    )
    dipping = [
        run("small batch", 10.0, [0.3, 0.52, 0.45, 0.48]),  # reaches at 20 s, then dips below
        run("large batch", 5.0, [0.1, 0.2, 0.3, 0.4, 0.51, 0.6]),
    ]  # reaches at 25 s
    answer = time_to_solution(dipping, 0.5)
    assert answer == "small batch", (
        f"got {answer!r}, expected 'small batch': it first reached R² 0.5 after 20 s, even though its last epoch "
        f"ended below; count the first epoch that reaches the target, not the final R²"
    )
    none = time_to_solution(scaling, 0.9)
    assert none is None, f"no run reaches R² 0.9, so the answer is None (got {none!r})"
    passed("09.1")
