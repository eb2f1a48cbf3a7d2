"""Execute a notebook headless with papermill-style parameters, the way the tests and CI do."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
from nbclient import NotebookClient


def with_parameters(path: Path, parameters: dict | None = None, kernel_name: str | None = None) -> nbformat.NotebookNode:
    """``path`` with ``parameters`` injected after the cell tagged ``parameters`` (papermill's convention)."""
    return papermill.execute_notebook(str(path), None, parameters=parameters or {}, prepare_only=True,
                                      kernel_name=kernel_name, progress_bar=False)


def execute(path: Path, cwd: Path, parameters: dict | None = None, allow_errors: bool = False,
            timeout: int = 1500) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel started in ``cwd`` and return the executed notebook.

    ``parameters`` are injected after the cell tagged ``parameters`` (papermill's convention).
    With ``allow_errors`` a failing cell records its error and execution goes on.
    """
    # papermill only injects the parameters here (prepare_only); nbclient executes, so that
    # allow_errors can record every failing cell instead of stopping at the first one
    notebook = with_parameters(path, parameters, kernel_name="python3")
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
