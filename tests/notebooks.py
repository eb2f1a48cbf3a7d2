"""Execute a notebook headless with papermill-style parameters, the way the tests and CI do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import nbformat
import papermill
from nbclient import NotebookClient


def with_parameters(path: Path, parameters: dict | None = None, kernel_name: str | None = None,
                    answers: bool = True) -> nbformat.NotebookNode:
    """``path`` with ``parameters`` injected after the cell tagged ``parameters`` (papermill's convention).

    A lesson's attendee cells hold their exercises' answers (from ``solutions/``), as an attendee who
    has done the work runs it, unless ``answers`` is false: the lesson as shipped, with the stubs.
    """
    notebook = papermill.execute_notebook(str(path), None, parameters=parameters or {}, prepare_only=True,
                                          kernel_name=kernel_name, progress_bar=False)
    solution = Path(path).parent.parent / "solutions" / Path(path).name
    if answers and Path(path).parent.name == "notebooks" and solution.is_file():
        from dlscale.lessons.exercises import with_answers

        filled = with_answers(json.loads(json.dumps(notebook)), json.loads(solution.read_text()), Path(path).name)
        for cell, source in zip(notebook.cells, filled["cells"]):
            cell.source = "".join(source["source"])
    return notebook


def until_first_check(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook's cells up to its first check cell that follows an attendee cell (the rest costs time and
    depends on it)."""
    tags = [cell.metadata.get("tags", []) for cell in notebook.cells]
    first_attendee = next(i for i, t in enumerate(tags) if "attendee" in t)
    end = next(i for i, t in enumerate(tags) if i > first_attendee and "check" in t)
    notebook.cells = notebook.cells[:end + 1]
    return notebook


def execute(path: Path, cwd: Path, parameters: dict | None = None, allow_errors: bool = False,
            timeout: int = 1500, answers: bool = True, to_first_check: bool = False,
            keep: Callable | None = None) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel started in ``cwd`` and return the executed notebook.

    ``parameters`` are injected after the cell tagged ``parameters`` (papermill's convention).
    With ``allow_errors`` a failing cell records its error and execution goes on.
    """
    # papermill only injects the parameters here (prepare_only); nbclient executes, so that
    # allow_errors can record every failing cell instead of stopping at the first one
    notebook = with_parameters(path, parameters, kernel_name="python3", answers=answers)
    if to_first_check:
        notebook = until_first_check(notebook)
    if keep is not None:  # only the cells a test needs (markdown cells stay: they cost nothing)
        notebook.cells = [cell for cell in notebook.cells if cell.cell_type != "code" or keep(cell)]
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return notebook


def errors(notebook: nbformat.NotebookNode) -> list[tuple[int, str, str]]:
    """(cell index, exception name, message) for each cell that raised."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append((index, output["ename"], output["evalue"]))
    return found


def has_image(cell) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.get("outputs", []))
