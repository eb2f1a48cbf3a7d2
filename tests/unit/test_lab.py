"""The one door from the notebooks into the kit (dlscale.lab): its names resolve, and the notebooks use no other."""

from __future__ import annotations

import ast
import importlib
import json
import os

import pytest

from ..conftest import ROOT

#: What a notebook may import besides the door: the engine itself, and (in a stage of the recipe: a cell tagged
#: recipe, or the attendee's stage, whose metadata names its recipe file) the recipe's own imports.
ALSO_ALLOWED = {"dlscale.train"}


def _code_cells(folder: str):
    for path in sorted((ROOT / folder).glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            stage = "recipe" in cell["metadata"].get("tags", []) or "recipe" in cell["metadata"]
            if cell["cell_type"] == "code" and not stage:
                source = "\n".join(
                    line for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!"))
                )
                yield f"{folder}/{path.name}, cell {index}", ast.parse(source)


@pytest.mark.parametrize("folder", ["notebooks", "exercises", "solutions"])
def test_notebooks_reach_the_kit_through_one_door(folder):
    from dlscale import lab

    for where, tree in _code_cells(folder):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("dlscale") for a in node.names), f"{where}: import the door instead"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dlscale"):
                assert node.module == "dlscale.lab" or node.module in ALSO_ALLOWED, f"{where}: from {node.module}"
                if node.module == "dlscale.lab":
                    assert {a.name for a in node.names} <= set(lab.__all__), where


def test_every_name_of_the_door_resolves_to_what_its_module_holds():
    from dlscale import lab

    for name in lab.__all__:
        module, attribute = lab._WHERE[name]
        held = importlib.import_module(module)
        assert getattr(lab, name) is (held if attribute is None else getattr(held, attribute)), name
    with pytest.raises(AttributeError, match="the lessons' names are dlscale.lab.__all__"):
        lab.no_such_name  # noqa: B018


def test_the_attendees_prediction_is_never_overwritten_by_a_later_cell():
    """A verdict cell run again (or after a later cell) reads the letter the attendee chose, not a result that
    reused its name (lesson 11 once stored its plan's projection in `prediction`)."""
    for where, tree in _code_cells("notebooks"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "prediction" for t in node.targets
            ):
                assert isinstance(node.value, ast.Constant) and node.value.value is None, where


def test_every_notebook_names_the_kernel_make_kernel_registers():
    """On a JupyterHub `python3` is the hub's Python, which cannot import the kit (#58)."""
    from dlscale.jobs.kernel import KERNEL_NAME

    for folder in ("notebooks", "exercises", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == KERNEL_NAME, path


def test_the_kernel_loads_its_modules_first_then_becomes_this_python(tmp_path):
    """NERSC's pattern for a kernel built under `module load pytorch`: a helper that loads the module, then execs."""
    import subprocess
    import sys

    from dlscale.jobs.kernel import HELPER, install_kernel

    log = tmp_path / "modules.log"
    environ = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "jupyter")}
    os.environ["JUPYTER_DATA_DIR"] = environ["JUPYTER_DATA_DIR"]
    try:
        folder = install_kernel(modules=["pytorch/2.6.0"], display_name="dlscale (test)")
    finally:
        del os.environ["JUPYTER_DATA_DIR"]
    assert folder == tmp_path / "jupyter/kernels/dlscale"
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["argv"] == ["{resource_dir}/" + HELPER, "-f", "{connection_file}"]
    environ["BASH_FUNC_module%%"] = f'() {{ echo "module $*" >> {log}; }}'  # (a site's module function)
    done = subprocess.run([str(folder / HELPER), "--help"], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "IPython" in done.stdout, done.stderr[-500:]  # (the kernel's own help)
    assert log.read_text() == "module load pytorch/2.6.0\n"
    assert f"exec {sys.executable} -m ipykernel_launcher" in (folder / HELPER).read_text()


def test_every_name_of_the_door_is_used_by_a_lesson_or_named_to_its_readers():
    """The other direction (#60): a name no notebook uses, and no lesson or README tells a reader to call, goes."""
    import re

    from dlscale import lab

    text = (ROOT / "README.md").read_text()
    for folder in ("notebooks", "exercises", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            text += "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
    assert [name for name in lab.__all__ if not re.search(rf"\b{re.escape(name)}\b", text)] == []
    assert "stop_engines" in lab.__all__  # (the README tells notebook users to call it)


def test_the_doors_type_checking_imports_are_its_table():
    """#60: editors (and import-linter) see each name's module through the door's TYPE_CHECKING block; it names
    exactly the table's names, each the object the door gives."""
    from dlscale import lab

    block = (ROOT / "dlscale/lab.py").read_text().split("if TYPE_CHECKING:", 1)[1].split("\n\n\n", 1)[0]
    namespace: dict = {}
    exec("\n".join(line.removeprefix("    ") for line in block.splitlines()[1:]), namespace)
    assert sorted(n for n in namespace if not n.startswith("__")) == lab.__all__
    assert all(namespace[name] is getattr(lab, name) for name in lab.__all__)
