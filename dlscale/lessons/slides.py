"""The instructor's slides, from the lessons themselves: each lesson's talk as a reveal.js deck (``make slides``).

The talk is the lesson's prose: each heading starts a slide, the paragraphs under it follow on that slide, and the
code is left to the attendees' screens. A code cell tagged ``talk`` is a picture worth talking over (fp16's range
and its underflow, the all-reduce's bandwidth, the LR schedules): with ``run`` its output is made for the deck, the
cell run with the lesson's parameters in a kernel of its own. So the instructor talks from what the attendees run,
and a change to a lesson changes its deck.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def talk(notebook: dict) -> dict:
    """``notebook`` with reveal.js's slide types set: a heading starts a slide, its text follows, code is skipped."""
    deck = json.loads(json.dumps(notebook))
    for cell in deck["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "markdown":
            kind = "slide" if source.lstrip().startswith("#") else "-"
        else:
            kind = "-" if "talk" in tags else "skip"
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
    return deck


def _is_setup(cell: dict) -> bool:
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    tags = cell.get("metadata", {}).get("tags", [])
    return cell["cell_type"] == "code" and ("parameters" in tags or "talk" in tags or "os.chdir(" in source)


def run_talk(deck, folder: str | Path, timeout: int = 600) -> int:
    """Run a deck's ``talk`` cells (after its parameters and its working-folder cell) in a fresh kernel started in
    ``folder``, their outputs kept in the deck; returns how many ran."""
    import nbformat
    from nbclient import NotebookClient

    cells = [cell for cell in deck.cells if _is_setup(cell)]
    if not any("talk" in cell.metadata.get("tags", []) for cell in cells):
        return 0
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=deck.metadata)
    NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()  # (the cells are the deck's: outputs stay)
    return sum("talk" in cell.metadata.get("tags", []) for cell in cells)


def write_slides(notebooks: str | Path = "notebooks", out: str | Path = "slides", run: bool = False) -> list[Path]:
    """One ``NN_name.slides.html`` per lesson in ``out``; returns them. With ``run``, each deck's ``talk`` cells
    run first (from the lessons' folder's parent, where they write under runs/), so their pictures are on it."""
    import nbformat
    from nbconvert import SlidesExporter

    exporter = SlidesExporter()
    exporter.exclude_input = True  # (the prose is markdown: nothing of a code cell is shown but a talk cell's output)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        deck = nbformat.reads(json.dumps(talk(json.loads(path.read_text()))), as_version=4)
        if run:
            run_talk(deck, Path(notebooks).resolve().parent)
        body, _ = exporter.from_notebook_node(deck)
        target = out / f"{path.stem}.slides.html"
        target.write_text(body)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.lessons.slides", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", default="notebooks")
    parser.add_argument("--out", default="slides")
    parser.add_argument("--run", action="store_true", help="run each deck's talk cells first, for their pictures")
    args = parser.parse_args(argv)
    written = write_slides(args.notebooks, args.out, args.run)
    print(f"{len(written)} decks in {args.out}/ (open one in a browser; reveal.js comes from its CDN)")


if __name__ == "__main__":
    main()
