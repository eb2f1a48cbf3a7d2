"""One run owns its folder: an advisory lock on ``run_dir/.dlscale-lock`` for as long as the run trains.

Two runs writing one folder mix their validation rows, remove each other's metrics and checkpoints, and
leave a summary of neither. The first run's main rank takes an exclusive ``flock`` on the folder's lock file
and writes its host and PID there; a second run is refused in one line naming them. The kernel releases the
lock when the process ends, however it ends, so a killed run never blocks its own resume.

On a file system without ``flock`` (some Lustre and NFS mounts) the lock cannot be taken: the run goes on,
unlocked, and says so once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from dlscale import distributed
from dlscale.errors import DlscaleError

LOCK_FILE = ".dlscale-lock"


class FolderBusyError(DlscaleError):
    """Another run is training in this run folder."""


def _take(run_dir: Path) -> tuple[int | None, str | None]:
    """(the locked file descriptor or None, why the folder is refused or None)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return None, None  # (a folder that cannot be written: the run's write check says so, naming it)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            print(
                f"dlscale: {run_dir} cannot be locked on this file system ({err.strerror}); make sure no other run "
                f"trains in it",
                flush=True,
            )
            return None, None
        holder = os.pread(fd, 200, 0).decode(errors="replace").split()
        os.close(fd)
        who = f"process {holder[1]} on {holder[0]}" if len(holder) == 2 else "another process"
        return None, (
            f"{run_dir} is in use by another run ({who}); wait for it to end, or give this run its own "
            f"folder (run_dir=runs/<new name>)"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
    return fd, None


@contextlib.contextmanager
def own_run_folder(run_dir: Path, is_main: bool) -> Iterator[None]:
    """Hold ``run_dir``'s lock on the main rank for the block; every rank raises :class:`FolderBusyError` when another
    run holds it. Collective in a distributed job: every rank enters it."""
    fd, refused = _take(run_dir) if is_main else (None, None)
    refused = distributed.broadcast_object(refused)  # (every rank stops alike, none waits on a missing peer)
    if refused:
        raise FolderBusyError(refused)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # (closing releases the lock)
