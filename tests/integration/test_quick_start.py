"""The README's test command on the machines the README promises: no Python 3.10, no root, no Chromium.

`make test` is run for real (installs skipped with make's ``-o``, a few quick tests selected) in an
environment where no Python 3.10 can be found (no pyenv, a PATH without one) and, where this machine
has root, as an unprivileged user. It must pass and say in one line each what it left out; in CI the
missing Python 3.10 must fail the run instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, left_out_line

#: A test that skips without root (it shapes a link in a network namespace of its own).
NEEDS_ROOT = "tests/integration/test_scaling.py::test_the_model_fitted_here_predicts_message_sizes_it_was_not_fitted_on"
QUICK = "tests/unit/test_train.py::test_a_gpu_index_past_those_visible_names_the_count"


def _without_python_310(home: Path, ci: bool = False) -> tuple[dict, list[str]]:
    """An environment with no Python 3.10 on the PATH or in pyenv, and the make overrides to go with it."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        **({"CI": "true"} if ci else {}),
    }
    overrides = []
    if any(Path(p).exists() for p in ("/usr/bin/python3.10", "/usr/local/bin/python3.10")):
        overrides.append("OLDEST_PYTHON=")  # the system has one where the Makefile looks: hide it by hand
    return env, overrides


def _without_root() -> list[str]:
    """A user namespace in which this account is an ordinary user (id -u is 1000): root's files stay readable
    (the interpreter may live under /root), but every check for root (id -u, os.geteuid) says no."""
    return ["unshare", "--user", "--map-user=1000", "--map-group=1000"] if os.geteuid() == 0 else []


def test_make_test_without_python_310_or_root_passes_and_names_what_it_left_out(tmp_path):
    env, overrides = _without_python_310(tmp_path)
    args = f"{QUICK} {NEEDS_ROOT} -p no:cacheprovider --basetemp={tmp_path / 'pytest'}"
    done = subprocess.run(
        [
            *_without_root(),
            "make",
            "-s",
            "-C",
            str(ROOT),
            "-o",
            "test-deps",
            "test",
            f"VENV={sys.prefix}",
            "TEST_WORKERS=0",
            f"PYTEST_ARGS={args}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "1 passed, 1 skipped" in out
    lines = out.splitlines()
    oldest = [line for line in lines if line.startswith("make test: left out the oldest-Python run")]
    assert len(oldest) == 2, out[-3000:]  # said before the suite starts and again at its end
    assert lines[-1] == oldest[0] and "OLDEST_PYTHON=" in oldest[0]
    left_out = [line for line in lines if line.startswith("left out here: ")]
    assert left_out == [
        "left out here: 1 test: needs root and tc (iproute2) for a network namespace of its own with a shaped link"
    ], out[-3000:]


def test_ci_without_python_310_fails_at_once_naming_it(tmp_path):
    env, overrides = _without_python_310(tmp_path, ci=True)
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "oldest-check", *overrides], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[0] == (
        "make test: CI must run the oldest-Python tests, and no Python 3.10 is here (OLDEST_PYTHON)"
    )


def test_without_chromium_the_browser_lessons_run_headless_instead(tmp_path):
    """Where the browser tests skip, every lesson is still executed: headless."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no chromium, no chromedriver
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/integration/test_notebooks.py",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "top_to_bottom",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    collected = {
        line.split("[")[1].rstrip("]") for line in done.stdout.splitlines() if "top_to_bottom" in line and "[" in line
    }
    assert collected == {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}


def test_the_left_out_line_counts_each_reason_commonest_first():
    reasons = ["Slurm is not installed here", "needs root", "Slurm is not installed here"]
    assert left_out_line(reasons) == "left out here: 2 tests: Slurm is not installed here; 1 test: needs root"
    assert left_out_line([]) is None


@pytest.mark.parametrize("name", ["LICENSE", "CHANGELOG.md"])
def test_the_files_the_readme_points_to_exist(name):
    assert (ROOT / name).is_file() and f"]({name})" in (ROOT / "README.md").read_text()
