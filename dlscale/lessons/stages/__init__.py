"""Every lesson's stage record, one module per lesson (``lesson05.py`` holds ``STAGE``, stage 05's gaps and probes).

Adding a lesson's stage is adding a module here that defines ``STAGE`` (:class:`~dlscale.lessons.stage_record.Stage`):
the registry finds it by name. Everything else (the gapped stage, the hints, the check, ``use_ours``, the docs'
table) reads the record.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from dlscale.lessons.stage_record import Gap, Stage


@cache
def all_stages() -> dict[str, Stage]:
    """``{"01": Stage, ...}``: every module ``lessonNN`` of this package, in lesson order."""
    found = {}
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name.startswith("lesson")):
        stage = importlib.import_module(f"{__name__}.{module}").STAGE
        found[stage.lesson] = stage
    return found


def stage_record(name: str) -> Stage:
    """The record of a stage by its lesson (``"05"``), its file (``"05_ddp.py"``) or a gap of it (``"05.c"``); a
    ``KeyError`` naming the lessons with a stage for another name."""
    stages = all_stages()
    if name[:2] in stages and (name[2:3] in ("", ".", "_")):
        return stages[name[:2]]
    raise KeyError(f"no stage {name!r}: the lessons with a stage are {', '.join(stages)}")


def find_gap(gap_id: str) -> tuple[Stage, Gap]:
    """(the stage, the gap) of ``"05.c"``; a ``KeyError`` naming every gap for another id."""
    try:
        stage = stage_record(gap_id)
        return stage, stage.gap(gap_id)
    except KeyError:
        every = ", ".join(g for stage in all_stages().values() for g in stage.gap_ids)
        raise KeyError(f"no gap {gap_id!r}: the gaps are {every}") from None


__all__ = ["all_stages", "find_gap", "stage_record"]
