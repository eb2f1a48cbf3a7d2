"""Exercises are generated from the solutions, never edited by hand.

In a solution notebook each answer is fenced in a code cell::

    # BEGIN SOLUTION Exercise 01.2: compute R² per target
    ...the answer...
    # END SOLUTION

and :func:`generate` writes the exercise notebook with each fence replaced by a stub
that keeps the indentation and the hint::

    # TODO Exercise 01.2: compute R² per target
    raise NotImplementedError("Exercise 01.2: compute R² per target")

A markdown cell tagged ``answer`` holds a model answer to a question the learner answers in words
(what an experiment showed, and why); the exercise gets an empty answer cell in its place.

A lesson's own hands-on cell (tagged ``attendee``, with ``"exercise": "05.3"`` in its metadata) is
the stub of that exercise's solution cell: :func:`generate` writes it too, so the lesson, the
exercise and the solution never drift apart, and :func:`with_answers` gives the lesson with the
answers filled in, as the tests run it.

Outputs and execution counts are stripped from what it writes. ``dlscale exercises``
regenerates ``exercises/`` and the lessons' attendee cells; ``dlscale exercises --check`` fails if
either is out of date.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dlscale.errors import DlscaleError
from dlscale.lessons.notebook_files import read_notebook, up_to_date, write_generated

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?:\s+(?P<hint>.*\S))?\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")


#: What an answer cell of a solution becomes in the exercise.
YOUR_ANSWER = "**Your answer** (double-click to write it): what did you see, and why?"


class ExerciseError(DlscaleError):
    """A solution notebook's fences are malformed; the message names the notebook and cell."""


def strip_solutions(source: str, where: str = "cell") -> str:
    """Replace every fenced answer in ``source`` by its stub."""
    out, inside = [], None
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ExerciseError(f"{where}, line {number}: BEGIN SOLUTION inside another fence")
            hint = begin["hint"] or "fill in this part"
            label = hint if hint.startswith("Exercise") else f"Exercise: {hint}"
            out.append(f"{begin['indent']}# TODO {label}\n")
            out.append(f"{begin['indent']}raise NotImplementedError({json.dumps(label, ensure_ascii=False)})\n")
            inside = number
        elif END.match(line):
            if not inside:
                raise ExerciseError(f"{where}, line {number}: END SOLUTION without BEGIN SOLUTION")
            inside = None
        elif not inside:
            out.append(line)
    if inside:
        raise ExerciseError(f"{where}, line {inside}: BEGIN SOLUTION is never closed by END SOLUTION")
    return "".join(out)


def answer(source: str) -> str:
    """``source`` with its fences' own lines removed: the answers in place."""
    return "".join(line for line in source.splitlines(keepends=True) if not (BEGIN.match(line) or END.match(line)))


def _solution_cell(solution: dict, exercise: str, where: str) -> str:
    """The source of the solution cell whose fences answer Exercise ``exercise`` (e.g. "05.3")."""
    for cell in solution["cells"]:
        text = _source(cell)
        if cell["cell_type"] == "code" and any(
            (m := BEGIN.match(line)) and (m["hint"] or "").startswith(f"Exercise {exercise}:")
            for line in text.splitlines()
        ):
            return text
    raise ExerciseError(f"{where}: no solution cell answers Exercise {exercise}")


def _attendee_cells(lesson: dict) -> list[tuple[int, str]]:
    return [
        (index, cell["metadata"]["exercise"])
        for index, cell in enumerate(lesson["cells"])
        if "attendee" in cell.get("metadata", {}).get("tags", []) and "exercise" in cell["metadata"]
    ]


def _stage_cells(lesson: dict) -> list[tuple[int, dict]]:
    """(index, metadata) of the cells in which the attendee writes the lesson's stage of the recipe:
    ``{"recipe": "05_ddp.py"}``, and ``"writes": "{my_stage}"`` where the cell writes it to a file (for ranks)."""
    return [
        (index, cell["metadata"])
        for index, cell in enumerate(lesson["cells"])
        if "attendee" in cell.get("metadata", {}).get("tags", []) and "recipe" in cell["metadata"]
    ]


#: The first line of a stage the attendee writes (the rest is the stage with its gaps, or filled in).
STAGE_HEADER = "# recipes/{name}, with the lines lesson {lesson} adds left for you: fill in each TODO\n"


