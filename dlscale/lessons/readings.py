"""The attendee's conclusion, read from their own numbers, and checked against them.

After a lesson measures the attendee's stage (:mod:`dlscale.lessons.stage_measure`), it asks them to state what
their numbers say — a choice, or a number read from their table — in a cell (``my_reading = None``). Then
``READING.check(my_reading, measurement)`` answers in one line: supported by their numbers, or not and what the
numbers show instead. The kit's own conclusion follows, as ours, for comparison.

Every reading accepts what the numbers cannot tell apart (two batch sizes whose rounds overlap are both "the
fastest"), so a right reading never fails on a busy machine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from dlscale.bench.repeats import Spread, clearly_faster


@dataclass(frozen=True)
class Reading:
    """A question about the attendee's measurement, and what their numbers accept as its answer."""

    text: str
    kind: str  # what the answer is: "a number from your table", "True or False", ...
    accepted: Callable[..., tuple[Callable[[Any], bool], str]]  # measurement -> (accepts(answer), what it shows)

    def markdown(self) -> str:
        return f"**Your conclusion, from your numbers:** {self.text} ({self.kind})"

    def ask(self) -> None:
        """Show the question in a notebook (the cell that asks also holds ``my_reading = None``)."""
        from IPython.display import Markdown, display

        display(Markdown(self.markdown()))

    def check(self, answer: Any, *measurement: Any) -> str:
        """One line: whether ``answer`` is what the attendee's ``measurement`` supports."""
        accepts, shows = self.accepted(*measurement)
        if answer is None:
            return (
                f"You left your conclusion empty (set `my_reading` and run this cell again); your numbers show {shows}."
            )
        if accepts(answer):
            return f"Your numbers support it: {answer!r} — they show {shows}."
        return f"Your numbers do not support {answer!r}: they show {shows}. Read your table again."


def _overlapping(spreads: dict[Any, Spread], best: Any) -> list[Any]:
    """The keys the best one is not clearly faster than: they cannot be told apart from it."""
    return [key for key, spread in spreads.items() if not clearly_faster(spreads[best], spread)]


def _as_number(answer: Any) -> float | None:
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


def _fastest_batch(measurement) -> tuple[Callable[[Any], bool], str]:
    spreads = measurement.spreads
    best = max(spreads, key=lambda key: spreads[key].median)
    tied = _overlapping(spreads, best)
    shows = f"batch {best} fastest ({spreads[best]} samples/s)" + (
        f", not told apart from batch {', '.join(str(k) for k in tied if k != best)}" if len(tied) > 1 else ""
    )
    return (lambda answer: _as_number(answer) in {float(k) for k in tied}), shows


def _workers(measurement) -> tuple[Callable[[Any], bool], str]:
    spreads = measurement.spreads
    best = max(spreads, key=lambda key: spreads[key].median)
    tied = sorted(_overlapping(spreads, best))
    fewest = tied[0]
    shows = (
        f"{fewest} worker(s) as fast as any setting you measured ({spreads[fewest]} samples/s; the fastest "
        f"{best}: {spreads[best]})"
    )
    return (lambda answer: _as_number(answer) == float(fewest)), shows


def _precision_kept(r2: dict[str, float], noise: float, format_: str = "fp16") -> tuple[Callable[[Any], bool], str]:
    allowed = max(noise, 0.01)
    gap = abs(r2[format_] - r2["fp32"])
    kept = gap <= allowed
    shows = (
        f"{format_} R² {r2[format_]:.4f} against fp32's {r2['fp32']:.4f}: a gap of {gap:.4f}, "
        f"{'within' if kept else 'beyond'} the noise of {allowed:.4f} (fp32's spread over seeds, at least 0.01)"
    )
    return (lambda answer: isinstance(answer, bool) and answer == kept), shows


def _largest_range(times: dict[str, float], marked: Collection[str]) -> tuple[Callable[[Any], bool], str]:
    own = {name: ms for name, ms in times.items() if name in marked}
    if not own:
        return (lambda answer: False), f"none of the ranges {sorted(marked)} in your trace"
    top = max(own.values())
    near = [name for name, ms in own.items() if ms >= 0.9 * top]  # (within 10%: not told apart by one window)
    shows = (
        ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(own.items(), key=lambda item: -item[1])) + " per step"
    )
    return (lambda answer: answer in near), shows


def _efficiency(measurement, one: Any, many: Any, ranks: int) -> tuple[Callable[[Any], bool], str]:
    single, several = measurement.spreads[one], measurement.spreads[many]
    efficiency = 100 * several.median / (ranks * single.median)
    low, high = 100 * several.low / (ranks * single.high), 100 * several.high / (ranks * single.low)
    shows = (
        f"{ranks} ranks {several.median:,.0f} samples/s against one rank's {single.median:,.0f}: an efficiency of "
        f"{efficiency:.0f}% (the rounds allow {low:.0f}-{high:.0f}%)"
    )
    return (lambda answer: (n := _as_number(answer)) is not None and low - 5 <= n <= high + 5), shows


def _larger_batch_kept(r2: dict[int, float], tolerance: float = 0.02) -> tuple[Callable[[Any], bool], str]:
    small, large = min(r2), max(r2)
    kept = r2[large] >= r2[small] - tolerance
    shows = (
        f"R² {r2[large]:.4f} at global batch {large} against {r2[small]:.4f} at {small}: "
        f"{'within' if kept else 'more than'} {tolerance} {'of' if kept else 'below'} it"
    )
    return (lambda answer: isinstance(answer, bool) and answer == kept), shows


def _shard_share(shares: dict[str, float]) -> tuple[Callable[[Any], bool], str]:
    percent = [100 * share for share in shares.values()]
    shows = (
        f"the ranks' files hold {', '.join(f'{p:.0f}%' for p in percent)} of the bytes of the checkpoint's "
        f"{len(percent)} shard files"
    )
    return (lambda answer: (n := _as_number(answer)) is not None and all(abs(n - p) <= 10 for p in percent)), shows


FASTEST_BATCH = Reading(
    "which global batch size gave your stage the most samples per second?",
    "a batch size from your table",
    _fastest_batch,
)
FEWEST_WORKERS = Reading(
    "with how many loader workers will you train on this machine: the fewest that are as fast "
    "as any setting you measured?",
    "a number of workers",
    _workers,
)
FP16_KEPT = Reading(
    "did your stage in fp16 (with its scaler) end within the noise of fp32's R²?", "True or False", _precision_kept
)
LARGEST_RANGE = Reading(
    "which of your stage's own ranges takes the most time in a step?",
    "a range's name, as your table prints it",
    _largest_range,
)
TWO_RANK_EFFICIENCY = Reading(
    "what is your stage's strong-scaling efficiency on two ranks, in percent: the two "
    "ranks' samples/s over twice one rank's?",
    "a number, ±5",
    _efficiency,
)
LARGER_BATCH_KEPT = Reading(
    "at the larger global batch, with your stage's LR scaling and warmup, did the validation "
    "R² stay within 0.02 of the smaller batch's?",
    "True or False",
    _larger_batch_kept,
)
SHARD_SHARE = Reading(
    "what share of the checkpoint's bytes did each of your FSDP ranks write, in percent?",
    "a number, within 10 of each rank's",
    _shard_share,
)
