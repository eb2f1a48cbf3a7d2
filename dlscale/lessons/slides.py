"""The instructor's slides, from the lessons themselves: each lesson's talk as a reveal.js deck (``make slides``).

The talk follows the lesson: each heading starts a slide. A section whose prose is longer than a slide holds (about
40 words) has its talk in markdown cells tagged ``talk``, short: the slide shows the heading and those cells, and the
section's prose goes to the speaker notes (``S`` in the deck), so the instructor still has it. A section without one
is shown whole. The code is left to the attendees' screens. A code cell tagged ``talk`` is a picture worth talking
over (fp16's range and its underflow, the all-reduce's bandwidth, the LR schedules): with ``run`` its pictures are
made for the deck, on a slide of their own under the section's title, the cell run with the lesson's parameters in a
kernel of its own. So the instructor talks from what the attendees run, and a change to a lesson changes its deck.

The decks work offline: reveal.js is copied once beside them (``reveal.js/``, from the sphinx-revealjs package that
the ``slides`` extra installs) and the maths is written into the deck as MathML (latex2mathml), which browsers draw
themselves; nothing is fetched from a network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
from pathlib import Path

from dlscale.errors import import_optional

#: The slide's size, the projector's 16:9; reveal.js scales it to the window.
WIDTH, HEIGHT = 1280, 720
#: A slide's prose, at most: past this a section needs a ``talk`` summary (tests/unit/test_slides.py).
MAX_WORDS = 40
#: The folder beside the decks that holds reveal.js.
REVEAL = "reveal.js"

_HEADING = re.compile(r"^#{1,6}\s")


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _is_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and bool(_HEADING.match(_source(cell).lstrip()))


def _title(source: str) -> str:
    """A heading cell's heading lines (the prose after them left out)."""
    lines = source.strip().splitlines()
    kept = []
    for line in lines:
        if not _HEADING.match(line):
            break
        kept.append(line)
    return "\n".join(kept)


def _set(cell: dict, kind: str) -> None:
    cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}


def talk(notebook: dict) -> dict:
    """``notebook`` with reveal.js's slide types set: a heading starts a slide; under it, the section's ``talk``
    cells (its prose then goes to the speaker notes) or, without any, its prose; a ``talk`` code cell's picture on a
    slide of its own, under the section's title; the other code skipped."""
    deck = json.loads(json.dumps(notebook))
    cells: list[dict] = []
    sections: list[list[dict]] = []
    for cell in deck["cells"]:
        if _is_heading(cell):
            sections.append([cell])
        elif sections:
            sections[-1].append(cell)
        else:
            _set(cell, "skip")
            cells.append(cell)
    for head, *rest in sections:
        summarised = any(cell["cell_type"] == "markdown" and "talk" in _tags(cell) for cell in rest)
        source = _source(head).strip()
        title = _title(source)
        if summarised:
            prose = source[len(title) :].strip()
            head["source"] = title
            cells.append(head)
            _set(head, "slide")
            if prose:
                cells.append({"cell_type": "markdown", "metadata": {}, "source": prose})
                _set(cells[-1], "notes")
        else:
            cells.append(head)
            _set(head, "slide")
        for cell in rest:
            tagged = "talk" in _tags(cell)
            if cell["cell_type"] == "markdown":
                if summarised and not tagged:
                    _set(cell, "notes")
                else:
                    _set(cell, "subslide" if tagged and _is_heading(cell) else "-")
            elif tagged:  # a picture: on a slide of its own, with the section's title
                picture_title = "### " + re.sub(r"^#+\s*", "", title.splitlines()[-1])
                cells.append({"cell_type": "markdown", "metadata": {"picture_title": True}, "source": picture_title})
                _set(cells[-1], "subslide")
                _set(cell, "-")
            else:
                _set(cell, "skip")
            cells.append(cell)
    for index, cell in enumerate(cells):  # (the cells added here need what nbformat 4.5 asks of every cell)
        cell.setdefault("id", f"talk-{index}")
    deck["cells"] = cells
    return deck


