"""What the README and docs/ say holds. Every make target, path and dlscale command they name exists: a newcomer who
types what the documentation says meets the thing it describes. Every figure the README and the lessons' parameters
cells quote is the one docs/benchmarks.md records, and every section of it that others point to is there."""

from __future__ import annotations

import json
import re

from ..conftest import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOLDERS = "scripts|recipes|slurm|docs|tests|dlscale|notebooks|exercises|solutions"
#: A capitalized word in a path stands for one of several (slurm/SITE/train.sbatch): it must match one at least.
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]+|NN")


def _named(pattern: str) -> list[tuple[str, str]]:
    return [(path.name, found) for path in DOCUMENTS for found in re.findall(pattern, path.read_text())]


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert [(doc, target) for doc, target in _named(r"`make ([a-z][\w-]*)") if target not in targets] == []


def test_every_path_the_docs_name_exists():
    missing = []
    for doc, reference in _named(rf"`((?:{FOLDERS})/[\w./-]+)"):
        reference = reference.rstrip(".").split("::")[0]
        if PLACEHOLDER.search(reference):
            if not list(ROOT.glob(PLACEHOLDER.sub("*", reference))):
                missing.append((doc, reference))
        elif not (ROOT / reference).exists():
            missing.append((doc, reference))
    assert missing == []


def test_every_dlscale_command_the_docs_name_exists():
    from dlscale.cli import build_parser

    commands = next(action for action in build_parser()._actions if action.dest == "command").choices
    named = {command for _, command in _named(r"`dlscale ([a-z][\w-]*)")}
    assert sorted(named - set(commands)) == []


# docs/benchmarks.md is the reference for every figure the README and the lessons quote: the tests below keep the
# quotes equal to it, and it, docs/testing.md and docs/architecture.md free of the history a reference does not need
# (issue numbers, CI folders, dates: what a figure used to be belongs in CHANGELOG.md).

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
#: The documents that say what is, not what changed.
#: The documents that say what is (what changed is CHANGELOG.md's), and the package's docstrings and comments.
REFERENCES = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "dlscale").rglob("*.py"))
HISTORY = {
    "an issue number": r"\b[Ii]ssues? \d+|(?<![\w/&])#\d+\b",
    "a CI folder": r"/tmp/ci",
    "a date": r"\b20\d\d-\d\d-\d\d\b",
}
#: Where the code and documents point into docs/benchmarks.md by a section's title.
POINTERS = "README.md CHANGELOG.md Makefile .ci/run docs/*.md scripts/**/* dlscale/**/* tests/**/*.py notebooks/*.ipynb"


