"""The one door from the notebooks into the kit (dlscale.lab): its names resolve, and the notebooks use no other."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re

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
                # IPython's magics and shell lines are not Python: each becomes a `pass` at its indent (one inside
                # an `if` keeps the block)
                source = "\n".join(
                    re.sub(r"^(\s*)[%!].*", r"\1pass", line) for line in "".join(cell["source"]).splitlines()
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


def _where(lab) -> dict:
    """Every name of the door -> (its module, the attribute in it): the table's, then the lesson modules'."""
    return {**lab._WHERE, **lab._lesson_table()}


def test_every_name_of_the_door_resolves_to_what_its_module_holds():
    from dlscale import lab

    where = _where(lab)
    assert sorted(where) == lab.__all__ == dir(lab)
    for name in lab.__all__:
        module, attribute = where[name]
        held = importlib.import_module(module)
        assert getattr(lab, name) is (held if attribute is None else getattr(held, attribute)), name
    with pytest.raises(AttributeError, match="the lessons' names are dlscale.lab.__all__"):
        lab.no_such_name  # noqa: B018


def _lesson_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "dlscale/lessons").glob("lesson[0-9][0-9].py"))


def test_the_door_gives_every_name_of_every_lesson_module_and_reads_them_without_importing_one():
    """#75: each lesson's module lists what its notebooks use in ``__all__``; the door finds the modules by their
    file names and reads that list from the source, so a new lessonNN.py needs no change to lab.py, and
    ``import dlscale.lab`` (or its ``__all__``) imports no lesson module and no torch."""
    import subprocess
    import sys

    from dlscale import lab

    modules = _lesson_modules()
    assert modules and all(list((ROOT / "notebooks").glob(f"{stem[-2:]}_*.ipynb")) for stem in modules), modules
    for stem in modules:
        module = importlib.import_module(f"dlscale.lessons.{stem}")
        assert module.__all__ == lab._lesson_exports(ROOT / f"dlscale/lessons/{stem}.py") != [], stem
        for name in module.__all__:
            assert lab._lesson_table()[name] == (module.__name__, name)
            assert getattr(lab, name) is getattr(module, name), f"{stem}.{name}"
    cheap = (
        "import sys, dlscale.lab as lab; names = lab.__all__; dir(lab); "
        "print(sorted(m for m in sys.modules if m.startswith('dlscale.lessons') or m == 'torch'))"
    )
    done = subprocess.run([sys.executable, "-c", cheap], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_name_exported_twice_is_an_error_naming_both_homes(tmp_path):
    """Two lesson modules exporting one name (or a lesson module exporting one of the table's) cannot both be its
    home: the door says so instead of picking one."""
    from dlscale import lab
    from dlscale.errors import DlscaleError

    assert not set(lab._lesson_table()) & set(lab._WHERE)  # (the real modules: each name once)
    (tmp_path / "lesson01.py").write_text('__all__ = ["CONVERGENCE", "check_one"]\n')
    (tmp_path / "lesson02.py").write_text('__all__ = [\n    "check_one",\n]\n')
    with pytest.raises(DlscaleError, match="lesson02 exports 'check_one', which dlscale.lessons.lesson01 already"):
        lab._lesson_table(tmp_path)
    (tmp_path / "lesson02.py").write_text('__all__ = ["train"]\n')
    with pytest.raises(DlscaleError, match="exports 'train', which dlscale.train already gives"):
        lab._lesson_table(tmp_path)
    (tmp_path / "lesson02.py").write_text("__all__ = NAMES\n")
    with pytest.raises(DlscaleError, match="lesson02.py: a lesson's module lists the names it exports as __all__"):
        lab._lesson_table(tmp_path)
    (tmp_path / "lesson02.py").write_text('__all__ = ["check_two"]\n')
    (tmp_path / "lesson_helpers.py").write_text('__all__ = ["check_one"]\n')  # (not a lesson's module: not read)
    assert lab._lesson_table(tmp_path) == {
        "CONVERGENCE": ("dlscale.lessons.lesson01", "CONVERGENCE"),
        "check_one": ("dlscale.lessons.lesson01", "check_one"),
        "check_two": ("dlscale.lessons.lesson02", "check_two"),
    }


def test_every_lesson_module_name_a_notebook_imports_comes_from_that_lessons_own_module():
    """A lesson's notebooks (the lesson, its exercise and solution) import a lesson module's name only from their
    own lesson's module: lesson 07's notebook reaching lesson 03's check means the name belongs in the table."""
    from dlscale import lab

    table = lab._lesson_table()
    for folder in ("notebooks", "exercises", "solutions"):
        for where, tree in _code_cells(folder):
            lesson = where.split("/")[1][:2]
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "dlscale.lab":
                    for alias in node.names:
                        if alias.name in table:
                            assert table[alias.name][0] == f"dlscale.lessons.lesson{lesson}", (where, alias.name)


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
    exactly the table's names, each the object the door gives (the lesson modules' names are read from them)."""
    from dlscale import lab

    block = (ROOT / "dlscale/lab.py").read_text().split("if TYPE_CHECKING:", 1)[1].split("\n\n\n", 1)[0]
    namespace: dict = {}
    exec("\n".join(line.removeprefix("    ") for line in block.splitlines()[1:]), namespace)
    assert sorted(n for n in namespace if not n.startswith("__")) == sorted(lab._WHERE)
    assert all(namespace[name] is getattr(lab, name) for name in lab._WHERE)
