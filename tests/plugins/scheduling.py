"""How make test spreads the suite over its processes: which files one process takes whole, and the longest first.

pytest-xdist's ``--dist loadgroup`` would say the first with markers, but it groups nothing with pytest 9.2: it
appends the group to ``item._nodeid``, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386; the fix is
pull request #1388). Until a release carries it, :func:`pytest_xdist_make_scheduler` makes pytest-xdist's scheduler
by scopes treat a file of :data:`ONE_PROCESS` as one scope and every other test as its own; a test in
tests/unit/test_suite_order.py fails the day ``loadgroup`` groups again, so that this can go.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The integration tier's folder: every test in it starts a system beside it (a Slurm cluster, notebook kernels, a
#: browser, Jupyter, launched ranks or runs, ipyparallel engines, a fresh install). Each is marked integration, so that
#: `-m "not integration"` leaves them out wherever they are collected from; make test-fast runs tests/unit alone.
INTEGRATION = ROOT / "tests" / "integration"

#: The files whose tests share a module fixture (a Slurm cluster, JupyterLab and its browser, a reference run,
#: folders of ipyparallel engines): one test process takes each of them whole, so the fixture is made once. Every
#: other test goes to whichever process is free (tests/unit/test_suite_order.py checks the list).
ONE_PROCESS = (
    "test_browser.py",
    "test_slurm.py",
    "test_sharded.py",
    "test_train.py",
    "test_recipes.py",
    "test_pipeline.py",
    "test_pinned_torch.py",
    "test_horovod.py",
    "test_distributed.py",
)

#: The files whose tests take longest, longest first. make test's processes take work in collection order, so
#: these go first, the rest of the integration tier next and the unit tier last: its short tests fill the gaps
#: at the end, where a long file or lesson started last would run alone while the other processes sit idle.
LONGEST_FIRST = (
    "test_browser.py",
    "test_slurm.py",
    "test_notebooks.py",
    "test_experiments.py",
    "test_sharded.py",
    "test_pipeline.py",
    "test_train.py",
    "test_distributed.py",
    "test_recipes.py",
    "test_horovod.py",
)


def _longest_first(item) -> tuple[int, int]:
    """Sort key: a file's items stay together (its module fixtures are made once) and keep their order."""
    if not item.path.is_relative_to(INTEGRATION):
        return (2, 0)
    name = item.path.name
    return (0, LONGEST_FIRST.index(name)) if name in LONGEST_FIRST else (1, 0)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler by scopes, where a scope is a file of :data:`ONE_PROCESS` or else one test, handed
    out in collection order (it overrides ``_split_scope``, private: pyproject.toml keeps pytest-xdist below 4)."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesOrTests(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if Path(path).name in ONE_PROCESS else nodeid

    config.option.loadscopereorder = False  # (it would put the scopes with the most tests first)
    return FilesOrTests(config, log)


def order_and_mark(items) -> None:
    """Mark the integration tier's tests, and put the longest files first (stable: each file keeps its order)."""
    import pytest

    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
    items.sort(key=_longest_first)
