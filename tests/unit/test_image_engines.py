"""The image's build ends with ``dlscale info --require EXTRAS``: every engine the lessons use is imported, and one
missing (daal4py on a Debian base, issue 77) stops the build with one line naming it, instead of lesson 08 in a room.
"""

from __future__ import annotations

import sys

import pytest

import dlscale.jobs.environment as environment
from dlscale.cli import _parse


@pytest.fixture
def engines(tmp_path, monkeypatch):
    """Stand-in engines: one that imports, one absent, one whose library cannot be loaded (as daal4py's
    ``libonedal_core.so`` where its wheel's data files went elsewhere), and ``mpirun`` beside the interpreter."""
    (tmp_path / "engine_ok.py").write_text("")
    (tmp_path / "engine_broken.py").write_text(
        "raise OSError('libonedal_core.so.4: cannot open shared object file: No such file or directory')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(
        environment,
        "LESSON_ENGINES",
        {"good": ("engine_ok",), "kmeans": ("engine_ok", "engine_absent", "engine_broken", "mpirun")},
    )
    return python.parent


def test_every_engine_is_imported_and_each_missing_one_is_named_with_why(engines):
    assert environment.missing_engines("good") == (["engine_ok"], [])
    present, missing = environment.missing_engines("good, kmeans")
    assert present == ["engine_ok"]
    assert missing == [
        "engine_absent (kmeans: ModuleNotFoundError: No module named 'engine_absent')",
        "engine_broken (kmeans: OSError: libonedal_core.so.4: cannot open shared object file: No such file or "
        "directory)",
        f"mpirun (kmeans: not beside the interpreter ({engines / 'mpirun'}))",  # (where lesson 08 starts it)
    ]
    (engines / "mpirun").write_text("")
    assert environment.missing_engines("kmeans")[0] == ["engine_ok", "mpirun"]
    assert environment.missing_engines("") == ([], [])  # (EXTRAS=: the kit alone)
    with pytest.raises(ValueError, match="no extra named nope"):
        environment.missing_engines("good,nope")
    assert environment.missing_engines("good,dev,bench")[1] == []  # (the kit's extras with no engine for the lessons)
    assert len(environment.missing_engines("all")[1]) == 2  # (every extra's: the two broken ones; mpirun is there)


def _info(*argv: str) -> int:
    args = _parse(["info", *argv])  # (the command's handler, without main's process-wide settings)
    return args.handler(args)


def test_dlscale_info_require_fails_the_build_with_one_line(engines, capsys):
    assert _info("--require", "good") == 0
    assert capsys.readouterr().out == "the lessons' engines of good import: engine_ok\n"
    assert _info("--require", "kmeans") == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("dlscale info: the lessons' engines missing here: engine_absent (kmeans: ")


def test_the_lessons_extras_are_pyprojects_and_name_the_engines_dlscale_info_lists():
    """Each extra the table names is pyproject's, and every optional engine `dlscale info` reports (but Horovod's
    build) is one an extra's check imports."""
    from ..conftest import ROOT

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(environment.LESSON_ENGINES) <= set(extras)
    checked = {engine for names in environment.LESSON_ENGINES.values() for engine in names}
    assert set(environment.OPTIONAL) - {"horovod"} <= checked
    for extra in "notebooks,kmeans,hpo,tracking,profiling".split(","):  # (the Containerfile's EXTRAS)
        assert environment.LESSON_ENGINES[extra]
