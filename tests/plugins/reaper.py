"""What a test session leaves running is stopped at its end (and fails the run in CI).

Every process the session starts inherits :data:`SESSION_MARK` in its environment (and the session's own temporary
folder); at the end, what still carries the mark — an engine, a kernel, a rank a test started and did not stop — is
killed and named. Read through psutil (a dependency of the test tools), which reads any process's environment.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

#: Marks every process the session starts (the variable is inherited): what is still running at the end was left.
SESSION_MARK = "DLSCALE_TEST_SESSION"
_own_mark: list[str] = []  # set in the process that made the mark (a nested session, as make test in a test, did not)


def mark_session() -> None:
    """In the session's first process: one temporary folder for everything its processes put in the system's
    (torchrun's torchelastic_* logs, clusters' sockets, kernels' files), removed at the end; the workers inherit it.
    (torch.compile's cache stays where torch keeps it, in the system's temporary folder, shared by runs.)"""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SESSION_MARK):
        return
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    )
    folder = tempfile.mkdtemp(prefix="dlscale-tests-")
    os.environ.update(TMPDIR=folder, **{SESSION_MARK: folder})
    tempfile.tempdir = None  # (gettempdir() caches its answer)
    _own_mark.append(folder)


def left_running(mark: str) -> list[tuple[int, str]]:
    """(pid, command) of the processes that carry this session's mark, other than this one and its test workers
    (pytest-xdist's): what a test or a notebook started and did not stop."""
    import psutil

    found, me = [], os.getpid()
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        if process.info["pid"] == me:
            continue
        try:
            environ = process.environ()
        except (psutil.Error, OSError):  # (gone meanwhile, or not ours to read)
            continue
        worker = process.info["ppid"] == me and "PYTEST_XDIST_WORKER" in environ
        if environ.get(SESSION_MARK) == mark and not worker:
            found.append((process.info["pid"], " ".join(process.info["cmdline"] or [])[:160]))
    return found


def stop_what_was_left(session, in_ci: bool) -> None:
    """Stop (and in CI fail on) every process the session left running; remove the session's temporary folder."""
    import signal

    if not _own_mark:
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
        if in_ci:
            session.exitstatus = 1
    shutil.rmtree(mark, ignore_errors=True)
