"""The whole-model format: one process (rank 0) writes one ``.pt`` file with the whole training state.

Used when every rank holds the whole model (one process, DDP, Horovod). The file is written
under a temporary name, fsynced and renamed into place (:mod:`~dlscale.checkpoint.store`).
"""

from __future__ import annotations

import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.store import (
    CheckpointError,
    UnreadableCheckpoint,
    checkpoint_dir,
    checkpoint_paths,
    keep_newest,
    save_synced,
)


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically, keeping the ``keep`` newest."""
    path, tmp = checkpoint_paths(run_dir, step, sharded=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_synced(state, tmp)  # on disk before the rename makes it visible
    os.replace(tmp, path)
    keep_newest(run_dir, keep, written=step)
    return path


def read_file(path: Path) -> dict[str, Any]:
    """A checkpoint file's contents, or :class:`UnreadableCheckpoint` saying why not (damaged, empty, not a checkpoint).

    ``weights_only=True``: only tensors and plain containers load, never pickled code.
    """
    if path.stat().st_size == 0:
        raise UnreadableCheckpoint(f"{path.name} is empty (0 bytes)")
    _refuse_compressed(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way
        raise UnreadableCheckpoint(
            f"{path.name}: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        ) from None
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, dict) or not model or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise UnreadableCheckpoint(
            f"{path.name} loads but holds no model weights (a dlscale checkpoint is a dict whose "
            f"'model' maps names to tensors)"
        )
    return state


def _refuse_compressed(path: Path) -> None:
    """:class:`UnreadableCheckpoint` for a zip whose records are compressed: ``torch.save`` stores every record as it
    is, so a compressed one is not the kit's, and could inflate far past the file's size (a zip bomb) on load."""
    try:
        with zipfile.ZipFile(path) as archive:
            packed = [info.filename for info in archive.infolist() if info.compress_type != zipfile.ZIP_STORED]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # (not a zip: torch.load says what it is)
    if packed:
        raise UnreadableCheckpoint(
            f"{path.name} holds {len(packed)} compressed record(s) ({packed[0][:80]}), which torch.save never writes: "
            f"not a checkpoint of the kit"
        )


def load_newest_file(paths: list[Path], run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest of ``paths`` (checkpoint files, oldest first) that loads, or None if there are none.

    A newest file that fails to load (a disk filled up, a copy broke off) is reported and
    the one before it is used; if every file fails, a :class:`CheckpointError` says so.
    """
    return newest_readable(paths, run_dir, read_file)


def newest_readable(paths: list[Path], run_dir: str | Path, read: Callable[[Path], Any]) -> tuple[Path, Any] | None:
    """``(path, read(path))`` for the newest of ``paths`` that ``read`` opens without :class:`UnreadableCheckpoint`.

    Each one skipped is reported in a warning; when none opens, a :class:`CheckpointError` lists them all.
    """
    failures = []
    for path in reversed(paths):
        try:
            return path, read(path)
        except UnreadableCheckpoint as err:
            failures.append(str(err))
            warnings.warn(f"checkpoint {path} could not be loaded ({err}); trying an older one", stacklevel=3)
    if failures:
        raise CheckpointError(
            f"no checkpoint in {checkpoint_dir(run_dir)} could be loaded: {'; '.join(failures)}. "
            f"Start afresh with resume=false, or restore a good checkpoint"
        )
    return None
