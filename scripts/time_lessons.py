"""Time each lesson as an attendee runs it, for its parameters cell's runtime note and docs/benchmarks.md.

    .venv/bin/python scripts/time_lessons.py [LESSON.ipynb ...]      (from the repository root; default: all)

Each lesson runs headless from notebooks/ (so it writes under runs/), with its own parameters and its attendee
cells filled with the answers. One line of JSON per lesson: its seconds, any cell that raised, and every cell
that ran over 10 s with what it showed meanwhile (a widget bar, a text bar, or lines): a long cell that shows
nothing looks stuck to an attendee. Run it on a quiet machine: the figures are what other work leaves.
"""

import json
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.notebooks import errors, execute  # noqa: E402  (the tests' way of running a lesson)


def seconds(cell) -> float:
    """How long a cell ran, from nbclient's timestamps."""
    stamps = cell.metadata.get("execution", {})
    began, ended = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    if not (began and ended):
        return 0.0
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(ended) - parse(began)).total_seconds()


def shown(cell) -> list[str]:
    """What a cell showed while it ran: a widget (tqdm in Jupyter), a text bar, lines."""
    kinds = set()
    for output in cell.get("outputs", []):
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
            kinds.add("widget")
        if output.get("output_type") == "stream":
            kinds.add("bar" if "it/s]" in output.get("text", "") or "%|" in output.get("text", "") else "lines")
    return sorted(kinds)


def main(names: list[str]) -> None:
    for name in names or sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb")):
        start = time.time()
        notebook = execute(ROOT / "notebooks" / name, ROOT / "notebooks", allow_errors=True, timeout=900)
        slow = [
            (index, round(seconds(cell)), shown(cell), cell.source.splitlines()[0][:60])
            for index, cell in enumerate(notebook.cells)
            if cell.cell_type == "code" and seconds(cell) > 10
        ]
        print(
            json.dumps(
                {"lesson": name, "seconds": round(time.time() - start, 1), "errors": errors(notebook), "slow": slow},
                ensure_ascii=False,
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
