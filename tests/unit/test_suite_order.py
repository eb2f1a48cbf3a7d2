"""How make test spreads the suite over its processes (tests/conftest.py): which files one process takes whole,
and the order work is handed out in."""

import re
import threading
from types import SimpleNamespace

import pytest

from ..conftest import (
    HOROVOD_BUILD,
    INTEGRATION,
    LONGEST_FIRST,
    ONE_PROCESS,
    ROOT,
    _longest_first,
    _needs_horovod,
    horovod_built,
    pytest_xdist_make_scheduler,
)


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


def test_the_tests_that_run_horovod_come_after_the_longest_files():
    """make test builds Horovod beside the suite; the tests that need it are handed out once the longest files are."""
    def item(nodeid):
        path = ROOT / nodeid.split("::")[0]
        return SimpleNamespace(path=path, nodeid=nodeid)

    lesson_06 = item("tests/integration/test_notebooks.py::test_lesson_runs_top_to_bottom[06_horovod.ipynb]")
    lesson_08 = item("tests/integration/test_notebooks.py::test_lesson_runs_top_to_bottom[08_distributed_kmeans.ipynb]")
    unit = item("tests/unit/test_gpu_paths.py::test_horovod_on_a_gpu_needs_nccl")
    longest = [item(f"tests/integration/{name}::test_x") for name in LONGEST_FIRST if "horovod" not in name]
    assert _needs_horovod(lesson_06) and not _needs_horovod(lesson_08) and not _needs_horovod(unit)
    assert max(map(_longest_first, longest)) < _longest_first(lesson_06) < _longest_first(unit)


def test_a_horovod_test_waits_for_the_build_beside_the_suite_and_a_failed_build_fails_it(tmp_path, monkeypatch):
    status = tmp_path / "horovod-build.status"
    monkeypatch.setenv(HOROVOD_BUILD, str(status))
    ended = threading.Event()

    def build():
        ended.wait(0.3)
        status.write_text("0\n")

    threading.Thread(target=build).start()
    from dlscale.distributed import horovod_backend
    assert horovod_built() == horovod_backend.available() and status.exists()  # it returned once the build ended
    status.write_text("2\n")
    with pytest.raises(pytest.fail.Exception, match=r"Horovod build failed \(exit status 2\): see .*horovod-build.log"):
        horovod_built()
