"""The package's architecture is what docs/architecture.md and pyproject.toml say: layers kept, no cycles."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from .conftest import ROOT

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
    """Ruff's pyflakes checks (unused names, undefined ones), the import order and pycodestyle's errors, as configured
    in pyproject.toml, over the package, the tests and the scripts: `ruff check --fix` repairs most of what it finds."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: make setup-dev installs it (the dev extra)"
    done = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_no_module_imports_one_that_imports_it_back():
    """No import cycle anywhere in the package, also between modules of one layer."""
    graph = grimp.build_graph("dlscale")
    cycles = sorted({tuple(sorted((a, b))) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                     if graph.chain_exists(importer=b, imported=a)})
    assert not cycles, cycles


def _documented_layers() -> list[tuple[list[str], list[str]]]:
    """(the layer's entries, the modules it names) from docs/architecture.md's layers table, top first."""
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    layers = []
    for row in rows:
        layer, modules = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:3]]
        entries = re.findall(r"`([^`]+)`", layer)
        layers.append((entries, [re.findall(r"`([^`]+)`", part) for part in modules.split("\\|")]))
    return layers


def test_the_documented_layers_are_the_contract_and_the_folders():
    """Every layer of the contract is a row of the table, in order, and every module of it is named there."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    expected = [[name.strip().removeprefix("dlscale.") for name in layer.split("|")] for layer in contract["layers"]]
    documented = _documented_layers()
    assert [[e.removesuffix("/").removesuffix(".py") for e in entries] for entries, _ in documented] == expected
    package = ROOT / "dlscale"
    for entries, module_groups in documented:
        for entry, named in zip(entries, module_groups):
            path = package / entry.rstrip("/")
            if path.is_dir():
                present = {p.name for p in path.glob("*.py") if p.name != "__init__.py"}
                assert set(named) == present, f"{entry}: the table names {sorted(set(named) - present)} that are " \
                                              f"not there and misses {sorted(present - set(named))}"
            else:
                assert path.is_file() and named == [entry], entry
    top = {p.name for p in package.iterdir() if p.name not in ("__pycache__", "__init__.py")}
    assert top == {entry.rstrip("/") for entries, _ in documented for entry in entries}
