"""An unfinished stage stops its lesson once: after its check fails, a later cell that fails says so in one line.

When a lesson's stage check fails in a notebook, the cells after it read what the stage should have produced (its
numbers, its measurements) and would each fail in their own way (``NameError: name 'r2' is not defined``). While
the stage is unfinished, an error in such a cell is shown as one line: the stage is not done yet, and how to carry
on. Cells that write, run or check a stage keep their full tracebacks: they are where the attendee works. The mark
goes when the check passes, or with ``use_ours``. Outside IPython nothing changes.
"""

from __future__ import annotations

from typing import Any

#: The lessons whose stage check failed last, with the first line of what it said.
_UNFINISHED: dict[str, str] = {}
#: Words in a cell that make it a stage's own cell: its traceback is the attendee's to read.
_STAGE_CELLS = ("def main(", "%%writefile", "run_stage(", "check_stage(", "check_gaps(", "run_on_engines(")


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _one_line(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> Any:
    cell = str(shell.user_ns.get("_ih", [""])[-1] if shell.user_ns.get("_ih") else "")
    if not _UNFINISHED or any(words in cell for words in _STAGE_CELLS):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    lesson, said = next(reversed(_UNFINISHED.items()))
    print(
        f"Lesson {lesson}'s stage is not done yet ({said}): this cell needs it. Finish the stage and run its check "
        f'again, or carry on with our stage: use_ours("{lesson}")'
    )
    return None


def mark_unfinished(lesson: str, said: str) -> None:
    """Note that ``lesson``'s stage check failed (``said``: its verdict); in IPython, later failing cells say so."""
    shell = _shell()
    if shell is None:
        return
    _UNFINISHED[lesson] = said.split(":", 1)[0][:80]
    shell.set_custom_exc((Exception,), _one_line)


def mark_finished(lesson: str) -> None:
    """``lesson``'s stage passed its check, or our stage stands in: later errors show as they are."""
    _UNFINISHED.pop(lesson[:2], None)
    shell = _shell()
    if shell is not None and not _UNFINISHED:
        shell.set_custom_exc((), None)


def forget_unfinished() -> None:
    """Forget every lesson's mark, as a fresh kernel would (for a kernel that runs one notebook after another)."""
    for lesson in list(_UNFINISHED):
        mark_finished(lesson)
