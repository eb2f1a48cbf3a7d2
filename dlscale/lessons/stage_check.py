"""The stage check: the attendee's stage, gap by gap, then step by step against ``dlscale.train``.

:func:`check_stage` reads what :func:`~dlscale.lessons.stage_probes.run_stage` returned. First, how the stage
stopped if it did, traced to the line and the line to its gap (or to "a line outside the gaps"); then each gap's
behaviour probe (its record, :mod:`dlscale.lessons.stages`), on the lesson's run and on the brief runs at the
stage's other settings (every switch exercised); then the losses and R² against the engine's twin, where a
difference names the gaps whose lines differ from ours, or the line outside them. Each message is one line that
starts with the gap's label, ``TODO 05.c``, or says that the mistake is outside the gaps. No probe depends on
timing; NaN never passes.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import torch

from dlscale.lessons.gaps import answer_lines
from dlscale.lessons.stage_record import Stage
from dlscale.lessons.stages import find_gap, stage_record

#: How far the attendee's losses may lie from the engine's, relative to the loss. On a CPU both run the same
#: kernels in the same order: what differs is rounding (well below 1e-5). On a GPU, cuDNN may choose other
#: convolution algorithms in each process, some not deterministic, and TF32 may be on: a few parts in 1e3
#: per step, which grow over the steps, so 3% there. A mistake in a stage moves the loss by far more.
STAGE_TOLERANCE = {"cpu": 1e-4, "cuda": 3e-2}


#: Errors that say which call is missing: (words in the message, an API name the missing answer calls).
_KNOWN_ERRORS = (
    ("process group has not been initialized", "init_process_group"),
    ("no attribute 'set_requires_gradient_sync'", "fully_shard"),  # (a method FSDP2 adds)
    ("no attribute 'synchronize'", "DistributedOptimizer"),  # (a method Horovod's optimizer adds)
    ("meta", "to_empty"),
    ("Horovod has not been initialized", "hvd.init"),
    ("losses but got 0", "loss_fn"),  # (a pipeline schedule made without the loss it computes on the last stage)
)

#: Words of an error a rank meets because another rank stopped first: that rank's error says more.
_PEER_STOPPED = ("closed by peer", "connection reset by peer")


def _after_its_peers(result: dict[str, Any]) -> bool:
    """Whether a rank's run stopped only because a peer stopped first (gloo's "Connection closed by peer")."""
    runs = [result, *(result.get("switches") or ())]
    return any(
        any(words in ((run.get("error") or {}).get("message") or "").lower() for words in _PEER_STOPPED) for run in runs
    )


def _label(gap_id: str) -> str:
    return find_gap(gap_id)[1].label


def _assigned(code: str) -> set[str]:
    """Names a gap's answer makes (assignments, ``with ... as``, loop targets)."""
    try:
        tree = ast.parse("if True:\n" + "".join(f"    {line}\n" for line in code.splitlines()))
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


def _gap_of_error(stage: Stage, error: dict[str, Any], source: str | None) -> tuple[str | None, str]:
    """(the gap an error points to, or None for a line outside the gaps; what to say about it)."""
    from dlscale.lessons.stage_lines import gap_of_line

    message = error["message"]
    if error["type"] == "NotImplementedError" and message.startswith("TODO "):
        gap_id = message.split(":", 1)[0].removeprefix("TODO ")
        return gap_id, "still to write (it raises NotImplementedError)"
    if error.get("name"):  # NameError, UnboundLocalError: a name a gap should have made
        for gap_id in stage.gap_ids:
            if error["name"] in _assigned(answer_lines(gap_id)):
                return gap_id, f"`{error['name']}` is used but never made ({error['type']}: {message})"
    for words, api in _KNOWN_ERRORS:
        if words in message:
            for gap_id in stage.gap_ids:
                if api in answer_lines(gap_id):
                    return gap_id, f"{error['type']}: {message.splitlines()[0][:200]}"
    said = f"{error['type']}: {' '.join(message.split())[:240]}"
    if "timed out" in message.lower() or "timeout" in message.lower():
        said = (
            f"this rank waited in a collective that another rank never reached ({said}): every rank makes the same "
            f"collectives in the same order (a save or an all-reduce on one rank alone leaves the others waiting)"
        )
    for frame in reversed(error["frames"]):  # (the innermost line of the stage's own code first)
        gap_id = gap_of_line(stage, source, frame["line"]) if source else None
        if gap_id:
            return gap_id, f"{said} (line {frame['line']}: {frame['text']})"
    where = error["frames"][-1] if error["frames"] else None
    at = f" at line {where['line']}: {where['text']}" if where else ""
    cause = _only_change(stage, source)
    if cause:  # (a line of ours failed on what the one changed gap made)
        return cause, f"{said}{at}, a line of ours that fails on what this gap made"
    return None, said + at


