"""What the lesson modules share: a question asked before a measurement, a reading of the attendee's numbers,
the comparison of two spreads, and the plumbing of the exercises' checks.

Each lesson's own content is one module, :mod:`dlscale.lessons.lessonNN` (its ``__all__`` is what its notebooks
import through :mod:`dlscale.lab`); this module holds what several of them use.

**Think first, then see.** A lesson shows a :class:`Question` and its choices, and a cell holds ``prediction = None``
for the attendee's letter; the cells after it measure, and ``QUESTION.verdict(prediction, ...)`` prints the
prediction beside the choice the numbers support. Each question's ``outcome`` reads the measurement the lesson has
just made, with the same rules as the conclusions printed after it.

**The attendee's conclusion, from their own numbers.** After a lesson measures the attendee's stage
(:mod:`dlscale.lessons.stage_measure`), it asks them to state what their numbers say — a choice, or a number read
from their table — in a cell (``my_reading = None``). Then ``READING.check(my_reading, measurement)`` answers in one
line: supported by their numbers, or not and what the numbers show instead. The kit's own conclusion follows, as
ours, for comparison. Every :class:`Reading` accepts what the numbers cannot tell apart (two batch sizes whose rounds
overlap are both "the fastest"), so a right reading never fails on a busy machine.

**Conclusions** are printed from the attendee's own numbers, not asserted in the lesson text: a lesson's markdown
says what to look for and why; its conclusion functions read the measurements of the run that just happened and say
what they show, including when they show nothing (the rounds overlap, a recipe diverged).

**The exercises' checks** compare the learner's answer with an independent reference on inputs chosen so that the
common mistakes give a different result, print a line when it passes (:func:`passed`), and raise
``AssertionError`` with a hint when it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dlscale.bench.repeats import Spread, clearly_faster

# -- asked before a measurement, read from the attendee's numbers --------------------------------------------


@dataclass(frozen=True)
class Question:
    """A multiple-choice question about a measurement, and how to read its answer from the numbers."""

    text: str
    choices: dict[str, str]
    outcome: Callable[..., str | None]  # the measurement -> the letter it supports (None: not measured)

    def markdown(self) -> str:
        """The question and its choices, for the cell before the measurement."""
        return f"**Predict first:** {self.text}\n\n" + "\n".join(f"- ({k}) {v}" for k, v in self.choices.items())

    def ask(self) -> None:
        """Show :meth:`markdown` in a notebook (the cell that asks also holds ``prediction = None``)."""
        from IPython.display import Markdown, display

        display(Markdown(self.markdown()))

    def verdict(self, prediction: str | None, *measurement: Any) -> str:
        """The attendee's prediction beside what ``measurement`` shows."""
        answer = self.outcome(*measurement)
        if prediction is not None and prediction not in self.choices:
            raise ValueError(
                f"prediction must be one of {', '.join(map(repr, self.choices))} (or None); got {prediction!r}"
            )
        if answer is None:
            return "This run did not measure it (see the parameters cell)."
        shown = f"the measurement says ({answer}) {self.choices[answer]}"
        if prediction is None:
            return f"No prediction was made (set `prediction` before running the measurement); {shown}."
        if prediction == answer:
            return f"You predicted ({prediction}), and {shown}."
        return f"You predicted ({prediction}) {self.choices[prediction]}; {shown}. Why? Read on."


@dataclass(frozen=True)
class Reading:
    """A question about the attendee's measurement, and what their numbers accept as its answer."""

    text: str
    kind: str  # what the answer is: "a number from your table", "True or False", ...
    accepted: Callable[..., tuple[Callable[[Any], bool], str]]  # measurement -> (accepts(answer), what it shows)
    variable: str = "my_reading"  # the notebook's name for the answer (a lesson that asks two readings: another)

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
                f"You left your conclusion empty (set `{self.variable}` and run this cell again); your numbers show "
                f"{shows}."
            )
        if accepts(answer):
            return f"Your numbers support it: {answer!r} — they show {shows}."
        return f"Your numbers do not support {answer!r}: they show {shows}. Read your table again."


def overlapping(spreads: dict[Any, Spread], best: Any) -> list[Any]:
    """The keys the best one is not clearly faster than: they cannot be told apart from it."""
    return [key for key, spread in spreads.items() if not clearly_faster(spreads[best], spread)]


def as_number(answer: Any) -> float | None:
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


# -- the attendee's stage ------------------------------------------------------------------------------------


def stage_config(samples: int, config: str = "tiny") -> str:
    """The config whose maps the attendee's stage trains on: ``config`` itself at its own number of training maps,
    else a config that inherits it with ``samples`` training maps and half as many to validate (a lesson's
    ``stage_samples``, which the tests set smaller)."""
    from dlscale.config import load_config
    from dlscale.lessons.stage_probes import small_config

    return config if samples == load_config(config).train_samples else small_config(config, samples)


# -- ours, from the attendee's numbers -----------------------------------------------------------------------


def compare_spreads(name: str, spread: Spread, other: str, baseline: Spread) -> str:
    """One sentence: is ``spread`` clearly above, clearly below, or within the rounds of ``baseline``?"""
    ratio = spread.median / baseline.median
    if clearly_faster(spread, baseline):
        verdict = f"clearly faster than {other} ({ratio:.2f}×; every round beat every round of {other})"
    elif clearly_faster(baseline, spread):
        verdict = f"clearly slower than {other} ({ratio:.2f}×; every round lost to every round of {other})"
    else:
        verdict = (
            f"not distinguishable from {other} on this machine ({ratio:.2f}×, but the rounds overlap: "
            f"{spread.low:,.0f}-{spread.high:,.0f} against {baseline.low:,.0f}-{baseline.high:,.0f})"
        )
    return f"{name}: {verdict}."


# -- the exercises' checks -----------------------------------------------------------------------------------


def passed(exercise: str) -> None:
    """The line a check prints when the answer is right."""
    print(f"Exercise {exercise} passed ✓")


def trained_r2(config: str, **overrides: Any) -> float:
    """The final validation R² of a whole run of ``config`` with ``overrides`` (the engine's, quiet)."""
    from dlscale.training.loop import train

    return train(config, progress=False, plot=False, **overrides).final["r2"]


def require_filled_in(*answers: Any) -> None:
    """Raise a learner's stub here, before any engine or rank starts: a function whose source still holds the
    exercise's ``raise NotImplementedError("Exercise …")`` would raise it there, seconds later."""
    import ast
    import inspect
    import re

    for answer in answers:
        try:
            source = inspect.getsource(answer) if callable(answer) else ""
        except (OSError, TypeError):  # (a function without a source to read: it runs as it is)
            continue
        stub = re.search(r'^\s*raise NotImplementedError\(("Exercise.*")\)\s*$', source, re.M)
        if stub:
            raise NotImplementedError(ast.literal_eval(stub[1]))


def on_two_engines(function: Callable, *args: Any) -> list[Any]:
    """``function(*args)`` on two engines as ranks 0 and 1; a learner's stub raised there is raised here as itself."""
    from dlscale.jobs.notebook_engines import EngineError, run_on_engines

    require_filled_in(*args)
    try:
        return run_on_engines(function, 2, *args, timeout=120)
    except EngineError as err:
        if "NotImplementedError" in str(err):  # the learner's stub, raised on the engines: show it as such
            raise NotImplementedError(str(err).split("NotImplementedError: ", 1)[1].split(";")[0]) from None
        raise


def regression_problem(n: int = 256, features: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """06.1's data: ``n`` samples of a noisy linear function, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator) + 0.1 * torch.randn(n, 1, generator=generator)
    return x, y
