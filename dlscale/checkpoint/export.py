"""``dlscale export``: a run's newest checkpoint as one whole model file, written as a checkpoint is.

OUT holds ``{"model": state_dict, "config": the run's config}`` and loads with ``torch.load(path,
weights_only=True)``. It is written whole or not at all (:func:`~dlscale.checkpoint.store.replace_synced`): an
export that fails (a full disk, an interrupt) leaves the previous OUT as it was, and a link at OUT is replaced,
never written through.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlscale.checkpoint.formats import load_model
from dlscale.checkpoint.store import CheckpointError, disk_full, replace_synced


def export_model(run_dir: str | Path, out: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Write the whole model of ``run_dir``'s newest checkpoint and its config to ``out``; return both."""
    from dlscale.config import load_config

    path = check_export_path(out)  # (before the checkpoint is read: a wrong OUT is said at once)
    model = load_model(run_dir)
    config = load_config(str(Path(run_dir) / "config.yaml")).to_dict()
    state = {"model": model.state_dict(), "config": config}
    existed = path.is_file()
    try:
        replace_synced(path, lambda handle: torch.save(state, handle))
    except (OSError, RuntimeError) as err:  # (torch's writer wraps a failed write in a RuntimeError)
        raise CheckpointError(_not_written(path, err, existed)) from None
    return model, config


def check_export_path(out: str | Path) -> Path:
    """``out`` as a path, or a :class:`CheckpointError` naming it where no model file can be written there: a folder,
    a device or a pipe, or a folder that does not exist or that this user cannot write."""
    path = Path(out)
    if str(out).endswith(("/", os.sep)) or path.is_dir():
        raise CheckpointError(f"{out} is a folder: name the file to write in it, e.g. {path / 'model.pt'}")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise CheckpointError(f"{out} is not a regular file (a device, a pipe or a socket): name a file, e.g. model.pt")
    folder = path.absolute().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise CheckpointError(
            f"{out} cannot be written: {folder} is not a folder you can write; create it, or name another OUT"
        )
    return path


def _not_written(path: Path, err: BaseException, existed: bool) -> str:
    """One line: which folder is full (or what failed), and that the previous export is intact."""
    folder = path.absolute().parent
    kept = "the file there is unchanged" if existed else "nothing was left there"
    if disk_full(err):
        return (
            f"{path} was not written: {folder} is on a full disk or over its quota; {kept}. Free space there, "
            f"or name an OUT on another disk"
        )
    why = " ".join((getattr(err, "strerror", None) or str(err)).split())[:160]
    return f"{path} was not written in {folder} ({why}); {kept}: name an OUT in a folder you can write"