def _only_change(stage: Stage, source: str | None) -> str | None:
    """The one gap whose lines differ from ours, where nothing outside the gaps does; else None."""
    from dlscale.lessons.stage_lines import differing_gaps, outside_changes

    if not source or outside_changes(stage, source):
        return None
    differing = differing_gaps(stage, source)
    return differing[0] if len(differing) == 1 else None


def _error_verdict(stage: Stage, run: dict[str, Any], source: str | None, setting: str) -> str | None:
    """How one run of the stage stopped, traced to its gap or to a line outside the gaps; None if it did not."""
    error = run.get("error")
    if not error:
        return None
    gap_id, said = _gap_of_error(stage, error, source)
    if gap_id is not None and source and not error["message"].startswith("TODO "):
        gap_id, outside = _cause(stage, source, gap_id)
        if outside:  # (a gap of ours to the letter failed on what a changed line outside the gaps made)
            return f"your stage stopped{setting}: {said}, after {outside}"
    if gap_id is None:
        return f"your stage stopped{setting} at a line outside the gaps: {said}"
    return f"{_label(gap_id)}: {said}{setting}"


def _cause(stage: Stage, source: str, gap_id: str) -> tuple[str, str | None]:
    """Where a failure in ``gap_id``'s lines comes from: that gap if the attendee changed it; else the one gap they
    changed, or the line outside the gaps they changed (then ``(gap_id, "a line outside the gaps ...")``)."""
    from dlscale.lessons.stage_lines import differing_gaps, outside_changes

    differing = differing_gaps(stage, source)
    if gap_id in differing:
        return gap_id, None
    if len(differing) == 1:
        return differing[0], None
    outside = outside_changes(stage, source)
    if not differing and outside:
        line = outside[0]
        return gap_id, f"a line outside the gaps that differs from ours, line {line.number} ({line.text.strip()[:120]})"
    return gap_id, None


def _setting(mine: dict[str, Any], run: dict[str, Any]) -> str:
    """How a brief run's settings differ from the lesson's: said after its verdict."""
    if run is mine:
        return ""
    changed = {k: v for k, v in run["arguments"].items() if (mine.get("arguments") or {}).get(k) != v}
    shown = ", ".join(f"{k}={v}" for k, v in changed.items() if k not in ("config", "checkpoint", "resume"))
    return f" (in the check's short run with {shown or 'other settings'})"


def check_gaps(stage: str, mine: dict[str, Any]) -> None:
    """How the stage stopped, then each gap's probe, on the lesson's run and on each brief run at the stage's other
    settings: an AssertionError of one line, starting ``TODO NN.x`` for the first gap found wrong (or saying the line
    outside the gaps). Each probe asks every run before the next probe asks any, so the probe that knows a mistake
    best names it. A result without what the stage did (a plain ``main()``'s) is checked by its numbers only."""
    record, source = stage_record(stage), mine.get("source")
    runs = [mine, *(mine.get("switches") or ())]
    before = [(gap, probe) for gap, probe in record.probes() if gap.id in record.judged_before_errors]
    for run in runs:
        if run.get("error"):  # (what was built wrong before the first step explains an error in the step)
            _probe_runs(record, source, mine, before, [run])
        wrong = _error_verdict(record, run, source, _setting(mine, run))
        if wrong:
            raise AssertionError(" ".join(wrong.split()))
    _probe_runs(record, source, mine, record.probes(), runs)


def _probe_runs(record: Stage, source: str | None, mine: dict[str, Any], probes: list, runs: list[dict]) -> None:
    """Each probe on every run before the next probe: an AssertionError of one line for the first finding."""
    for gap, probe in probes:
        for run in runs:
            wrong = probe(run["seen"], run.get("arguments") or {}, run) if "seen" in run else None
            if wrong:
                raise AssertionError(
                    " ".join(f"{_blamed(record, source, gap.id)}: {wrong}{_setting(mine, run)}".split())
                )


def _blamed(record: Stage, source: str | None, gap_id: str) -> str:
    """Whom a probe's finding names: its gap, unless the attendee's lines of that gap are ours to the letter (then the
    mistake is elsewhere: the one other gap whose lines differ, or else the line outside the gaps that differs)."""
    from dlscale.lessons.stage_lines import differing_gaps, outside_changes

    if not source:
        return _label(gap_id)
    differing = differing_gaps(record, source)
    if gap_id in differing:
        return _label(gap_id)
    if len(differing) == 1:
        return _label(differing[0])
    outside = outside_changes(record, source)
    if not differing and outside:
        return f"a line outside the gaps differs from ours, line {outside[0].number} ({outside[0].text[:120]})"
    return _label(gap_id)


