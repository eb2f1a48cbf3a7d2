"""Where a run's checkpoints live and how they reach the disk: names, listing, clearing, synced writes.

A checkpoint of step N is ``checkpoints/ckpt-0000000N.pt`` (a file: one process wrote the
whole state, :mod:`~dlscale.checkpoint.whole`) or ``checkpoints/ckpt-0000000N`` (a folder:
every rank wrote its shards, :mod:`~dlscale.checkpoint.sharded`). Both are written under a
temporary name (``.ckpt-….tmp``) and renamed into place when whole, so a job killed mid-write
leaves the previous checkpoint intact and resume never reads half a checkpoint.

Only a fresh start (``resume=false``) removes an earlier run's checkpoints
(:func:`clear_checkpoints`); a resumed run keeps the one it resumed from until a newer one
has been renamed into place, so a job that dies twice loses nothing. Pruning (:func:`keep_newest`)
counts only checkpoints up to the one just written: a newer-numbered one that the resume could not
load is set aside in ``checkpoints/unreadable/``, and can never push the good ones out.

Every other file the kit replaces (an export, a recipe, an exercise) is written the same way, by
:func:`replace_synced`: whole or not at all, and never through a link.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from dlscale.errors import DlscaleError

_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a full quota
_PROBE_BYTES = 16 * 1024
_NAME = re.compile(r"^ckpt-(\d{8})(\.pt)?$")  # a file (one process wrote it) or a folder (sharded)


class CheckpointError(DlscaleError):
    """No usable checkpoint where one was expected; the message names the file."""


class UnreadableCheckpoint(CheckpointError):
    """One checkpoint cannot be used (damaged, empty, not a checkpoint, unsafe): the loaders try the one before."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_paths(run_dir: str | Path, step: int, sharded: bool) -> tuple[Path, Path]:
    """(the final name, the temporary name) of step ``step``'s checkpoint: a ``.pt`` file, or a folder if sharded."""
    name = f"ckpt-{step:08d}" + ("" if sharded else ".pt")
    folder = checkpoint_dir(run_dir)
    return folder / name, folder / f".{name}.tmp"


def check_writable(run_dir: str | Path) -> None:
    """Fail at the start, naming the folder, where the run folder or its checkpoints cannot be written (a read-only
    copy, a full quota), rather than at the first checkpoint, after the training it was meant to keep."""
    for folder in (Path(run_dir), checkpoint_dir(run_dir)):
        probe = folder / f".write-test-{socket.gethostname()}-{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as handle:  # (a few KiB, synced: an empty file is created even on a full disk)
                handle.write(bytes(_PROBE_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            if err.errno in _FULL:
                raise CheckpointError(
                    f"{folder} is on a full disk or over its quota ({err.strerror}): free space "
                    f"there, or choose another run_dir (on a cluster, under $SCRATCH)"
                ) from None
            raise CheckpointError(
                f"{folder} cannot be written ({err.strerror or err}): choose a run_dir you can "
                f"write (run_dir=runs/<name>; on a cluster, under $SCRATCH)"
            ) from None
        finally:
            probe.unlink(missing_ok=True)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints of a run, files and sharded folders, oldest first (by step, not by file time)."""
    folder = checkpoint_dir(run_dir)
    found = [p for p in folder.glob("ckpt-*") if _NAME.search(p.name)] if folder.is_dir() else []
    return sorted(found, key=step_of)


def clear_checkpoints(run_dir: str | Path) -> int:
    """Remove a run folder's checkpoints and half-written temporary files; return how many went."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return 0
    doomed = [*list_checkpoints(run_dir), *folder.glob(".ckpt-*.tmp")]
    for path in doomed:
        remove_checkpoint(path)
    shutil.rmtree(folder / "unreadable", ignore_errors=True)  # (the earlier run's, set aside by keep_newest)
    return len(doomed)


def remove_checkpoint(path: Path) -> None:
    """Delete one checkpoint, a file or a sharded folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def step_of(path: Path) -> int:
    """The step a checkpoint's name records."""
    return int(_NAME.search(path.name).group(1))


def keep_newest(run_dir: str | Path, keep: int, written: int) -> list[Path]:
    """Remove all but the ``keep`` newest checkpoints up to step ``written``, the one just written (it always stays).

    A checkpoint numbered after ``written`` can only be one the resume could not load (it would have
    continued from it otherwise): it is moved to ``checkpoints/unreadable/``, never counted as the newest
    and never deleted, so a corrupt file cannot push the good ones out. Returns the paths moved there.
    """
    paths = list_checkpoints(run_dir)
    later = [path for path in paths if step_of(path) > written]
    for old in [path for path in paths if step_of(path) <= written][:-keep]:
        remove_checkpoint(old)
    return [set_aside(path) for path in later]


def set_aside(path: Path) -> Path:
    """Move a checkpoint that could not be loaded to ``checkpoints/unreadable/`` (kept for a post-mortem)."""
    folder = path.parent / "unreadable"
    folder.mkdir(exist_ok=True)
    target = folder / path.name
    copies = 1
    while target.exists():
        target, copies = folder / f"{path.name}.{copies}", copies + 1
    os.replace(path, target)
    print(f"dlscale: {path} could not be loaded when this run resumed; moved to {target}", flush=True)
    return target


def save_synced(obj: Any, path: Path) -> None:
    """``torch.save`` and fsync: the bytes are on disk when this returns. A write that fails (a full disk, a quota)
    removes the partial file and raises a :class:`CheckpointError` that says the last good checkpoint is intact."""
    try:
        write_synced(path, lambda handle: torch.save(obj, handle))
    except (OSError, RuntimeError) as err:
        why = (
            "the disk is full or over its quota"
            if disk_full(err)
            else f"it could not be written ({' '.join(str(err).split())[:160]})"
        )
        raise CheckpointError(
            f"the checkpoint {path.name} in {path.parent} was not written: {why}. The last good "
            f"checkpoint there is intact: free space (or choose another run_dir), then resume=true"
        ) from None


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or the error it wraps) is a full disk or a full quota."""
    cause = getattr(err, "errno", None) or getattr(err.__cause__ or err.__context__, "errno", None)
    return cause in _FULL


def write_synced(path: Path, write: Callable[[BinaryIO], object], *, new: bool = False) -> None:
    """``write`` into the file ``path``, then fsync it: the bytes are on disk when this returns. With ``new``, ``path``
    must not exist (not even as a link: nothing is written through one). A write that fails removes the partial
    file and raises the error as it came."""
    handle = open(path, "xb" if new else "wb")  # (a failure here leaves nothing of ours to remove)
    try:
        with handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def replace_synced(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole or not at all, as a checkpoint is: ``write`` fills a new file beside it (``.NAME.*.tmp``,
    in the same folder, so that the rename stays on one file system), which is fsynced and renamed over ``path``.

    A link at ``path`` is replaced, never written through; a file there keeps its permissions. On any failure (a
    full disk, an interrupt) ``path`` is as it was, the temporary file is removed and the error raised."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    write_synced(tmp, write, new=True)
    try:
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _keep_mode(path: Path, tmp: Path) -> None:
    """Give ``tmp`` the permissions of the file ``path`` it replaces (an executable script stays executable)."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(old.st_mode):
        os.chmod(tmp, stat.S_IMODE(old.st_mode))
