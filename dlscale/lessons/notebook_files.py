"""What ``dlscale recipes`` and ``dlscale exercises`` read and write: notebooks read checked, files written whole.

A notebook is read as Jupyter's format has it (JSON, a list of cells, each with a ``cell_type`` and a ``source``);
anything else is a :class:`NotebookError` naming the file and the cell, not a ``KeyError`` deep in a generator. A
generated file is written whole or not at all, and never through a link (:func:`write_generated`): a link in
``recipes/`` or ``exercises/`` to a file elsewhere is replaced by the generated file, and that file is left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlscale.errors import DlscaleError


class NotebookError(DlscaleError, ValueError):
    """A notebook that is not one (not JSON, no cells, a cell without its source), or a generated file that could not
    be written; the message names it."""


def read_notebook(path: Path) -> dict[str, Any]:
    """The notebook at ``path`` as a mapping, its cells checked (:func:`cell_problem`)."""
    fix = f"restore it (git checkout -- {path}) or save it again from Jupyter"
    try:
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise NotebookError(f"{path} is not a notebook: it is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as err:
        raise NotebookError(f"{path} is not a notebook: it is not valid JSON ({err}); {fix}") from None
    except RecursionError:  # (json's parser recurses once per level: thousands of nested brackets)
        raise NotebookError(f"{path} is not a notebook: its JSON nests thousands of levels deep; {fix}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise NotebookError(f"{path} is not a notebook: it has no list of cells; {fix}")
    for index, cell in enumerate(notebook["cells"]):
        problem = cell_problem(cell)
        if problem:
            raise NotebookError(f"{path}, cell {index}: {problem}; {fix}")
    return notebook


def cell_problem(cell: Any) -> str | None:
    """What makes ``cell`` unreadable by the generators (no ``cell_type``, no ``source``, metadata that is no
    mapping, tags that are no list of words), or None."""
    if not isinstance(cell, dict):
        return "a cell must be a JSON object"
    if not isinstance(cell.get("cell_type"), str):
        return "the cell has no cell_type"
    source = cell.get("source")
    if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))):
        return "the cell has no source (its text, or a list of its lines)"
    metadata = cell.get("metadata", {})
    if not isinstance(metadata, dict):
        return "the cell's metadata is not a JSON object"
    tags = metadata.get("tags", [])
    if not (isinstance(tags, list) and all(isinstance(tag, str) for tag in tags)):
        return "the cell's tags are not a list of words"
    return None


def up_to_date(path: Path, text: str) -> bool:
    """Whether ``path`` is a plain file (not a link) that already holds ``text``. A link is never read through."""
    return path.is_file() and not path.is_symlink() and path.read_bytes() == text.encode("utf-8")


def write_generated(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole, replacing a link there rather than writing through it; a write that fails
    leaves the file there as it was and says which folder, in one line."""
    from dlscale.checkpoint.store import disk_full, replace_synced

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_synced(path, lambda handle: handle.write(text.encode("utf-8")))
    except OSError as err:
        folder = path.absolute().parent
        why = (
            f"{folder} is on a full disk or over its quota; free space there"
            if disk_full(err)
            else f"{folder} cannot be written ({err.strerror or err}); check that you may write there"
        )
        raise NotebookError(f"{path} was not written: {why} (the file there is unchanged)") from None
