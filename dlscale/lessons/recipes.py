"""The plain-PyTorch recipe the lessons grow: where its stages live, their diffs, and their files.

Each lesson holds its stage of the recipe in a code cell tagged ``recipe`` whose first line names
the file (``# recipes/05_ddp.py``): the attendee reads, edits and runs it there. :func:`write_recipes`
writes each such cell to ``recipes/`` with the two lines that make it a script, so that the file
an attendee copies (and ``torchrun`` or ``srun`` starts) is the code the lesson ran; the tests
check that the files are up to date and that every stage trains as ``dlscale.train`` does.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from dlscale.lessons.gaps import gap_span
from dlscale.lessons.notebook_files import read_notebook, up_to_date, write_generated
from dlscale.lessons.recipe_folder import RecipeError, recipe_path
from dlscale.lessons.stages import all_stages, stage_record

#: What a recipe file has after its cell: the command line (a kernel must not run it, its argv is Jupyter's).
SCRIPT_FOOTER = '\n\nif __name__ == "__main__":\n    main(**parse_args(main))\n'


def recipe_diff(old: str, new: str) -> str:
    """The unified diff from one stage's file to the next's: the lines a lesson adds to the recipe."""
    before, after = recipe_path(old).read_text().splitlines(), recipe_path(new).read_text().splitlines()
    return "\n".join(difflib.unified_diff(before, after, f"recipes/{old}", f"recipes/{new}", lineterm="", n=2))


#: How each kind of diff line is shown: added green, removed red, the hunk headers grey.
_DIFF_STYLES = (
    ("+++", "font-weight:bold"),
    ("---", "font-weight:bold"),
    ("+", "background:#e6ffec"),
    ("-", "background:#ffebe9"),
    ("@@", "color:#57606a;background:#f6f8fa"),
)


_BOX = "font-family:monospace;font-size:12px;line-height:1.35;white-space:pre;overflow-x:auto"


def _diff_html(diff: str) -> str:
    """A unified diff as HTML: one line per line of code, never wrapped (a long line scrolls), added lines green
    and removed ones red."""
    import html

    rows = []
    for line in diff.splitlines():
        style = next((css for prefix, css in _DIFF_STYLES if line.startswith(prefix)), "")
        rows.append(f'<div style="{style}">{html.escape(line) or "&nbsp;"}</div>')
    return f'<div class="dlscale-diff" style="{_BOX}">{"".join(rows)}</div>'


def recipe_change_html(old: str, new: str) -> str:
    """:func:`recipe_diff` as HTML (:func:`_diff_html`), then the whole new file behind a click."""
    import html

    whole = html.escape(recipe_path(new).read_text())
    return (
        _diff_html(recipe_diff(old, new))
        + f'<details><summary>the whole of recipes/{new}</summary><div style="{_BOX}">{whole}</div></details>'
    )


def show_recipe_change(old: str, new: str) -> None:
    """Display the lines a stage changes (:func:`recipe_change_html`) in a notebook."""
    from IPython.display import HTML, display

    display(HTML(recipe_change_html(old, new)))


def recipe_cells(notebooks: Path) -> dict[str, str]:
    """{file name: cell source} for each cell tagged ``recipe`` in the notebooks of a folder."""
    return {name: source for name, (source, _) in _recipe_cells(notebooks).items()}


def _recipe_cells(notebooks: Path) -> dict[str, tuple[str, str]]:
    """{file name: (cell source, the notebook's file name)} for each cell tagged ``recipe``."""
    found: dict[str, tuple[str, str]] = {}
    if not Path(notebooks).is_dir():
        raise RecipeError(
            f"{notebooks} is not a folder of notebooks: run this in a clone of dlscale, or name the "
            f"lessons' folder with --notebooks"
        )
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        for cell in read_notebook(path)["cells"]:
            if "recipe" not in cell.get("metadata", {}).get("tags", []):
                continue
            source = "".join(cell["source"])
            first = source.splitlines()[0] if source else ""
            if not first.startswith("# recipes/") or not first.endswith(".py"):
                raise RecipeError(
                    f"{path.name}: a cell tagged recipe must start with '# recipes/NAME.py', not {first[:60]!r}"
                )
            name = first.removeprefix("# recipes/")
            if not _PLAIN_NAME.fullmatch(name):  # (never a path: a recipe is written inside recipes/ only)
                raise RecipeError(
                    f"{path.name}: a recipe cell must name a plain file in recipes/ "
                    f"('# recipes/NAME.py', letters, digits, _ . -), not {first[:60]!r}"
                )
            if name in found:
                raise RecipeError(f"{path.name}: recipes/{name} is written by two cells")
            found[name] = (source, path.name)
    if not found:
        raise RecipeError(f"{notebooks} holds no cell tagged recipe: name the lessons' folder with --notebooks")
    return found


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py")


def write_recipes(notebooks: Path, recipes: Path, check: bool = False) -> list[Path]:
    """Write each recipe cell of ``notebooks`` to ``recipes`` (a first line naming the lesson it comes from, the cell,
    :data:`SCRIPT_FOOTER`); return the files that changed, or with ``check`` those that would change (nothing is
    written)."""
    changed = []
    for name, (source, notebook) in _recipe_cells(notebooks).items():
        path = Path(recipes) / name
        # (a generated file says so in its first line: an edit here is overwritten by the next dlscale recipes)
        header = f"# recipes/{name}: written from notebooks/{notebook} by `dlscale recipes`; edit the lesson's cell\n"
        text = header + source.rstrip("\n").split("\n", 1)[1] + "\n" + SCRIPT_FOOTER
        if not up_to_date(path, text):  # (a link is out of date: it is replaced, never written through)
            changed.append(path)
            if not check:
                write_generated(path, text)
    return changed


# -- the stage the attendee writes ----------------------------------------------------------------


def gapped_recipe(name: str, source: str) -> str:
    """The source of stage ``name`` with each of its gaps (its record, :mod:`dlscale.lessons.stages`) replaced by a TODO
    that says what must be true there and raises ``NotImplementedError("TODO 05.b: ...")`` (indented as the first
    line it replaces): what the attendee fills in."""
    lines, start = source.splitlines(keepends=True), 0
    for gap in stage_record(name).gaps:
        gap_id, label = gap.id, f"TODO {gap.id}: {gap.asks}"
        span = gap_span(lines, gap, start)
        if span is None:
            raise RecipeError(
                f"recipes/{name}: the gap {label!r} needs a line with {gap.first!r}, then one with {gap.last!r}"
            )
        begin, end = span
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        stub = [
            f"{indent}# {label}  (hint({gap_id!r}) helps)\n",
            f"{indent}raise NotImplementedError({json.dumps(label, ensure_ascii=False)})\n",
        ]
        lines[begin : end + 1] = stub
        start = begin + len(stub)
    text = "".join(lines)
    compile(text, f"recipes/{name} with gaps", "exec")  # a gap must cut whole statements
    return text


def stage_name(lesson: str) -> str:
    """The stage file of a lesson: ``"05"`` -> ``"05_ddp.py"`` (a ValueError names the lessons with a stage)."""
    stages = all_stages()
    if lesson[:2] not in stages or lesson[2:3] not in ("", "_", "."):
        raise ValueError(f"lesson {lesson!r} has no stage to write: the stages are {', '.join(stages)}")
    return stages[lesson[:2]].file


def _stage_text(source: str) -> list[str]:
    """A stage's lines without what frames it in a lesson (``%%writefile``, the cell's header) or a file (the
    command line): what the attendee and we wrote."""
    lines = source.removesuffix(SCRIPT_FOOTER).rstrip("\n").splitlines()
    return [line for line in lines if not line.startswith(("%%writefile", "# recipes/"))]


def ours_beside_theirs(lesson: str, theirs: str) -> str:
    """The unified diff from the attendee's stage (its source) to ours: what ours does otherwise."""
    name = stage_name(lesson)
    return "\n".join(
        difflib.unified_diff(
            _stage_text(theirs),
            _stage_text(recipe_path(name).read_text()),
            "your stage",
            f"ours (recipes/{name})",
            lineterm="",
            n=2,
        )
    )


def show_ours(lesson: str, theirs: str | dict | None = None) -> None:
    """Display the difference between the attendee's stage and ours, coloured (nothing when they are the same).

    ``theirs`` is :func:`~dlscale.lessons.stage_probes.run_stage`'s result, a stage's source or file, or None: the
    file the lesson wrote for the ranks (``runs/lessonNN/my_*.py``), or the stage run last in this kernel."""
    from IPython.display import HTML, display

    from dlscale.lessons.stage_probes import last_source

    if isinstance(theirs, dict):
        theirs = theirs.get("source")
    if theirs is None:
        written = sorted(Path("runs", f"lesson{lesson[:2]}").glob("my_*.py"))
        theirs = written[0].read_text() if written else last_source(stage_name(lesson))
    elif "\n" not in theirs and Path(theirs).is_file():
        theirs = Path(theirs).read_text()
    if theirs is None:
        raise ValueError(f"no stage of lesson {lesson} has run in this kernel: run yours first, or pass its source")
    diff = ours_beside_theirs(lesson, theirs)
    display(HTML(_diff_html(diff) if diff else f"<p>Your stage {lesson} is ours, line for line.</p>"))


def use_ours(lesson: str) -> Any:
    """Our stage for the rest of a lesson (after a stage that fails, or one skipped): its ``main`` for a lesson that
    runs the stage in the kernel (01-04), its file's path for one that runs it on ranks (05-07, 10). Every stage
    run after this says that it is ours."""
    import runpy

    from dlscale.lessons.unfinished import mark_finished

    name = stage_name(lesson)
    path = recipe_path(name)
    mark_finished(lesson)
    print(
        f"From here lesson {lesson[:2]} runs OUR stage (recipes/{name}), not yours: every measurement it feeds "
        f"says so. Your stage stays where you wrote it."
    )
    if stage_record(name).runs_on == "kernel":
        return runpy.run_path(str(path), run_name="recipe")["main"]
    return str(path)
