"""The instructor's slides, from the lessons themselves: each lesson's talk as a reveal.js deck (``make slides``).

The talk is the lesson's prose: each heading starts a slide, the paragraphs under it follow on that slide, and the
code is left to the attendees' screens (a cell tagged ``talk`` is shown too, for a picture worth talking over). So
the instructor talks from what the attendees run, and a change to a lesson changes its deck.
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


def write_slides(notebooks: str | Path = "notebooks", out: str | Path = "slides") -> list[Path]:
    """One ``NN_name.slides.html`` per lesson in ``out``; returns them."""
    import nbformat
    from nbconvert import SlidesExporter

    exporter = SlidesExporter()
    exporter.exclude_input = True  # (the prose is markdown: nothing of a code cell is shown but a talk cell's output)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        deck = nbformat.reads(json.dumps(talk(json.loads(path.read_text()))), as_version=4)
        body, _ = exporter.from_notebook_node(deck)
        target = out / f"{path.stem}.slides.html"
        target.write_text(body)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.lessons.slides", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", default="notebooks")
    parser.add_argument("--out", default="slides")
    args = parser.parse_args(argv)
    written = write_slides(args.notebooks, args.out)
    print(f"{len(written)} decks in {args.out}/ (open one in a browser; reveal.js comes from its CDN)")


if __name__ == "__main__":
    main()
