"""Shared fixtures, and the CI rule: in CI a skipped test fails the run unless it needs a GPU."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_config

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_skipped_in_ci: list[str] = []


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


def pytest_runtest_logreport(report):
    if report.skipped and IN_CI and "gpu" not in report.keywords:
        _skipped_in_ci.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _skipped_in_ci:
        print(f"\nCI: {len(_skipped_in_ci)} test(s) that must run in CI were skipped:", file=sys.stderr)
        for nodeid in _skipped_in_ci:
            print(f"  {nodeid}", file=sys.stderr)
        session.exitstatus = 1
