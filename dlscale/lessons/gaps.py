"""The gaps' text in the shipped stages, and the hints that help with one gap a step at a time.

Each gap is part of its stage's record (:mod:`dlscale.lessons.stages`); this module finds a gap's lines in the
shipped stage (``recipes/NN_*.py``) and gives the hints: :func:`hint` first asks a question about the behaviour the
gap must produce, a second call names the API, a third shows our lines.
"""

from __future__ import annotations

import ast
import re

from dlscale.lessons.stage_record import Gap
from dlscale.lessons.stages import find_gap, stage_record


def gap_ids(stage: str) -> list[str]:
    """``["05.a", "05.b", ...]`` for a stage (``"05_ddp.py"`` or ``"05"``), in the order of its file."""
    return stage_record(stage).gap_ids


def gap_span(lines: list[str], gap: Gap, start: int = 0) -> tuple[int, int] | None:
    """(first, last) line index of ``gap`` in ``lines`` at or after ``start``, or None."""
    begin = next((i for i in range(start, len(lines)) if gap.first in lines[i]), None)
    if begin is None:
        return None
    end = next((i for i in range(begin, len(lines)) if gap.last in lines[i]), None)
    return None if end is None else (begin, end)


def answer_lines(gap_id: str) -> str:
    """Our lines for a gap, as the shipped stage has them (its comments included)."""
    from dlscale.lessons.recipe_folder import recipe_path

    stage, _ = find_gap(gap_id)
    lines, start = recipe_path(stage.file).read_text().splitlines(), 0
    for gap in stage.gaps:
        span = gap_span(lines, gap, start)
        assert span is not None, f"recipes/{stage.file} lost gap {gap.id}"
        if gap.id == gap_id:
            block = lines[span[0] : span[1] + 1]
            indent = min(len(line) - len(line.lstrip()) for line in block if line.strip())
            return "\n".join(line[indent:] for line in block)
        start = span[1] + 1
    raise KeyError(gap_id)


_HINTS_GIVEN: dict[str, int] = {}


def hint(gap_id: str) -> None:
    """Help with one gap, one step at a time: the first call asks a question about the behaviour the gap must
    produce, the second names the API that does it, the third (and later) shows our lines."""
    _, gap = find_gap(gap_id)
    given = _HINTS_GIVEN[gap_id] = _HINTS_GIVEN.get(gap_id, 0) + 1
    if given == 1:
        print(f"TODO {gap_id}: {gap.asks}\nAsk yourself: {gap.question}\n(hint({gap_id!r}) again names the API)")
    elif given == 2:
        print(f"TODO {gap_id}, the API: {gap.api}\n(hint({gap_id!r}) a third time shows our lines)")
    else:
        print(f"TODO {gap_id}, our lines:\n{answer_lines(gap_id)}")


def api_names(code: str) -> set[str]:
    """The API names a piece of code calls that give an answer away: classes (CamelCase), functions with an
    underscore (``set_epoch``, ``clip_grad_norm_``), and ``compile`` and ``autocast``."""
    try:
        tree = ast.parse("if True:\n" + "".join(f"    {line}\n" for line in code.splitlines()))
    except SyntaxError:  # (a gap's lines cut from a longer statement)
        called = set(re.findall(r"(\w+)\(", code))
    else:
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
        }
    return {
        name
        for name in called
        if "_" in name.strip("_") or re.match(r"[A-Z][a-z]+[A-Z]", name) or name in ("compile", "autocast")
    }