def slide_texts(deck: dict) -> list[tuple[str, str]]:
    """(title, prose) of each slide of a deck made by :func:`talk`: the markdown shown on it, its title apart."""
    slides: list[tuple[str, list[str]]] = []
    for cell in deck["cells"]:
        kind = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
        if cell["cell_type"] != "markdown" or kind in ("skip", "notes"):
            continue
        source = _source(cell).strip()
        if kind in ("slide", "subslide"):
            title = _title(source)
            slides.append((title, [source[len(title) :]]))
        elif slides:
            slides[-1][1].append(source)
    return [(title, "\n".join(parts).strip()) for title, parts in slides]


def words(markdown: str) -> int:
    """The words a reader reads in ``markdown``: a formula or a code span counts as one, a link as its text."""
    text = re.sub(r"```.*?```", " code ", markdown, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]+`", " x ", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return len(re.findall(r"[A-Za-z0-9][\w'’.,:;%+×/-]*", text))


def _is_setup(cell: dict) -> bool:
    tags = _tags(cell)
    return cell["cell_type"] == "code" and ("parameters" in tags or "talk" in tags or "os.chdir(" in _source(cell))


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
    for cell in cells:  # a talk cell's slide shows its pictures: the numbers it prints stay in the lesson
        if "talk" in cell.metadata.get("tags", []):
            cell.outputs = [
                output for output in cell.outputs if any(k.startswith("image/") for k in output.get("data", {}))
            ]
    return sum("talk" in cell.metadata.get("tags", []) for cell in cells)


def _leave_out_empty_pictures(deck) -> None:
    """A picture's slide left out where its ``talk`` cell drew nothing (not run, or no picture)."""
    for before, cell in zip(deck.cells, deck.cells[1:]):
        if before.metadata.get("picture_title") and not any(
            key.startswith("image/") for output in cell.get("outputs", []) for key in output.get("data", {})
        ):
            before.metadata.slideshow.slide_type = "skip"


def reveal_source() -> Path:
    """The reveal.js that the sphinx-revealjs package ships (its ``dist/`` and plugins), found without importing
    Sphinx."""
    spec = importlib.util.find_spec("sphinx_revealjs")
    if spec is None or not spec.submodule_search_locations:
        import_optional("sphinx_revealjs", "slides", "make slides (reveal.js, served from the decks' folder)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "_static" / "revealjs"
    if not (folder / "dist" / "reveal.js").is_file():
        raise FileNotFoundError(f"sphinx-revealjs ships no reveal.js at {folder}: reinstall the slides extra")
    return folder


def copy_reveal(out: str | Path) -> Path:
    """reveal.js copied into ``out/reveal.js``: its script, style, themes with their fonts, and the speaker-notes
    plugin (what a deck loads; no source maps or ES modules). The decks name it by this relative path."""
    source, target = reveal_source(), Path(out) / REVEAL
    skip = shutil.ignore_patterns("*.map", "*.esm.js", "*.scss")
    shutil.copytree(source / "dist", target / "dist", ignore=skip, dirs_exist_ok=True)
    shutil.copytree(source / "plugin" / "notes", target / "plugin" / "notes", ignore=skip, dirs_exist_ok=True)
    shutil.copy2(source / "LICENSE", target / "LICENSE")
    return target


#: The deck's page: nbconvert's reveal template, with reveal.js loaded from the folder beside the deck (no require.js,
#: jQuery, mermaid or MathJax from a CDN: the maths is MathML already), a 16:9 slide, and pictures sized to it.
TEMPLATE = """{%- extends 'reveal/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_css -%}
<style type="text/css">
.reveal .slides section { font-size: 30px; line-height: 1.35; }
.reveal .slides section .jp-RenderedHTMLCommon { font-size: 30px; line-height: 1.35; padding-right: 0; }
.reveal .slides section * { overflow: visible; }  /* (nothing scrolls: what does not fit shows, and the test sees it) */
.reveal .slides section h1, .reveal .slides section h2, .reveal .slides section h3 { text-transform: none; }
.reveal .slides section table { font-size: 26px; }
.reveal .slides section pre { width: auto; max-width: 100%; box-sizing: border-box; font-size: 24px; }
.reveal .slides section h1 { font-size: 58px; }
.reveal .slides section h2 { font-size: 46px; }
.reveal .slides section h3 { font-size: 40px; }
.reveal .slides section .jp-RenderedHTMLCommon code { font-size: 26px; }
.reveal .slides section li { margin-bottom: 0.2em; }
.reveal .slides section .jp-Cell, .reveal .slides section .jp-OutputArea-output { padding: 0; margin: 0; }
.reveal .slides section .jp-OutputPrompt, .reveal .slides section .jp-InputPrompt { display: none; }
.reveal .slides section .jp-OutputArea-child { justify-content: center; }
.reveal .slides section .jp-OutputArea-output img {
  display: block; max-width: 100%; max-height: __PICTURE__px; width: auto; height: auto; object-fit: contain;
  margin: 0 auto;
}
.reveal .slides section math[display="block"] { font-size: 110%; margin: 0.4em 0; }
</style>
{%- endblock html_head_css -%}
{% block footer_js %}
<script src="{{ resources.reveal.url_prefix }}/dist/reveal.js"></script>
<script src="{{ resources.reveal.url_prefix }}/plugin/notes/notes.js"></script>
<script>
Reveal.initialize({
    controls: true,
    progress: true,
    hash: true,
    center: true,
    transition: "{{ resources.reveal.transition }}",
    slideNumber: "c/t",
    width: {{ resources.reveal.width }},
    height: {{ resources.reveal.height }},
    plugins: [RevealNotes],
});
</script>
{% endblock footer_js %}
""".replace("__PICTURE__", str(HEIGHT - 170))


def exporter():
    """nbconvert's reveal.js exporter, writing decks that need no network (see :data:`TEMPLATE`)."""
    from jinja2 import DictLoader, pass_context
    from latex2mathml.converter import convert
    from nbconvert import SlidesExporter
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    def mathml(latex: str, display: str) -> str:
        # (browsers take MathML in HTML without its namespace: the deck then names no address at all)
        return convert(latex.strip(), display=display).replace(' xmlns="http://www.w3.org/1998/Math/MathML"', "")

    class Renderer(IPythonRenderer):  # the maths as MathML, drawn by the browser: no MathJax to load
        def inline_math(self, body: str) -> str:
            return mathml(body, "inline")

        def block_math(self, body: str) -> str:
            return mathml(body, "block")

        def latex_environment(self, name: str, body: str) -> str:
            return mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", "block")

    class Offline(SlidesExporter):
        @pass_context
        def markdown2html(self, context, source):
            cell = context.get("cell", {})
            path = context.get("resources", {}).get("metadata", {}).get("path", "")
            renderer = Renderer(
                escape=False,
                attachments=cell.get("attachments", {}),
                embed_images=True,
                path=path,
                anchor_link_text=self.anchor_link_text,
                exclude_anchor_links=True,
                **self.lexer_options,
            )
            return MarkdownWithMath(renderer=renderer).render(source)

    deck = Offline(
        extra_loaders=[DictLoader({"dlscale_deck.html.j2": TEMPLATE})],
        template_file="dlscale_deck.html.j2",
        reveal_url_prefix=REVEAL,
        reveal_theme="white",
        reveal_transition="none",
        reveal_width=str(WIDTH),
        reveal_height=str(HEIGHT),
    )
    deck.exclude_input = True  # (the prose is markdown: nothing of a code cell is shown but a talk cell's output)
    return deck


def write_slides(notebooks: str | Path = "notebooks", out: str | Path = "slides", run: bool = False) -> list[Path]:
    """One ``NN_name.slides.html`` per lesson in ``out``, with reveal.js copied beside them; returns the decks.
    With ``run``, each deck's ``talk`` cells run first (from the lessons' folder's parent, where they write under
    runs/), so their pictures are on it."""
    import nbformat

    import_optional("latex2mathml", "slides", "make slides (the maths drawn without a network)")
    make = exporter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_reveal(out)
    written = []
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        deck = nbformat.reads(json.dumps(talk(json.loads(path.read_text()))), as_version=4)
        if run:
            run_talk(deck, Path(notebooks).resolve().parent)
        _leave_out_empty_pictures(deck)
        body, _ = make.from_notebook_node(deck)
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
    print(
        f"{len(written)} decks in {args.out}/, reveal.js beside them in {args.out}/{REVEAL}/: open one in a browser "
        "(no network needed; S shows the speaker notes)"
    )


if __name__ == "__main__":
    main()
