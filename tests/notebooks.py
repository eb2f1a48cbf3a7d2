"""Execute a notebook headless with papermill-style parameters, the way the tests and CI do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import papermill
from nbclient import NotebookClient

#: What a marked stage adds after its own code: its main returns a "mark" beside its results, so that a test finds
#: the mark in what a lesson measured only if the lesson measured that stage (the attendee's, not dlscale.train).
MARK = """

import functools as _marking


def _marked(stage_main):
    @_marking.wraps(stage_main)
    def main(*args, **kwargs):
        return {**stage_main(*args, **kwargs), "mark": %r}
    return main


main = _marked(main)
"""


#: Printed after a marked lesson's last measurement: the mark of every stage run its measurements used.
READ_MARKS = """
import json as _json
from dlscale.lessons.stage_measure import MEASURED as _MEASURED
_runs = list(_MEASURED) + [globals()[_name] for _name in ("resumed", "straight") if _name in globals()]
print("MARKS " + _json.dumps([_run.get("mark") for _run in _runs]))
"""


def measured_marks(notebook: nbformat.NotebookNode) -> list | None:
    """The marks :data:`READ_MARKS` printed (None: the lesson was not marked)."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("text", "").startswith("MARKS "):
                return json.loads(output["text"].split("MARKS ", 1)[1].splitlines()[0])
    return None


def is_stage_cell(cell) -> bool:
    """The cell in which the attendee writes the lesson's stage of the recipe."""
    return "attendee" in cell.metadata.get("tags", []) and "recipe" in cell.metadata


def stage_source_with_gaps(cell) -> str:
    """A stage cell's source as the lesson ships it: every gap a TODO (the stage the attendee starts from)."""
    from dlscale.lessons.exercises import stage_source

    return stage_source(cell.metadata["recipe"], gaps=True, writes=cell.metadata.get("writes"))


def with_parameters(
    path: Path,
    parameters: dict | None = None,
    kernel_name: str | None = None,
    answers: bool = True,
    mark: str | None = None,
) -> nbformat.NotebookNode:
    """``path`` with ``parameters`` injected after the cell tagged ``parameters`` (papermill's convention).

    A lesson's attendee cells hold their exercises' answers (from ``solutions/``), as an attendee who
    has done the work runs it, unless ``answers`` is false: the lesson as shipped, with the stubs.
    """
    notebook = papermill.execute_notebook(
        str(path), None, parameters=parameters or {}, prepare_only=True, kernel_name=kernel_name, progress_bar=False
    )
    solution = Path(path).parent.parent / "solutions" / Path(path).name
    if answers and Path(path).parent.name == "notebooks" and solution.is_file():
        from dlscale.lessons.exercises import with_answers

        filled = with_answers(json.loads(json.dumps(notebook)), json.loads(solution.read_text()), Path(path).name)
        for cell, source in zip(notebook.cells, filled["cells"]):
            cell.source = "".join(source["source"])
    if mark is not None and any(is_stage_cell(cell) for cell in notebook.cells):
        for cell in notebook.cells:  # (after the stage's own code, in the cell and in the file %%writefile writes)
            if is_stage_cell(cell):
                cell.source = cell.source.rstrip("\n") + "\n" + MARK % mark
        measuring = [
            i for i, cell in enumerate(notebook.cells) if {"measure", "stage-run"} & set(cell.metadata.get("tags", []))
        ]
        if measuring:
            notebook.cells.insert(measuring[-1] + 1, nbformat.v4.new_code_cell(READ_MARKS))
    return notebook


def until_first_check(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook's cells up to its first check cell that follows an attendee cell (the rest costs time and
    depends on it)."""
    tags = [cell.metadata.get("tags", []) for cell in notebook.cells]
    first_attendee = next(i for i, t in enumerate(tags) if "attendee" in t)
    end = next(i for i, t in enumerate(tags) if i > first_attendee and "check" in t)
    notebook.cells = notebook.cells[: end + 1]
    return notebook


def execute(
    path: Path,
    cwd: Path,
    parameters: dict | None = None,
    allow_errors: bool = False,
    timeout: int = 1500,
    answers: bool = True,
    to_first_check: bool = False,
    keep: Callable | None = None,
    mark: str | None = None,
    extra_cells: tuple[str, ...] = (),
    then: list[nbformat.NotebookNode] | None = None,
    kernel: Any = None,
) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel started in ``cwd`` and return the executed notebook.

    ``parameters`` are injected after the cell tagged ``parameters`` (papermill's convention).
    With ``allow_errors`` a failing cell records its error and execution goes on. ``then``: cells run after the
    notebook's own in the same kernel, their tags kept (a lesson's exercises, from its solution notebook).
    ``kernel``: a running kernel's manager (:func:`shared_kernel`) to run in instead of a fresh kernel: a first cell
    empties its namespace and moves it to ``cwd``.
    """
    # papermill only injects the parameters here (prepare_only); nbclient executes, so that
    # allow_errors can record every failing cell instead of stopping at the first one
    notebook = with_parameters(path, parameters, kernel_name="python3", answers=answers, mark=mark)
    if to_first_check:
        notebook = until_first_check(notebook)
    if keep is not None:  # only the cells a test needs (markdown cells stay: they cost nothing)
        notebook.cells = [cell for cell in notebook.cells if cell.cell_type != "code" or keep(cell)]
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in extra_cells]
    notebook.cells += then or []
    if kernel is not None:
        # (an earlier notebook's unfinished stage would turn this one's errors into one line: a fresh kernel has none)
        start = f"%reset -f\nimport os\nos.chdir({str(cwd)!r})\n"
        start += "from dlscale.lessons.unfinished import forget_unfinished\nforget_unfinished()"
        notebook.cells.insert(0, nbformat.v4.new_code_cell(start))
    client = NotebookClient(
        notebook,
        km=kernel,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return notebook


def shared_kernel(cwd: Path) -> Any:
    """A started kernel's manager, for notebooks that stop at their first checks: several of them run in one kernel
    (:func:`execute`'s ``kernel``), each in an empty namespace, instead of each paying a kernel's start and the kit's
    imports (seconds of CPU each). Shut it down with ``shutdown_kernel(now=True)``."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(cwd))
    return manager


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


#: The mark a test gives the attendee's stage (with_parameters' ``mark``).
STAGE_MARK = "marked-stage-7f3a"


def assert_measured_on_the_stage(notebook: nbformat.NotebookNode, name: str) -> None:
    """A lesson run with a marked stage (:data:`STAGE_MARK`) measured that stage: every run its measurements used
    carries the mark (a lesson that measured dlscale.train or our recipe file would show none), its tables say
    "your stage", and it asked the attendee's reading of them."""
    marks = measured_marks(notebook)
    assert marks and all(mark == STAGE_MARK for mark in marks), (name, marks)
    text = "\n".join(output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", []))
    if not name.startswith("10"):  # (lesson 10 reads your DCP folder and your resumed and tensor-parallel runs)
        assert "your stage, " in text and "our stage (use_ours)" not in text, name
    assert "You left your conclusion empty" in text, name
