"""Shared fixtures, and the CI rule: in CI a skipped test fails the run unless it needs a GPU."""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_config

ROOT = Path(__file__).resolve().parents[1]

#: Tolerance for two runs that take the same steps in float64 (``precision=fp64``) but add in
#: another order (ranks, micro-batches, Horovod's fusion buffer). Each sum is then off by a few
#: float64 ulps (1.1e-16 relative), and Adam-type updates, which divide by sqrt(v), amplify that
#: over tens of steps by at most ~1e4 (measured in float32: 3e-4 after 64 AdamW steps, about 1e4
#: float32 ulps of the weights). That bounds honest differences near 1e-12; 1e-9 leaves a margin
#: of 1e3 whatever kernels a CPU picks, while a real error (a missing all-reduce, a wrong shard or
#: average) moves the weights by 1e-3 or more. In float32 the same bound would be 1e-3, too loose
#: to catch anything, which is why these tests run in float64.
SAME_STEPS_FP64 = 1e-9
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_skipped_in_ci: list[str] = []


#: Marks every process the session starts (the variable is inherited): what is still running at the end was left.
SESSION_MARK = "DLSCALE_TEST_SESSION"
_own_mark: list[str] = []  # set in the process that made the mark (a nested session, as make test in a test, did not)


def pytest_configure(config):
    # The test processes (pytest-xdist, make test's TEST_WORKERS: 3) share the cores: each runs torch on one thread, so that neither
    # waits at an OpenMP barrier for a thread the other process has pushed off its core. The ranks and
    # kernels a test starts inherit the setting (dlscale.runtime.threads reads OMP_NUM_THREADS).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    elif not os.environ.get(SESSION_MARK):
        # One temporary folder for everything the session's processes put in the system's (torchrun's
        # torchelastic_* logs, clusters' sockets, kernels' files), removed at the end; the workers inherit it.
        # (torch.compile's cache stays where torch keeps it, in the system's temporary folder, shared by runs)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"))
        folder = tempfile.mkdtemp(prefix="dlscale-tests-")
        os.environ.update(TMPDIR=folder, **{SESSION_MARK: folder})
        tempfile.tempdir = None  # (gettempdir() caches its answer)
        _own_mark.append(folder)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test from a fresh folder, so data/ and runs/ land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def tiny(in_tmp):
    """Factory for a tiny config in the test's folder, quiet, with overrides."""
    def make(**overrides):
        values = {"progress": False, "plot": False, **overrides}
        return load_config("tiny", values)
    return make


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300):
    """Run the dlscale command in a subprocess and return the CompletedProcess."""
    import subprocess
    return subprocess.run([sys.executable, "-m", "dlscale", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


#: Each skipped test's reason, for the one line at the end that says what this run left out.
_skip_reasons: list[str] = []


#: What a run without a CUDA GPU says of the tests marked gpu (they run with `pytest -m gpu` on a GPU node).
NO_GPU = "no CUDA GPU here: the gpu tests run on a GPU node (pytest -m gpu)"


#: The integration tier's folder: every test in it starts a system beside it (a Slurm cluster, notebook kernels, a
#: browser, Jupyter, launched ranks or runs, ipyparallel engines, a fresh install). Each is marked integration, so that
#: `-m "not integration"` leaves them out wherever they are collected from; make test-fast runs tests/unit alone.
INTEGRATION = ROOT / "tests" / "integration"


#: The files whose tests share a module fixture (a Slurm cluster, JupyterLab and its browser, a reference run,
#: folders of ipyparallel engines): one test process takes each of them whole, so the fixture is made once. Every
#: other test goes to whichever process is free (tests/unit/test_suite_order.py checks the list).
ONE_PROCESS = ("test_browser.py", "test_slurm.py", "test_sharded.py", "test_train.py", "test_recipes.py")

#: The files whose tests take longest, longest first. make test's processes take work in collection order, so
#: these go first, the rest of the integration tier next and the unit tier last: its short tests fill the gaps
#: at the end, where a long file or lesson started last would run alone while the other processes sit idle.
LONGEST_FIRST = ("test_browser.py", "test_slurm.py", "test_notebooks.py", "test_experiments.py", "test_sharded.py",
                 "test_train.py", "test_distributed.py", "test_recipes.py", "test_horovod.py")


def _longest_first(item) -> tuple[int, int]:
    """Sort key: a file's items stay together (its module fixtures are made once) and keep their order."""
    if not item.path.is_relative_to(INTEGRATION):
        return (2, 0)
    name = item.path.name
    return (0, LONGEST_FIRST.index(name)) if name in LONGEST_FIRST else (1, 0)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler by scopes, where a scope is a file of :data:`ONE_PROCESS` or else one test, handed
    out in collection order. (Its ``--dist loadgroup`` would say the same with markers, but with pytest 9.2 and
    pytest-xdist 3.8 it groups nothing: the group is appended to ``item._nodeid``, which pytest 9.2 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FilesOrTests(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if Path(path).name in ONE_PROCESS else nodeid

    config.option.loadscopereorder = False  # (it would put the scopes with the most tests first)
    return FilesOrTests(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
    items.sort(key=_longest_first)  # (stable)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    if not report.skipped:
        return
    if IN_CI and "gpu" not in report.keywords:
        _skipped_in_ci.append(report.nodeid)
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _skip_reasons.append(reason.removeprefix("Skipped: "))


def left_out_line(reasons: list[str]) -> str | None:
    """One line naming what a run left out: how many tests for each reason, the commonest first."""
    if not reasons:
        return None
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    parts = [f"{n} test{'s' if n > 1 else ''}: {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "left out here: " + "; ".join(parts)


def pytest_terminal_summary(terminalreporter):
    line = left_out_line(_skip_reasons)
    if line:
        terminalreporter.write_line(line, yellow=True)


def left_running(mark: str) -> list[tuple[int, str]]:
    """(pid, command) of the processes that carry this session's mark, other than this one and its test workers
    (pytest-xdist's): what a test or a notebook started and did not stop."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):  # (gone meanwhile, or not ours to read)
            continue
        worker = parent == os.getpid() and any(v.startswith(b"PYTEST_XDIST_WORKER=") for v in environ)
        if f"{SESSION_MARK}={mark}".encode() in environ and not worker:
            found.append((int(entry.name), command[:160]))
    return found


def _stop_what_was_left(session) -> None:
    """Stop (and in CI fail on) every process the session left running; remove the session's temporary folder."""
    if not _own_mark or not Path("/proc/self/environ").exists():
        return
    mark = _own_mark[0]
    deadline = time.monotonic() + 15  # (what is exiting, as an engine being stopped or multiprocessing's tracker)
    while (left := left_running(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        print(f"\n{len(left)} process(es) started by the tests were still running, and were killed:", file=sys.stderr)
        for pid, command in left:
            print(f"  {pid} {command}", file=sys.stderr)
        if IN_CI:
            session.exitstatus = 1
    shutil.rmtree(mark, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    _stop_what_was_left(session)
    if _skipped_in_ci:
        print(f"\nCI: {len(_skipped_in_ci)} test(s) that must run in CI were skipped:", file=sys.stderr)
        for nodeid in _skipped_in_ci:
            print(f"  {nodeid}", file=sys.stderr)
        session.exitstatus = 1
