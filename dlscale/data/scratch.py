"""The folders the data layer makes beside a user's files, and the only ones it ever removes.

:func:`~dlscale.data.shards.generate_dataset` and :func:`~dlscale.data.loader.stage_data` build under a
hidden temporary name (``.NAME.xxxxxxxx``) and rename it into place. Each temporary folder holds an owner
file (host and PID): a later call removes those whose owner on this host is gone (a ``kill -9`` left them),
and nothing else. A staged copy keeps a marker file (:data:`STAGED`), so staging replaces only a copy it
made itself; a folder of the same name that it did not make is refused, never deleted.
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


def release(folder: Path) -> Path:
    """``folder`` without its owner file, ready to be renamed into place."""
    (folder / OWNER).unlink(missing_ok=True)
    return folder
