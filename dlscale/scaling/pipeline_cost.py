"""A pipeline's step time: the bubble of its schedule, the activations sent between stages, and the rest of the step.

A pipeline of ``p`` stages cuts each data-parallel rank's batch into ``m`` micro-batches. With every micro-batch's
forward and backward taking the same time on every stage, a schedule fills the pipeline, runs, and drains it: a
rank works ``m`` slots and waits ``p - 1`` (GPipe and 1F1B alike; Narayanan et al. 2021, §2.2). Holding ``v`` stages
per rank (interleaved 1F1B) makes each slot ``v`` times shorter, so the wait shrinks by ``v`` — for ``v`` times as
many sends. Each slot also sends one micro-batch's activations forward and its gradient back, on the link between
the two stages (:func:`send_seconds`). So the step is

    step = (v·m + p - 1) · ((compute + tensor) / v + 2·send) + data_parallel,

``compute`` one micro-batch's forward and backward on the rank's stage(s), ``tensor`` its tensor-parallel
all-reduces, ``data_parallel`` the all-reduce of the stage's gradient share after the pipeline is flushed. The idle
share of the slots is the textbook bubble ``(p - 1)/(v·m + p - 1)`` (:func:`bubble_share`; the same formula as
:func:`dlscale.distributed.pipeline.textbook_bubble`, which the lesson measures — written again here so that the
plan does not import torch).

What a schedule holds (:func:`held_microbatches`): GPipe every micro-batch's activations until its backward; 1F1B
at most ``p`` on the first stage; interleaved 1F1B ``p + (p - 1)/v`` stage-loads (Korthikanti et al. 2022, §4.2.3).

Not modelled: stages of unequal cost (the first holds the embedding, the last the logits), sends overlapped with
compute, and the all-reduce of the last stages' gradients overlapped with the first stages' backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import RangeError, check_range
from dlscale.scaling.collectives import Link, ring_allgather

#: The schedules the plan prices: the same names as ``pipeline_schedule`` in a config
#: (:data:`dlscale.distributed.pipeline.SCHEDULES`).
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def bubble_share(pipeline: int, microbatches: int, virtual: int = 1) -> float:
    """The share of a step's slots a stage idles: ``(p - 1)/(v·m + p - 1)`` (0 without a pipeline)."""
    check_range("pipeline stages", pipeline, 1)
    check_range("micro-batches", microbatches, 1)
    check_range("stages per rank", virtual, 1)
    return (pipeline - 1) / (virtual * microbatches + pipeline - 1)


def held_microbatches(schedule: str, pipeline: int, microbatches: int, virtual: int = 1) -> float:
    """How many micro-batches of its stage's activations the first stage holds at once under ``schedule``."""
    if pipeline == 1:
        return 1.0  # (no pipeline: one micro-batch at a time, its gradients accumulated)
    if schedule == "gpipe":
        return float(microbatches)
    if schedule == "1f1b":
        return float(min(microbatches, pipeline))
    if schedule == "interleaved-1f1b":
        return min(float(microbatches), pipeline + (pipeline - 1) / virtual)
    raise RangeError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")


def schedule_refusal(schedule: str, pipeline: int, microbatches: int, virtual: int) -> str | None:
    """Why ``schedule`` cannot run ``microbatches`` on ``pipeline`` stages of ``virtual`` per rank (None: it can),
    by torch.distributed.pipelining's own rules."""
    if schedule not in SCHEDULES:
        raise RangeError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    if schedule == "interleaved-1f1b" and virtual < 2:
        return "interleaved 1F1B holds at least 2 stages per rank"
    if schedule != "interleaved-1f1b" and virtual != 1:
        return f"{schedule} holds one stage per rank"
    if schedule == "1f1b" and microbatches < pipeline:
        return f"1F1B needs at least {pipeline} micro-batches (one per stage), has {microbatches}"
    return None


def send_seconds(n_bytes: float, tensor: int, across_nodes: bool, inside: Link, between: Link) -> float:
    """One micro-batch's activations (``n_bytes``) sent from one stage to the next, on the link between them.

    With tensor parallelism every rank of a stage holds the same activations, so each sends a ``1/t`` slice and the
    next stage's ranks all-gather it inside their node (Megatron-LM's scatter/gather, Narayanan et al. 2021, §4.1)."""
    link = between if across_nodes else inside
    if tensor <= 1:
        return link.alpha + n_bytes * link.beta
    return link.alpha + n_bytes / tensor * link.beta + ring_allgather(n_bytes, tensor, inside)


@dataclass(frozen=True)
class PipelineStep:
    """One step of a pipeline on one rank, in seconds: its parts add up to :attr:`step`."""

    compute: float  # every micro-batch's forward and backward on the rank's stages
    tensor: float  # their tensor-parallel all-reduces
    bubble: float  # the slots the rank waits while the pipeline fills and drains
    send: float  # activations and their gradients sent between stages
    data_parallel: float  # the all-reduce of the stage's gradients (or FSDP's collectives), exposed

    @property
    def step(self) -> float:
        return self.compute + self.tensor + self.bubble + self.send + self.data_parallel


def pipeline_step(
    compute: float,
    tensor: float,
    send: float,
    microbatches: int,
    pipeline: int = 1,
    virtual: int = 1,
    data_parallel: float = 0.0,
) -> PipelineStep:
    """A step of ``microbatches`` on a rank of a ``pipeline``-stage pipeline (``virtual`` stages per rank): ``compute``
    and ``tensor`` are one micro-batch's, on all the rank's stages; ``send`` one micro-batch's activations between
    two stages (:func:`send_seconds`); ``data_parallel`` what follows the flush. Without a pipeline: no bubble, no
    sends."""
    for label, value in (("compute", compute), ("tensor", tensor), ("send", send), ("data parallel", data_parallel)):
        check_range(f"{label} seconds", value, 0)
    share = bubble_share(pipeline, microbatches, virtual)
    if pipeline == 1:
        return PipelineStep(microbatches * compute, microbatches * tensor, 0.0, 0.0, data_parallel)
    slots = virtual * microbatches + pipeline - 1
    work = (compute + tensor) / virtual  # one slot's work: a micro-batch on one of the rank's stages
    return PipelineStep(
        microbatches * compute,
        microbatches * tensor,
        share * slots * work,  # (the p - 1 idle slots)
        slots * 2 * send,  # (each slot sends a micro-batch forward and a gradient back)
        data_parallel,
    )
