"""A stage's one record: its gaps by name, each with what it asks, its three hints and its behaviour probe; the
settings its check also tries; where it runs. The records themselves are :mod:`dlscale.lessons.stages`, one module
per lesson (torchtitan's ``TrainSpec`` is the pattern: one registered record, not seven tables keyed by one id).

A gap is a run of whole statements of the shipped stage (``recipes/NN_*.py``): from the first line that holds
``first`` to the next that holds ``last``. The lesson shows the stage with each gap replaced by a ``TODO`` that says
what must be true once it is written (``asks``: a behaviour, never the code). A probe reads what the run did
(:func:`~dlscale.lessons.stage_probes.watch`) and says what is wrong, or None.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from dlscale.runtime.devices import device_for_ranks

#: (what the run did, the arguments it ran with, the stage's result) -> what is wrong, or None.
Probe = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], "str | None"]


@dataclass(frozen=True)
class Variant:
    """An answer attendees write, as edits of our stage: each ``(old, new)`` replaces the first ``old`` in the file
    (a part of one line); the lines of ``new`` after its first take that line's indentation plus their own."""

    what: str  # what the attendee did, in a few words
    edits: tuple[tuple[str, str], ...]
    settings: Mapping[str, Any] = field(default_factory=dict)  # what the run needs to show it (compile=True)
    names: str | None = None  # the gap a wrong one is named by (default: its own); "outside": the line outside


@dataclass(frozen=True)
class Gap:
    """One gap of a stage, by name (``"05.e"``): where it is, what it asks, how its hints help, how it is checked."""

    id: str  # "05.e": the lesson, then the gap's letter; never derived from a position
    title: str  # a few words naming it in every verdict: "a new order every epoch"
    first: str  # text of the gap's first line in the shipped stage
    last: str  # text of its last line (the first line at or after ``first`` that holds it)
    asks: str  # what must be true once it is written: the TODO's text, a behaviour
    question: str  # the first hint: a question about that behaviour
    api: str  # the second hint: the functions and classes the answer uses
    probe: Probe | None = None  # what must be true of the run; None: the gap is judged by the numbers
    mistakes: tuple[Variant, ...] = ()  # wrong answers attendees write: each caught and named (the tests try them)
    alternatives: tuple[Variant, ...] = ()  # right answers written otherwise: each accepted (the tests try them)

    @property
    def label(self) -> str:
        """``TODO 05.e (a new order every epoch)``: the gap's name and title."""
        return f"TODO {self.id} ({self.title})"


@dataclass(frozen=True)
class Stage:
    """One lesson's stage: its file, its gaps in the order of the file, and how its check runs it."""

    lesson: str  # "05"
    file: str  # "05_ddp.py", in recipes/
    gaps: tuple[Gap, ...]
    runs_on: Literal["kernel", "ranks"]  # where the lesson runs it: its main in the kernel, or its file on engines
    check_ranks: int = 1  # the fewest ranks on which its gaps show (a pipeline of one stage sends nothing: 2)
    by_numbers: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the gaps the (R², update) point to
    #: Settings the check also runs the stage with, briefly (a few steps on a small set), so that every switch the
    #: stage takes is exercised: each entry is applied unless the lesson's own run already used its values.
    switches: tuple[Mapping[str, Any], ...] = ()
    switch_samples: int = 128  # the training maps of those runs (half as many validate)
    #: dlscale.train's settings that make it compute what the stage computes, beside its arguments (the stage's twin)
    twin: Mapping[str, Any] = field(default_factory=dict)
    #: Gaps whose probes read only what was built before the first step (the pipeline's stages): asked before a
    #: run's error is traced to its line, since a later line fails on what they made (a step, on a wrong stage)
    judged_before_errors: tuple[str, ...] = ()
    probe_order: tuple[str, ...] = ()  # the gaps' probes in this order (default: the file's), where one mistake
    # trips two probes and the first should name it

    def gap(self, gap_id: str) -> Gap:
        for gap in self.gaps:
            if gap.id == gap_id:
                return gap
        raise KeyError(f"stage {self.file} has no gap {gap_id!r}: its gaps are {', '.join(self.gap_ids)}")

    @property
    def gap_ids(self) -> list[str]:
        return [gap.id for gap in self.gaps]

    def probes(self) -> list[tuple[Gap, Probe]]:
        """(gap, probe) for each gap with a probe, in :attr:`probe_order` (the file's order by default)."""
        order = list(self.probe_order) + [g for g in self.gap_ids if g not in self.probe_order]
        return [(self.gap(g), self.gap(g).probe) for g in order if self.gap(g).probe is not None]


# -- what every probe reads ---------------------------------------------------------------------------------------


def steps_of(result: dict[str, Any]) -> int:
    """The number of steps the stage logged."""
    return len(result.get("losses") or [])


def epochs_of(result: dict[str, Any]) -> int:
    """The number of epochs the stage validated."""
    return len(result.get("r2") or [])


def device_kind(arguments: dict[str, Any]) -> str:
    """The kind of device the stage ran on: its ``device`` argument, resolved as the stages' ``pick_device`` does
    (``auto``, the default: a GPU per rank where this node's ranks do not outnumber its GPUs, else the CPU)."""
    spec = arguments.get("device") or "auto"
    if spec == "auto":
        ranks_on_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", "1")))
        return "cuda" if torch.cuda.is_available() and device_for_ranks(ranks_on_node) == "auto" else "cpu"
    return torch.device(spec).type
