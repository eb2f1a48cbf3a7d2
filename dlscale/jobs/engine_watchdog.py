"""Stop a notebook's engines when its kernel is gone, however it went.

ipyparallel stops a cluster when the Python process that started it exits normally. A kernel that is
killed instead (a shutdown that outlasts the kernel manager's wait, a restart, a JupyterHub culling an
idle server) leaves its controller and engines running, each in a process session of its own, on a
node others share. :func:`watch` starts a small process that waits for the kernel to go, then ends
those sessions (TERM, then KILL) and removes the cluster's file (``cluster-<id>.json`` in the IPython profile,
which would name a running cluster that is gone); it ends by itself when the engines stop first.

This file imports only the standard library: it runs as a script, so the watchdog does not load torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: How often the watchdog looks, and how long the engines get between TERM and KILL.
POLL_S = 0.5
GRACE_S = 5.0


def watch(kernel: int, sessions: list[int], cluster_file: str = "") -> subprocess.Popen:
    """Start the watchdog that ends the process sessions ``sessions`` once the process ``kernel`` is gone, and
    removes ``cluster_file`` (none: "")."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(kernel), cluster_file, *map(str, sessions)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _exists(kill: object, target: int) -> bool:
    """Whether a process (``kill=os.kill``) or a process session (``os.killpg``) is there, by signal 0."""
    try:
        kill(target, 0)  # type: ignore[operator]
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    if not _exists(os.kill, pid):
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _session_running(session: int) -> bool:
    return _exists(os.killpg, session)


def _signal(sessions: list[int], sig: int) -> None:
    for session in sessions:
        with contextlib.suppress(OSError):
            os.killpg(session, sig)


def main(kernel: int, sessions: list[int], cluster_file: str = "") -> None:
    while _running(kernel) and any(_session_running(s) for s in sessions):
        time.sleep(POLL_S)
    if not any(_session_running(s) for s in sessions):
        return  # stopped by the kernel itself (ipyparallel removed its file)
    _signal(sessions, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(_session_running(s) for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal(sessions, signal.SIGKILL)
    if cluster_file:  # (its controller and engines are gone: nothing is left for the file to name)
        with contextlib.suppress(OSError):
            os.remove(cluster_file)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(arg) for arg in sys.argv[3:]], sys.argv[2])
