"""Where a line of the attendee's stage stands against ours: inside which gap, or outside every gap.

The attendee's stage is ours with the gaps' lines written by them. Lining the two up (a diff over the lines that
are code: blank lines, comments and the cell's header left out) maps every line of theirs to ours: a line in or
beside a gap's lines belongs to that gap; any other line that differs from ours is "a line outside the gaps". The
check uses it to trace an error to its gap, and to name the lines to look at when the numbers differ.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from dlscale.lessons.gaps import gap_span
from dlscale.lessons.stage_record import Stage

#: What ends a shipped stage file and not a lesson's cell: the command line.
_FOOTER = 'if __name__ == "__main__":'


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the attendee's source
    text: str


def _code(lines: list[str]) -> list[tuple[int, str]]:
    """(index, stripped text) of the lines that are code."""
    kept = []
    for index, line in enumerate(lines):
        text = line.strip()
        if text and not text.startswith(("#", "%%", "raise NotImplementedError(")):
            kept.append((index, text))
    return kept


def _without_footer(lines: list[str]) -> list[str]:
    """The lines before a file's command line (a lesson's cell has none)."""
    end = next((i for i, line in enumerate(lines) if line.startswith(_FOOTER)), len(lines))
    return lines[:end]


def _our_lines(stage: Stage) -> tuple[list[tuple[int, str]], list[str | None]]:
    """Our stage's code lines, and for each the gap it belongs to (None: outside every gap)."""
    from dlscale.lessons.recipe_folder import recipe_path

    lines = _without_footer(recipe_path(stage.file).read_text().splitlines())
    owner: list[str | None] = [None] * len(lines)
    start = 0
    for gap in stage.gaps:
        span = gap_span(lines, gap, start)
        if span is None:
            continue
        for index in range(span[0], span[1] + 1):
            owner[index] = gap.id
        start = span[1] + 1
    code = _code(lines)
    return code, [owner[index] for index, _ in code]


def _alignment(stage: Stage, source: str) -> tuple[list[tuple[int, str]], list[str | None], list]:
    ours, owners = _our_lines(stage)
    theirs = _code(_without_footer(source.splitlines()))
    matcher = difflib.SequenceMatcher(a=[t for _, t in ours], b=[t for _, t in theirs], autojunk=False)
    return theirs, owners, matcher.get_opcodes()


def _gap_near(owners: list[str | None], i1: int, i2: int) -> str | None:
    """The gap our lines [i1, i2) belong to; for an insertion (i1 == i2), the gap of a neighbouring line."""
    inside = {owners[i] for i in range(i1, i2)} - {None}
    if len(inside) == 1:
        return inside.pop()
    if i1 == i2:
        around = {owners[i] for i in (i1 - 1, i1) if 0 <= i < len(owners)} - {None}
        if len(around) == 1:
            return around.pop()
    return None


def gap_of_line(stage: Stage, source: str, number: int) -> str | None:
    """The gap that line ``number`` (1-based) of the attendee's source belongs to, or None: outside the gaps."""
    theirs, owners, opcodes = _alignment(stage, source)
    position = next((k for k, (index, _) in enumerate(theirs) if index == number - 1), None)
    if position is None:
        return None
    for tag, i1, i2, j1, j2 in opcodes:
        if j1 <= position < j2:
            if tag == "equal":
                return owners[i1 + position - j1]
            return _gap_near(owners, i1, i2)
    return None


def differing_gaps(stage: Stage, source: str) -> list[str]:
    """The gaps whose lines in the attendee's source differ from ours, in the file's order."""
    _, owners, opcodes = _alignment(stage, source)
    found = {_gap_near(owners, i1, i2) for tag, i1, i2, j1, j2 in opcodes if tag != "equal"} - {None}
    return [gap_id for gap_id in stage.gap_ids if gap_id in found]


def outside_changes(stage: Stage, source: str) -> list[Line]:
    """The attendee's lines that differ from ours outside every gap (a line of ours they removed is given as the
    line after it, or the last)."""
    theirs, owners, opcodes = _alignment(stage, source)
    lines = source.splitlines()
    found = []
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal" or _gap_near(owners, i1, i2) is not None:
            continue
        if j2 > j1:
            found += [Line(theirs[k][0] + 1, theirs[k][1]) for k in range(j1, j2)]
        elif theirs:
            index = theirs[min(j1, len(theirs) - 1)][0]
            found.append(Line(index + 1, lines[index].strip()))
    return found
