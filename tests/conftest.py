"""The suite's fixtures and settings. Its plugins (tests/plugins/) spread it over make test's processes, stop what
a session left running, and say what a run left out (in CI a skip fails the run unless the test needs a GPU)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_config

from .plugins import reaper, scheduling, skips
from .plugins.scheduling import pytest_xdist_make_scheduler  # noqa: F401  (a hook: pytest reads it here)
from .plugins.skips import left_out_line, pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401  (hooks)

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


def pytest_configure(config):
    # The test processes (pytest-xdist, make test's TEST_WORKERS: 3) share the cores: each runs torch on one thread,
    # so that none waits at an OpenMP barrier for a thread another process has pushed off its core. The ranks and
    # kernels a test starts inherit the setting (dlscale.runtime.threads reads OMP_NUM_THREADS).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    reaper.mark_session()
    _own_ipython_folder()


def _own_ipython_folder() -> None:
    """IPython's folder (``IPYTHONDIR``) inside the session's temporary folder, which the session removes at its end:
    its notebook engines' ``cluster-<id>.json``, its kernels' history and profiles stay out of the user's
    ``~/.ipython``. Set in the first process, before pytest-xdist starts its workers: they, and the kernels, engines
    and commands the tests start, inherit it (and a nested session keeps the outer one's)."""
    folder = Path(os.environ[reaper.SESSION_MARK]) / "ipython"
    folder.mkdir(exist_ok=True)
    os.environ["IPYTHONDIR"] = str(folder)


def pytest_collection_modifyitems(config, items):
    scheduling.order_and_mark(items)
    skips.skip_gpu_tests(items)


def pytest_sessionfinish(session, exitstatus):
    reaper.stop_what_was_left(session, skips.IN_CI)
    skips.fail_on_skips_in_ci(session)


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

    return subprocess.run(
        [sys.executable, "-m", "dlscale", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
