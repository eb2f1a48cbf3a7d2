"""One run owns its folder: an advisory lock on ``run_dir/.dlscale-lock`` for as long as the run trains.

Two runs writing one folder mix their validation rows, remove each other's metrics and checkpoints, and
leave a summary of neither. The first run's main rank takes an exclusive ``flock`` on the folder's lock file
and writes its host and PID there; a second run is refused in one line naming them. The kernel releases the
lock when the process ends, however it ends, so a killed run never blocks its own resume.

A lock file that cannot be opened or is not a plain file (a symbolic link, a folder, a FIFO, another user's file in a
shared folder) is a refusal in one line naming it: a run never goes on unlocked because its lock was tampered with.
Only on a file system without ``flock`` (some Lustre and NFS mounts) does the run go on, unlocked, and say so once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from dlscale import distributed
from dlscale.errors import DlscaleError

LOCK_FILE = ".dlscale-lock"


#: ``flock`` errors of a file system that has no locks (the run goes on, saying so); any other failure refuses.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


class FolderBusyError(DlscaleError):
    """Another run is training in this run folder, or the folder's lock file cannot be taken."""


def _owner(path: Path) -> str:
    """The user owning ``path`` (a name, or the uid), for a refusal."""
    uid = path.lstat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _unusable(lock: Path, err: OSError | None) -> str | None:
    """Why ``lock`` cannot be the run's lock file (it is there, but no plain file this process can open), or None
    where it is not there and could not be made (a folder that cannot be written: the write check names it)."""
    try:
        mode = lock.lstat().st_mode
    except OSError:
        return None
    if err is not None and err.errno == errno.EROFS:
        return None  # (a read-only file system: the write check names the folder)
    if not stat.S_ISREG(mode):  # (O_NOFOLLOW refuses a link; a folder, a FIFO or a device holds no lock)
        kind = "symbolic link" if stat.S_ISLNK(mode) else "folder" if stat.S_ISDIR(mode) else "FIFO, socket or device"
        return f"{lock} is a {kind}, not the run's lock file, so the folder cannot be locked: move it away, run again"
    if err is not None and err.errno in (errno.EACCES, errno.EPERM):
        return (
            f"{lock} belongs to {_owner(lock)} and cannot be opened by this user ({err.strerror}): another user's "
            f"run may hold the folder; give this run its own folder (run_dir=runs/<new name>)"
        )
    why = err.strerror if err is not None else "not a regular file"
    return f"{lock} cannot be opened ({why}), so the folder cannot be locked: move it away and run again"


def _open(lock: Path) -> tuple[int | None, str | None]:
    """(a descriptor of the plain lock file, or None; why it is refused, or None where the folder is not writable)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # (a FIFO must not block the open)
    try:
        fd = os.open(lock, flags, 0o644)
    except OSError as err:
        return None, _unusable(lock, err)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # (what was opened, not what the name points to now)
        os.close(fd)
        return None, _unusable(lock, None) or f"{lock} is not a regular file: move it away and run again"
    return fd, None


def _take(run_dir: Path) -> tuple[int | None, str | None]:
    """(the locked file descriptor or None, why the folder is refused or None)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None, None  # (a folder that cannot be written: the run's write check says so, naming it)
    fd, refused = _open(run_dir / LOCK_FILE)
    if fd is None:
        return None, refused
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in _NO_FLOCK:
            os.close(fd)
            print(
                f"dlscale: {run_dir} cannot be locked on this file system ({err.strerror}); make sure no other run "
                f"trains in it",
                flush=True,
            )
            return None, None
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            return None, f"{run_dir / LOCK_FILE} cannot be locked ({err.strerror}): move it away and run again"
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
