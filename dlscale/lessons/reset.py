"""Starting a lesson over: its runs removed, nothing else.

A lesson writes under ``runs/`` in folders named for it (``runs/lesson05``, ``runs/lesson05_engine_twin``); the
attendee's own stage file there (``my_*.py``, which the lesson's cell writes) is kept, and no other folder is
touched, whatever it holds.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from dlscale.errors import DlscaleError


class ResetError(DlscaleError):
    """A lesson that has no number like 05."""


def lesson_runs(lesson: str, runs: str | Path = "runs") -> list[Path]:
    """The folders of ``runs`` that lesson ``lesson`` (``"05"``) writes: ``lesson05`` and ``lesson05_*``."""
    if not re.fullmatch(r"\d\d", lesson):
        raise ResetError(f"a lesson is named by its two digits (05 for 05_data_parallel.ipynb), not {lesson!r}")
    folder = Path(runs)
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.is_dir()
        and not path.is_symlink()
        and (path.name == f"lesson{lesson}" or path.name.startswith(f"lesson{lesson}_"))
    )


def reset_lesson(lesson: str, runs: str | Path = "runs") -> list[Path]:
    """Remove lesson ``lesson``'s runs (:func:`lesson_runs`), keeping the attendee's stage files (``my_*.py``);
    return what was removed."""
    removed = []
    for folder in lesson_runs(lesson, runs):
        kept = list(folder.glob("my_*.py"))
        if not kept:
            shutil.rmtree(folder)
            removed.append(folder)
            continue
        for entry in folder.iterdir():
            if entry in kept:
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed.append(entry)
    return removed
