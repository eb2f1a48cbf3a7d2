"""How make test spreads the suite over its processes (tests/plugins/scheduling.py): which files one process takes
whole,
and the order work is handed out in."""

import re
from types import SimpleNamespace

import pytest

from ..conftest import ROOT
from ..plugins.scheduling import INTEGRATION, LONGEST_FIRST, ONE_PROCESS, pytest_xdist_make_scheduler


def test_the_files_one_process_takes_whole_are_those_with_module_fixtures():
    with_module_fixtures = {
        path.name
        for path in (ROOT / "tests").rglob("test_*.py")
        # (a session fixture is made once in each process that asks for it: its file's tests may go to any process)
        if re.search(r"scope=\"(module|package)\"", path.read_text())
    }
    assert with_module_fixtures == set(ONE_PROCESS)
    assert all((INTEGRATION / name).exists() for name in {*ONE_PROCESS, *LONGEST_FIRST})


def test_the_scheduler_keeps_those_files_together_and_spreads_every_other_test():
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True), getvalue={"tx": ["3*popen"]}.get)
    scheduler = pytest_xdist_make_scheduler(config, log=None)
    assert config.option.loadscopereorder is False  # (work is handed out in collection order)
    together = [f"tests/integration/{ONE_PROCESS[0]}::test_{name}[x]" for name in "ab"]
    apart = [f"tests/integration/test_notebooks.py::test_{name}[x]" for name in "ab"]
    assert {scheduler._split_scope(nodeid) for nodeid in together} == {f"tests/integration/{ONE_PROCESS[0]}"}
    assert [scheduler._split_scope(nodeid) for nodeid in apart] == apart


@pytest.mark.xfail(
    strict=True,
    reason="pytest-dev/pytest-xdist#1386: --dist loadgroup groups nothing with pytest "
    "9.2; the day this passes, tests/plugins/scheduling.py's scheduler can go",
)
def test_loadgroup_groups_again(tmp_path):
    """Two files of one xdist_group run on two processes: with ``--dist loadgroup`` they should share one."""
    import subprocess
    import sys

    body = (
        "import pytest\n\n@pytest.mark.xdist_group(name='one')\n@pytest.mark.parametrize('i', range(4))\n"
        "def test(i):\n    pass\n"
    )
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(body)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    workers = set(re.findall(r"\[(gw\d)\]", done.stdout))
    assert workers and len(workers) == 1, f"the group ran on {sorted(workers)}"
