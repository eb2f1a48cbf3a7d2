"""How make test spreads the suite over its processes (tests/conftest.py): which files one process takes whole,
and the order work is handed out in."""

import re
from types import SimpleNamespace

from ..conftest import INTEGRATION, LONGEST_FIRST, ONE_PROCESS, ROOT, pytest_xdist_make_scheduler


def test_the_files_one_process_takes_whole_are_those_with_module_fixtures():
    with_module_fixtures = {path.name for path in (ROOT / "tests").rglob("test_*.py")
                            if re.search(r"scope=\"(module|package|session)\"", path.read_text())}
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
