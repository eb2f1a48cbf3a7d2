"""The instructor's decks (`make slides`, dlscale/lessons/slides.py): talks, not prose, needing no network (#77).

The browser test (tests/integration/test_browser.py) opens every deck with no host name resolving and checks that
every slide fits a 1280 × 720 view; these check what can be read from the notebooks and the written files.
"""

from __future__ import annotations

import json
import re
import shutil

import nbformat
import pytest

from dlscale.lessons.slides import MAX_WORDS, REVEAL, slide_texts, talk, words, write_slides

from ..conftest import ROOT

LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cells(*cells: tuple[str, str, list[str]]) -> dict:
    made = []
    for kind, source, tags in cells:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        made.append(cell)
    return json.loads(json.dumps(nbformat.v4.new_notebook(cells=made)))


def _kinds(deck: dict) -> list[tuple[str, str]]:
    return [("".join(cell["source"])[:12], cell["metadata"]["slideshow"]["slide_type"]) for cell in deck["cells"]]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda path: path.stem[:2])
def test_every_slide_of_a_lesson_has_a_title_and_at_most_40_words(lesson):
    """#77: deck 05 had 12 slides of 31-277 words. A section whose prose is longer has a short `talk` summary."""
    slides = slide_texts(talk(json.loads(lesson.read_text())))
    assert len(slides) >= 5
    for title, prose in slides:
        assert re.match(r"#{1,4} \S", title), (lesson.name, title, prose[:80])
        assert words(prose) <= MAX_WORDS, f"{lesson.name}, {title!r}: {words(prose)} words; tag a short summary `talk`"


def test_a_section_with_a_talk_summary_shows_it_and_keeps_its_prose_in_the_speaker_notes():
    deck = talk(
        _cells(
            ("code", "x = 1  # parameters", ["parameters"]),
            ("markdown", "## Long\n\nMany words of prose " * 3, []),
            ("markdown", "- the point", ["talk"]),
            ("markdown", "More prose, in its own cell.", []),
            ("code", "plot()", ["talk"]),
            ("code", "train()", []),
            ("markdown", "## Short\n\nA few words.", []),
            ("markdown", "And a few more.", []),
        )
    )
    assert _kinds(deck) == [
        ("x = 1  # par", "skip"),
        ("## Long", "slide"),  # (its heading alone: the prose under it goes to the notes)
        ("Many words o", "notes"),
        ("- the point", "-"),
        ("More prose, ", "notes"),
        ("### Long", "subslide"),  # the picture's slide, under the section's title
        ("plot()", "-"),
        ("train()", "skip"),
        ("## Short\n\nA ", "slide"),
        ("And a few mo", "-"),
    ]
    assert slide_texts(deck) == [
        ("## Long", "- the point"),
        ("### Long", ""),
        ("## Short", "A few words.\nAnd a few more."),
    ]
    assert words("A `code span` and $x^2 + y$ count once, [a link](https://x.y/z) as its text") == 11


def test_a_written_deck_loads_nothing_from_a_network_and_draws_its_maths_as_mathml(tmp_path):
    """#77: reveal.js came from unpkg, jQuery, require.js and MathJax from cdnjs; without them no deck started."""
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    for name in ("05_data_parallel.ipynb", "07_large_batch.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, lessons)
    decks = write_slides(lessons, tmp_path / "slides")
    assert [deck.name for deck in decks] == ["05_data_parallel.slides.html", "07_large_batch.slides.html"]
    for deck in decks:
        page = deck.read_text()
        sources = re.findall(r"""<(?:script|link|img)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)""", page)
        assert sources and not [s for s in sources if re.match(r"[a-z]+:", s) and not s.startswith("data:")], sources
        assert {f"{REVEAL}/dist/reveal.js", f"{REVEAL}/dist/reveal.css", f"{REVEAL}/plugin/notes/notes.js"} <= set(
            sources
        )
        assert not re.search(r"""(?:url\(|@import)\s*["']?https?://""", page)  # (nor from a style sheet)
        assert not re.search(r"unpkg|cdnjs|jsdelivr|mathjax|require\.js|jquery", page, re.I)
        for source in sources:
            if not source.startswith("data:"):
                assert (deck.parent / source).is_file(), source  # every file it names is beside it
    maths = decks[1].read_text()
    assert maths.count("<math") >= 10 and "\\frac" not in maths and "$B$" not in maths  # (the SGD update, LARS...)
    assert '<math display="block">' in maths
    copied = tmp_path / "slides" / REVEAL
    assert (copied / "dist/theme/white.css").is_file() and list((copied / "dist/theme/fonts").rglob("*.woff"))
    assert not list(copied.rglob("*.map"))  # (what a deck loads, no source maps)
    assert sum(f.stat().st_size for f in copied.rglob("*") if f.is_file()) < 4e6