def _section(title: str) -> str:
    """The text under the first heading of docs/benchmarks.md that starts with ``title``, to the next heading of its
    level or above."""
    lines = BENCHMARKS.read_text().splitlines()
    for start, line in enumerate(lines):
        heading = re.match(r"(#+) (.*)", line)
        if heading and heading[2].startswith(title):
            level = len(heading[1])
            end = next((i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
            return "\n".join(lines[start:end])
    raise AssertionError(f"docs/benchmarks.md has no section {title!r}")


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _lesson_runtimes() -> dict[str, tuple[float, str]]:
    """Each lesson's seconds on 2 CPU cores and its GPU cell, from the reference's table."""
    rows = {}
    for line in _section("Lesson runtimes").split("\n### ")[0].splitlines():
        cells = _cells(line) if line.startswith("| ") else []
        if len(cells) == 3 and re.fullmatch(r"\d\d .*", cells[0]):
            rows[cells[0][:2]] = (float(re.fullmatch(r"([\d,]+) s", cells[1])[1].replace(",", "")), cells[2])
    assert sorted(rows) == [f"{n:02d}" for n in range(14)]
    return rows


def _gpu(cell: str) -> tuple[str, float] | None:
    """A GPU cell as ("about", seconds) or ("over", seconds); None where it was not measured."""
    if re.match(r"not (yet|measured)", cell):
        return None
    found = re.match(r"(over )?([\d.]+) (s|min)", cell)
    assert found, cell
    return ("over" if found[1] else "about", float(found[2]) * (60 if found[3] == "min" else 1))


def test_the_readme_quotes_the_lesson_runtimes_of_the_reference():
    reference = _lesson_runtimes()
    quoted = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = _cells(line) if line.startswith("| ") else []
        if len(cells) == 5 and re.fullmatch(r"\d\d .*", cells[0]):
            quoted[cells[0][:2]] = cells[3:]
    assert sorted(quoted) == sorted(reference)
    for lesson, (cpu, gpu_cell) in quoted.items():
        seconds, gpu_reference = reference[lesson]
        assert cpu == f"{seconds:.0f} s", (lesson, cpu, seconds)
        gpu, expected = _gpu(gpu_cell), _gpu(gpu_reference)
        assert (gpu is None) == (expected is None), (lesson, gpu_cell, gpu_reference)
        if gpu:
            assert gpu[0] == expected[0], (lesson, gpu_cell, gpu_reference)
            # the README rounds: to the second, or down to whole minutes for "over"
            assert expected[1] - 60 < gpu[1] <= expected[1] if gpu[0] == "over" else abs(gpu[1] - expected[1]) < 1


def _parameters_cell(notebook) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return next(
        "".join(cell["source"])
        for cell in cells
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", [])
    )


def test_each_parameters_cell_quotes_its_lessons_runtime_from_the_reference():
    """Each parameters cell states its CPU time rounded to 5 s and its GPU time where one was measured."""
    reference = _lesson_runtimes()
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [notebook.name[:2] for notebook in notebooks] == sorted(reference)
    for notebook in notebooks:
        line = next(line for line in _parameters_cell(notebook).splitlines() if "Runtime with these values" in line)
        assert "docs/benchmarks.md" in line, notebook.name
        seconds, gpu_reference = reference[notebook.name[:2]]
        cpu = re.search(r"about (\d+) s on 2 CPU cores", line)
        assert cpu and int(cpu[1]) % 5 == 0 and abs(int(cpu[1]) - seconds) < 5, (notebook.name, line, seconds)
        on_gpu = line.split("2 CPU cores", 1)[1]
        expected = _gpu(gpu_reference)
        if expected is None:
            assert "not measured yet" in on_gpu, (notebook.name, line, gpu_reference)
        elif expected[0] == "over":
            minutes = re.search(r"over (\d+) minutes", on_gpu)
            assert minutes and expected[1] - 60 < int(minutes[1]) * 60 <= expected[1], (notebook.name, line)
        else:
            about = re.search(r"about (\d+) s", on_gpu)
            assert about and abs(int(about[1]) - expected[1]) < 1, (notebook.name, line, gpu_reference)


def _figures(found: str, places: int) -> list[float]:
    return [round(float(value), places) for value in found.split(", ")]


def test_the_readme_quotes_the_demo_and_the_unit_tier_as_the_reference_measured_them():
    readme = " ".join((ROOT / "README.md").read_text().split())
    demo = _section("The demo training")
    # six R² figures in a row: the reference's to three places, the README's to two
    runs = [_figures(found, 2) for found in re.findall(r"\d\.\d{3}(?:, \d\.\d{3}){5}", demo)]
    quoted = [_figures(found, 2) for found in re.findall(r"\d\.\d\d(?:, \d\.\d\d){5}", readme)]
    assert runs and quoted
    assert [figures for figures in quoted if figures not in runs] == []
    # "under a minute" on 2 cores: the whole command, as the reference timed it
    assert "On a 2-core CPU it takes under a minute" in readme
    assert float(re.search(r"([\d.]+) s for the whole command", demo)[1]) < 60
    suite = _section("The test suite")
    for tests, seconds in re.findall(r"\((\d+) tests, (\d+) s\)", readme):
        assert f"{tests} passed in {seconds} s" in suite, (tests, seconds)


def test_the_reference_documents_name_no_issue_ci_folder_or_date():
    found = [
        (path.name, what, hit)
        for path in REFERENCES
        for what, pattern in HISTORY.items()
        for hit in re.findall(pattern, path.read_text())
    ]
    assert found == []


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_section_of_the_reference_that_others_point_to_exists():
    headings = [line.lstrip("#").strip() for line in BENCHMARKS.read_text().splitlines() if line.startswith("#")]
    files = {path for pattern in POINTERS.split() for path in ROOT.glob(pattern) if path.is_file()}
    missing = []
    for path in sorted(files - {BENCHMARKS}):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb":
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        text = " ".join(text.split())
        for title in re.findall(r"benchmarks\.md(?:'s|`)?,? \(?\"([^\"]+)\"", text):
            if not any(title in heading for heading in headings):
                missing.append((path.relative_to(ROOT).as_posix(), title))
        for anchor in re.findall(r"benchmarks\.md#([\w-]+)", text):
            if anchor not in {_slug(heading) for heading in headings}:
                missing.append((path.relative_to(ROOT).as_posix(), f"#{anchor}"))
    assert missing == []
