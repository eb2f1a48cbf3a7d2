"""The folders the data layer makes beside a user's files, and the only ones it ever removes.

:func:`~dlscale.data.shards.generate_dataset` and :func:`~dlscale.data.loader.stage_data` build under a
hidden temporary name (``.NAME.xxxxxxxx``) and rename it into place. Each temporary folder holds an owner
file (host and PID): a later call removes those whose owner on this host is gone (a ``kill -9`` left them),
and nothing else. A staged copy keeps a marker file (:data:`STAGED`), so staging replaces only a copy it
made itself; a folder of the same name that it did not make is refused, never deleted.

A temporary folder is made readable by its owner alone (mode 0700: nobody reads it half-built); :func:`release`
gives it the mode the user's umask gives any new folder before it is renamed into place, so that a data set
generated into a shared folder is read by the room as the user's other files are (``dlscale data generate
--shared`` makes it readable by everyone whatever the umask: :func:`make_readable`).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

#: In a temporary folder while it is being built: "host pid" of the process building it.
OWNER = ".dlscale-owner"
#: In a staged copy of a data folder: made by dlscale's staging, so staging may replace it.
STAGED = ".dlscale-staged"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temp_dirs(parent: Path, name: str) -> list[Path]:
    """Remove the temporary folders for ``name`` in ``parent`` whose builder on this host has died; return them.

    Only folders with an owner file naming this host and a PID that no longer runs go: a live builder's, another
    host's (a shared file system) and anything without an owner file stay.
    """
    removed = []
    for path in parent.glob(f".{name}.*"):
        try:
            host, pid = (path / OWNER).read_text().split()
            pid_number = int(pid)
        except (OSError, ValueError):
            continue
        if host == socket.gethostname() and not _alive(pid_number):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_temp_dir(parent: Path, name: str) -> Path:
    """A new hidden temporary folder for building ``parent/name``, owned by this process (stale twins removed)."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(parent, name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    (tmp / OWNER).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    return tmp


def current_umask() -> int:
    """This process's umask: read from ``/proc`` where Linux reports it (left alone), else set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def make_readable(folder: Path) -> None:
    """Everything under ``folder`` (itself included) readable by its group and everyone: folders ``r-x``, files
    ``r--`` added to what they had (nothing taken away, nothing made writable)."""
    for where, _, files in os.walk(folder):
        Path(where).chmod(Path(where).stat().st_mode & 0o7777 | 0o555)
        for name in files:
            path = Path(where) / name
            path.chmod(path.stat().st_mode & 0o7777 | 0o444)


def release(folder: Path, shared: bool = False) -> Path:
    """``folder`` without its owner file, ready to be renamed into place: its mode what the umask gives a new folder
    (instead of the 0700 it was built under), or with ``shared`` everything in it readable by everyone."""
    (folder / OWNER).unlink(missing_ok=True)
    folder.chmod(0o777 & ~current_umask())
    if shared:
        make_readable(folder)
    return folder
