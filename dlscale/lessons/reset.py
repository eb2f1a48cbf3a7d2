"""Starting a lesson over: its runs removed, nothing else.

A lesson writes under ``runs/`` in folders named for it (``runs/lesson05``, ``runs/lesson05_engine_twin``); the
attendee's own files there (``my_*``: the stage ``my_05_ddp.py`` the lesson's cell writes, or one they put in a
subfolder) are kept wherever they are, with the folders that hold them, and no other folder is touched, whatever it
holds.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dlscale.errors import DlscaleError

#: How the attendee's own files and folders are named: a reset keeps each of them.
MINE = "my_"


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


def _holds_theirs(folder: Path) -> bool:
    """Whether ``folder`` holds an attendee's file at any depth (links to folders are not followed)."""
    return any(name.startswith(MINE) for _, dirs, files in os.walk(folder) for name in (*dirs, *files))


def _remove(entry: Path) -> None:
    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def _clear(folder: Path, removed: list[Path]) -> None:
    """Remove what ``folder`` holds but the attendee's files and the folders on the way to them."""
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(MINE):
            continue
        if entry.is_dir() and not entry.is_symlink() and _holds_theirs(entry):
            _clear(entry, removed)
            continue
        _remove(entry)
        removed.append(entry)


def reset_lesson(lesson: str, runs: str | Path = "runs") -> list[Path]:
    """Remove lesson ``lesson``'s runs (:func:`lesson_runs`), keeping the attendee's files (``my_*``, wherever they
    are in a run folder, and the folders that hold them); return what was removed."""
    removed: list[Path] = []
    for folder in lesson_runs(lesson, runs):
        if _holds_theirs(folder):
            _clear(folder, removed)
        else:
            shutil.rmtree(folder)
            removed.append(folder)
    return removed