def stage_source(name: str, gaps: bool, writes: str | None = None) -> str:
    """The cell in which the attendee writes stage ``name``: its recipe file (less the command line) with the
    lesson's lines cut out (``gaps``), or whole, as the tests and the solution run it; with ``writes``, a cell
    that writes it to that file (``%%writefile``) for ranks to run."""
    from dlscale.lessons.recipe_folder import recipe_path
    from dlscale.lessons.recipes import SCRIPT_FOOTER, gapped_recipe

    body = recipe_path(name).read_text().removesuffix(SCRIPT_FOOTER).split("\n", 1)[1]
    magic = f"%%writefile {writes}\n" if writes else ""
    # (a stage written to a file keeps its command line: the lesson runs that file under torchrun too)
    footer = SCRIPT_FOOTER.rstrip("\n") if writes else ""
    return (
        magic + STAGE_HEADER.format(name=name, lesson=name[:2]) + (gapped_recipe(name, body) if gaps else body) + footer
    )


def _with_sources(lesson: dict, solution: dict, transform, name: str, gaps: bool) -> dict:
    notebook = json.loads(json.dumps(lesson))
    for index, exercise in _attendee_cells(notebook):
        text = transform(_solution_cell(solution, exercise, f"{name}, cell {index}"))
        notebook["cells"][index]["source"] = text.rstrip("\n").splitlines(keepends=True)
    for index, meta in _stage_cells(notebook):
        text = stage_source(meta["recipe"], gaps, meta.get("writes"))
        notebook["cells"][index]["source"] = text.rstrip("\n").splitlines(keepends=True)
    return notebook


def lesson_notebook(lesson: dict, solution: dict, name: str = "lesson") -> dict:
    """A lesson whose attendee cells are the stubs of their exercises' solutions, and its stage with gaps."""
    return _with_sources(lesson, solution, lambda text: strip_solutions(text, name), name, gaps=True)


def with_answers(lesson: dict, solution: dict, name: str = "lesson") -> dict:
    """A lesson whose attendee cells hold their exercises' answers and the whole stage (as the tests run it)."""
    return _with_sources(lesson, solution, answer, name, gaps=False)


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def exercise_notebook(solution: dict, name: str = "notebook") -> dict:
    """The exercise version of a solution notebook (a parsed .ipynb mapping)."""
    notebook = json.loads(json.dumps(solution))
    for index, cell in enumerate(notebook["cells"]):
        if "answer" in cell.get("metadata", {}).get("tags", []):
            cell["source"] = [YOUR_ANSWER]
            continue
        if cell["cell_type"] != "code":
            continue
        text = strip_solutions(_source(cell), f"{name}, cell {index}")
        cell["source"] = text.splitlines(keepends=True)
        cell["outputs"], cell["execution_count"] = [], None
    return notebook


def render(notebook: dict) -> str:
    """Notebook JSON the way Jupyter writes it (one-space indent, trailing newline)."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def generate(
    solutions: str | Path = "solutions",
    exercises: str | Path = "exercises",
    check: bool = False,
    lessons: str | Path | None = None,
) -> list[Path]:
    """Write (or with ``check``, compare) the exercise of every solution notebook, and the attendee cells of
    the lessons in ``lessons`` (None: leave the lessons alone).

    Returns the paths that were written, or that differ when ``check`` is set.
    """
    solutions, exercises = Path(solutions), Path(exercises)
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        raise ExerciseError(f"no solution notebooks in {solutions}")
    outputs = [(exercises / path.name, render(exercise_notebook(read_notebook(path), path.name))) for path in sources]
    for path in sorted(Path(lessons).glob("*.ipynb")) if lessons is not None else []:
        lesson = read_notebook(path)
        if _attendee_cells(lesson) or _stage_cells(lesson):
            if not (solutions / path.name).is_file():
                raise ExerciseError(f"{path}: its attendee cells need {solutions / path.name}")
            filled = lesson_notebook(lesson, read_notebook(solutions / path.name), path.name)
            outputs.append((path, json.dumps(filled, indent=1, ensure_ascii=False) + "\n"))
    changed = []
    for target, text in outputs:
        if up_to_date(target, text):  # (a link is out of date: it is replaced, never written through)
            continue
        changed.append(target)
        if not check:
            write_generated(target, text)
    return changed
