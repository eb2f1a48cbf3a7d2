"""The lessons as attendees see them: `make kernel`, then JupyterLab in a real headless Chromium.

One JupyterLab and one browser serve every test (module fixture). Each lesson is copied with
its CI parameters, opened, switched to the kernel the README tells attendees to pick (in
JupyterLab's Select Kernel dialog), run with Run → Run All Cells, saved, and checked: no error
cell, every figure drawn as an image, tqdm bars drawn as widgets (not text, not "Error
displaying widget"), result tables drawn as tables, and the last cell showing what the lesson
says. Screenshots of each end state are kept in the test's temporary folder.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ..browser import Lab, missing, problems
from ..conftest import ROOT
from ..notebooks import STAGE_MARK, assert_measured_on_the_stage, with_parameters
from .test_notebooks import IN_THE_BROWSER, LESSONS, MEASURED_ON_THE_STAGE

pytestmark = pytest.mark.notebook

#: The kernel `make kernel` installs and the README tells attendees to choose; the browser picks
#: it by its display name, "dlscale (<environment>)".
KERNEL = "dlscale"

#: Per lesson, its end state: a regex the last code cell's text must match (or None), whether that
#: cell draws a figure, and whether the lesson shows a tqdm bar (training, rounds, engines starting).
#: Parameters are the headless tests' small ones.
BROWSER_LESSONS = {
    "00_environment.ipynb": (None, True, False),
    "01_single_device_baseline.ipynb": (
        r"def train_step\(run: Run, batches: Iterator\)[\s\S]*def whole_model\(",
        False,
        True,
    ),
    "13_pipeline_parallel.ipynb": (r"run_from_terminal = False: not started", False, False),
}


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """`make kernel` into a fresh Jupyter data folder, as an attendee on a JupyterHub runs it."""
    data = tmp_path_factory.mktemp("jupyter-data")
    env = {**os.environ, "JUPYTER_DATA_DIR": str(data)}
    done = subprocess.run(
        ["make", "-C", str(ROOT), "kernel", f"VENV={sys.prefix}"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return data


def test_make_kernel_installs_the_kernel_the_readme_names(kernel_dir):
    env = {**os.environ, "JUPYTER_DATA_DIR": str(kernel_dir)}
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    spec = json.loads(listed.stdout)["kernelspecs"][KERNEL]
    assert Path(spec["resource_dir"]).parent.parent == kernel_dir  # installed where Jupyter looks for the user
    assert spec["spec"]["display_name"] == f"dlscale ({sys.prefix})"  # "dlscale", and which environment
    assert Path(spec["spec"]["argv"][0]).resolve() == Path(sys.executable).resolve()
    assert f"choose the **{KERNEL}** kernel" in (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def lab(kernel_dir, tmp_path_factory):
    reason = missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("lab") / "work"
    work.mkdir()
    lab = Lab(work, kernel_dir)
    yield lab
    lab.close()


def _prepare(
    lab: Lab,
    name: str,
    parameters: dict,
    extra_cells: tuple[str, ...] = (),
    as_name: str | None = None,
    mark: str | None = None,
    notebook: nbformat.NotebookNode | None = None,
) -> str:
    """The lesson with its parameters injected (its stage marked, with ``mark``), in the lab's folder; it keeps the
    kernel it was committed with."""
    if notebook is None:
        notebook = with_parameters(ROOT / "notebooks" / name, parameters, mark=mark)
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in extra_cells]
    path = lab.work / (as_name or name)
    path.write_text(json.dumps(notebook, indent=1))
    return path.name


# A hang guard, not a speed target (lesson 10 takes about a minute and a half on 2 quiet cores).
@pytest.mark.timeout(1800)
def test_the_lessons_run_here_are_the_ones_the_headless_tests_leave_to_the_browser():
    assert set(BROWSER_LESSONS) == IN_THE_BROWSER


@pytest.mark.parametrize("name", sorted(BROWSER_LESSONS))
def test_a_lesson_runs_all_in_the_browser(lab, name, tmp_path):
    last_output, figure_last, bar_expected = BROWSER_LESSONS[name]
    marked = name in MEASURED_ON_THE_STAGE
    page = lab.run_all(
        _prepare(lab, name, LESSONS[name], mark=STAGE_MARK if marked else None), KERNEL, tmp_path / f"{name}.png"
    )
    assert page.kernel_label.startswith("dlscale (")  # the kernel the README names, shown to the attendee
    assert problems(page, last_output, figure_last, bar_expected) == []
    if marked:
        assert_measured_on_the_stage(page.notebook, name)
    assert page.outputs("image/png") >= 1  # every one of these lessons draws something
    assert page.screenshot.stat().st_size > 20_000


#: What goes wrong at a workshop, made on purpose: a widget the page cannot draw (its model is
#: unknown, as when the frontend and kernel ipywidgets disagree), a figure that is not drawn, an error.
BROKEN_CELLS = (
    "from IPython.display import display\n"
    "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'gone', 'version_major': 2,"
    " 'version_minor': 0}}, raw=True)",
    "display({'image/png': 'bm90IGEgcG5n'}, raw=True)",
    "raise RuntimeError('deliberately broken')",
    "print('never reached')",
)


def test_a_broken_lesson_fails_the_check(lab, tmp_path):
    page = lab.run_all(
        _prepare(lab, "00_environment.ipynb", LESSONS["00_environment.ipynb"], BROKEN_CELLS, as_name="00_broken.ipynb"),
        KERNEL,
        tmp_path / "broken.png",
    )
    found = problems(page, "never reached", figure_last=False, bar_expected=False)
    assert any("RuntimeError: deliberately broken" in problem for problem in found), found
    assert any("'Error displaying widget'" in problem for problem in found), found
    assert any("are shown" in problem for problem in found), found  # the undrawable figure
    assert any("last cell's text" in problem for problem in found), found  # Run All stopped at the error


def test_a_kernel_jupyterlab_does_not_offer_is_named(lab, tmp_path):
    name = _prepare(lab, "00_environment.ipynb", LESSONS["00_environment.ipynb"], as_name="00_no_kernel.ipynb")
    with pytest.raises(AssertionError, match=r"JupyterLab offers no 'dlscale-gpu' kernel, only \[.*'dlscale \("):
        lab.run_all(name, "dlscale-gpu", tmp_path / "no_kernel.png")


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """`make slides`, as the instructor runs it: every lesson's deck, written without running its talk cells; and lesson
    03's deck again with them run (its fp16 underflow is a picture on it), as `make slides` writes every deck."""
    from dlscale.lessons.slides import write_slides

    folder = tmp_path_factory.mktemp("slides")
    written = write_slides(ROOT / "notebooks", folder / "plain")
    lesson = folder / "one" / "notebooks"
    lesson.mkdir(parents=True)
    shutil.copy(ROOT / "notebooks/03_mixed_precision.ipynb", lesson)
    [pictured] = write_slides(lesson, folder / "run", run=True)
    return written, pictured