def _where_to_look(record: Stage, source: str | None, gap_ids: tuple[str, ...]) -> str:
    """The gaps among ``gap_ids`` whose lines differ from ours (all of them where none does), or the line outside
    the gaps that differs from ours: where a difference in the numbers comes from."""
    from dlscale.lessons.stage_lines import differing_gaps, outside_changes

    if source:
        outside = outside_changes(record, source)
        if outside:
            line = outside[0]
            return f"a line outside the gaps that differs from ours: line {line.number} ({line.text[:120]})"
        differing = [gap_id for gap_id in differing_gaps(record, source) if gap_id in gap_ids]
        if differing:
            gap_ids = tuple(differing)
    return "; ".join(_label(gap_id) for gap_id in gap_ids) if gap_ids else "the lines around the gaps"


def _differs(a: float | None, b: float, tolerance: float) -> bool:
    """Whether ``a`` is off ``b`` by more than ``tolerance`` of it; NaN, infinity and None always are."""
    return a is None or not math.isfinite(a) or not abs(a - b) <= tolerance * max(1.0, abs(b))


def check_stage(stage: str, mine: dict | list[dict], twin: dict | list[dict] | None, device: str | None = None) -> None:
    """The attendee's stage (:func:`~dlscale.lessons.stage_probes.run_stage`'s result, or every rank's, rank 0 first)
    gap by gap (:func:`check_gaps`), then its losses per step and R² per epoch against ``dlscale.train`` with the
    same settings (``twin``, from :func:`~dlscale.lessons.parity.engine_twin`), within :data:`STAGE_TOLERANCE` for
    ``device`` (default: CUDA where a GPU is visible). Every failure is one line naming the gap it points to, or the
    line outside the gaps. In a notebook, a failure marks the lesson's stage unfinished: later cells that need it say so
    in one line (:mod:`~dlscale.lessons.unfinished`)."""
    from dlscale.lessons.unfinished import mark_finished, mark_unfinished

    lesson = stage_record(stage).lesson
    try:
        _check_stage(stage, mine, twin, device)
    except AssertionError as failed:
        mark_unfinished(lesson, str(failed))
        raise
    mark_finished(lesson)


def _check_stage(stage: str, mine: dict | list[dict], twin: dict | list[dict] | None, device: str | None) -> None:
    ranks = mine if isinstance(mine, list) else [mine]
    # every rank's run (a mistake can show on one rank alone); a rank that stopped because a peer did, after the others
    order = sorted(range(len(ranks)), key=lambda rank: _after_its_peers(ranks[rank]))
    for rank, result in ((rank, ranks[rank]) for rank in order):
        try:
            check_gaps(stage, result)
        except AssertionError as failed:
            raise AssertionError(f"{failed} (seen on rank {rank})" if rank else str(failed)) from None
    mine, twin = ranks[0], twin[0] if isinstance(twin, list) else twin
    record, source = stage_record(stage), mine.get("source")
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tolerance, lesson = STAGE_TOLERANCE[kind], record.lesson
    for_r2, for_update = record.by_numbers
    losses, reference = list(mine["losses"]), list(twin["losses"]) if twin else []
    assert len(losses) == len(reference), (
        f"your stage logged {len(losses)} steps, dlscale.train {len(reference)} with the same settings: check the "
        f"batch size each rank loads (the global batch over the ranks) and drop_last. Look at "
        f"{_where_to_look(record, source, for_update)}"
    )
    for step, (a, b) in enumerate(zip(losses, reference)):
        if _differs(a, b, tolerance):
            where = (
                "the first step's loss: the forward pass, the loss or the data each rank reads"
                if step == 0
                else f"step {step} (the steps before it agree): the update"
            )
            raise AssertionError(
                f"your stage's loss {a:.6f} differs from dlscale.train's {b:.6f} from {where} "
                f"(allowed on {kind}: {tolerance:g} of the loss). Look at {_where_to_look(record, source, for_update)}"
            )
    for epoch, (a, b) in enumerate(zip(mine["r2"], twin["r2"]), 1):
        assert not _differs(a, b, max(1e-3, tolerance)), (
            f"the losses agree but epoch {epoch}'s validation R² is {a if a is None else f'{a:.4f}'}, dlscale.train's "
            f"{b:.4f}: the R² (1 - squared error / variance, per target, over every rank's share). Look at "
            f"{_where_to_look(record, source, for_r2)}"
        )
    print(
        f"Lesson {lesson}'s stage passed ✓ every gap as asked, and {len(losses)} steps as dlscale.train takes them "
        f"(largest difference {max((abs(a - b) for a, b in zip(losses, reference)), default=0):.1e}), validation "
        f"R² {mine['r2'][-1]:.4f}. Ours beside yours: show_ours({lesson!r})"
    )


__all__ = ["STAGE_TOLERANCE", "check_gaps", "check_stage"]
