"""The package's architecture is what docs/architecture.md and pyproject.toml say: layers kept, no cycles."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from ..conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_no_import_climbs_a_layer():
    """import-linter's layers contract (pyproject.toml), run as a user would run it."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    done = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_ruff_finds_nothing():
    """Ruff's pyflakes checks (unused names, undefined ones), the import order, pycodestyle's errors, as configured
    in pyproject.toml, over the package, the tests and the scripts: `ruff check --fix` repairs most of what it finds."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: make setup-dev installs it (the dev extra)"
    done = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # and laid out as ruff's formatter lays it out (`ruff format dlscale tests scripts` does it)
    done = subprocess.run(
        [ruff, "format", "--check", "--no-cache", "dlscale", "tests", "scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_no_module_imports_one_that_imports_it_back():
    """No import cycle anywhere in the package, also between modules of one layer."""
    graph = grimp.build_graph("dlscale")
    cycles = sorted(
        {
            tuple(sorted((a, b)))
            for a in graph.modules
            for b in graph.find_modules_directly_imported_by(a)
            if graph.chain_exists(importer=b, imported=a)
        }
    )
    assert not cycles, cycles


def _contract_tiers() -> list[set[str]]:
    """The tiers of import-linter's layers contract in pyproject.toml, top first, as sets of subpackage names."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return [{name.strip().removeprefix("dlscale.") for name in tier.split(":")} for tier in contract["layers"]]


def _documented_tiers() -> list[tuple[str, dict[str, list[str]]]]:
    """(tier, {layer: the modules the table names}) from docs/architecture.md's layers table, top first."""
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    tiers: list[tuple[str, dict[str, list[str]]]] = []
    for row in (line for line in table.splitlines() if line.startswith("| ") and "`" in line):
        tier, layer, modules = [cell.strip() for cell in row.split("|")[1:4]]
        if not tiers or tiers[-1][0] != tier:
            tiers.append((tier, {}))
        tiers[-1][1][layer.strip("`")] = re.findall(r"`([^`]+)`", modules)
    return tiers


def test_the_documented_tiers_are_the_contract_the_docstring_and_the_folders():
    """The table's tiers are the contract's, in order; the package docstring lists the same; every module of every
    subpackage is named in the table and every one it names exists."""
    documented = _documented_tiers()
    as_names = [{layer.removesuffix("/").removesuffix(".py") for layer in layers} for _, layers in documented]
    assert as_names == _contract_tiers()
    import dlscale

    listed = re.findall(r"^\d\. [^:]+: (.+)$", dlscale.__doc__, re.MULTILINE)
    assert [set(re.findall(r"``(\w+)``", line)) for line in listed] == as_names
    assert 5 <= len(as_names) <= 6
    package = ROOT / "dlscale"
    for _, layers in documented:
        for layer, named in layers.items():
            path = package / layer.rstrip("/")
            if path.is_dir():
                present = {p.name for p in path.glob("*.py") if p.name != "__init__.py"}
                for pattern in [name for name in named if "NN" in name]:  # (`lessonNN.py`: one module per lesson)
                    matching = {p for p in present if re.fullmatch(re.escape(pattern).replace("NN", r"\d\d"), p)}
                    assert matching, f"{layer}: no module matches {pattern}"
                    named = [name for name in named if name != pattern] + sorted(matching)
                assert set(named) == present, (
                    f"{layer}: the table names {sorted(set(named) - present)} that are "
                    f"not there and misses {sorted(present - set(named))}"
                )
            else:
                assert path.is_file() and named == [layer], layer
    top = {p.name for p in package.iterdir() if p.name not in ("__pycache__", "__init__.py")}
    assert top == {layer.rstrip("/") for _, layers in documented for layer in layers}
