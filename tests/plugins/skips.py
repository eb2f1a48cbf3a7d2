"""What a run leaves out: the gpu tests skip themselves without a CUDA GPU; in CI any other skip fails the run;
every run ends with one line naming what it left out, and why."""

from __future__ import annotations

import os
import sys

import pytest
import torch

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: What a run without a CUDA GPU says of the tests marked gpu (they run with `pytest -m gpu` on a GPU node).
NO_GPU = "no CUDA GPU here: the gpu tests run on a GPU node (pytest -m gpu)"

_skipped_in_ci: list[str] = []
#: Each skipped test's reason, for the one line at the end that says what this run left out.
_skip_reasons: list[str] = []


def skip_gpu_tests(items) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    if not report.skipped or hasattr(report, "wasxfail"):  # (an expected failure ran: it is not left out)
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


def fail_on_skips_in_ci(session) -> None:
    if _skipped_in_ci:
        print(f"\nCI: {len(_skipped_in_ci)} test(s) that must run in CI were skipped:", file=sys.stderr)
        for nodeid in _skipped_in_ci:
            print(f"  {nodeid}", file=sys.stderr)
        session.exitstatus = 1
