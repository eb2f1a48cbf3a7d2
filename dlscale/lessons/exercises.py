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

Outputs and execution counts are stripped from what it writes. ``dlscale exercises``
regenerates ``exercises/``; ``dlscale exercises --check`` fails if it is out of date.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dlscale.errors import DlscaleError

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


def generate(solutions: str | Path = "solutions", exercises: str | Path = "exercises",
             check: bool = False) -> list[Path]:
    """Write (or with ``check``, compare) the exercise of every solution notebook.

    Returns the exercise paths that were written, or that differ when ``check`` is set.
    """
    solutions, exercises = Path(solutions), Path(exercises)
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        raise ExerciseError(f"no solution notebooks in {solutions}")
    changed = []
    for path in sources:
        text = render(exercise_notebook(json.loads(path.read_text()), path.name))
        target = exercises / path.name
        if target.is_file() and target.read_text() == text:
            continue
        changed.append(target)
        if not check:
            exercises.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return changed