def test_make_slides_writes_every_lessons_deck_and_runs_its_talk_cells(decks):
    """make slides: each lesson's talk as a reveal.js deck, from the lesson itself (#58), the code left on the
    attendees' screens; lesson 03's deck written again with its talk cells run shows its fp16 underflow as a picture.
    (That a deck opens on its first slide is proven in a browser by the test below.)"""
    written, pictured = decks
    assert len(written) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    deck = next(deck for deck in written if deck.name == "05_data_parallel.slides.html").read_text()
    assert "05 · Data-parallel training" in deck and "init_process_group(" not in deck
    picture = 'src="data:image/png;base64,'  # (an output's image: nbconvert's own CSS holds data URLs too)
    plain = next(deck for deck in written if deck.name == pictured.name)
    assert picture in pictured.read_text() and picture not in plain.read_text()


#: The view the decks are made for: a projector's 16:9 at 720p (the slide is 1280 × 720; reveal.js scales it).
VIEW = (1280, 720)


# (about 50 s on 2 cores: the decks' fixture, 35 s of it running lesson 03's talk cells; the slides 10 s)
def test_every_slide_of_every_deck_fits_the_view_and_needs_no_network(decks):
    """#77: in a room without the CDNs the decks started as plain HTML, and a slide of lesson 03 was 1,498 px tall
    in a 657-px view, its picture below the fold. Each deck opened from its folder, with no host name resolving:
    reveal.js starts from the files beside it, nothing but local files is fetched, and every slide's content (its
    maths as MathML) lies within the 1280 × 720 view, every picture drawn and inside it."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    from ..browser import deck_slides, offline_chromium

    written, pictured = decks
    driver = offline_chromium(*VIEW)
    try:
        shown = {deck.name: deck_slides(driver, deck) for deck in written}
        shown["03, its talk cells run"] = deck_slides(driver, pictured)
    finally:
        driver.quit()
    for name, deck in shown.items():
        assert deck["ready"], f"{name}: reveal.js did not start"
        assert len(deck["slides"]) >= 3 and deck["slides"][0]["title"], name
        assert deck["window"] == list(VIEW)
        assert all(url.startswith(("file:", "data:")) for url in deck["fetched"]), (name, deck["fetched"])
        assert any(url.endswith("/reveal.js/dist/reveal.js") for url in deck["fetched"]), name  # (the copy beside)
    assert shown["05_data_parallel.slides.html"]["slides"][0]["title"].startswith("05 · Data-parallel training")
    assert len(shown["05_data_parallel.slides.html"]["slides"]) > 5
    problems = [
        f"{name} #/{slide['h']}/{slide['v']} {slide['title']!r}: {problem}"
        for name, deck in shown.items()
        for slide in deck["slides"]
        for problem in slide["problems"]
    ]
    assert problems == []
    assert all(slide["title"] for deck in shown.values() for slide in deck["slides"])  # (every slide has a title)
    pictures = [slide for slide in shown["03, its talk cells run"]["slides"] if slide["images"]]
    assert pictures and all(slide["title"] == "Three formats" for slide in pictures)
    assert sum(len(deck["slides"]) for deck in shown.values()) > 100
