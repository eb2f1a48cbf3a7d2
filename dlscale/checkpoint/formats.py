"""One place that chooses the format: a whole-model file or a sharded folder, to save, resume or read a model.

- :func:`save_training_checkpoint`: every rank writes its shards when the parameters are split
  (FSDP, tensor parallelism; :mod:`~dlscale.checkpoint.sharded`), else rank 0 writes the whole
  state (:mod:`~dlscale.checkpoint.whole`);
- :func:`load_latest_checkpoint`: the newest checkpoint of a run, whichever format, for a resume;
- :func:`load_model`: the whole model of a run's newest checkpoint in one process, whatever
  wrote it (for evaluation or ``dlscale export``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlscale.checkpoint import whole
from dlscale.checkpoint.store import CheckpointError, checkpoint_dir, list_checkpoints


def save_training_checkpoint(run_dir: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                             extras: dict[str, Any], *, sharded: bool, is_main: bool, keep: int = 2) -> Path | None:
    """Write step ``step``'s checkpoint in the format the layout needs; returns its path (None off rank 0 if whole).

    Collective when ``sharded``: every rank calls it. ``extras`` is
    :func:`dlscale.checkpoint.state.training_extras` of this rank.
    """
    if sharded:
        from dlscale.checkpoint.sharded import save_sharded_checkpoint  # (only runs that shard need DCP)
        return save_sharded_checkpoint(run_dir, step, model, optimizer, extras, keep=keep)
    if not is_main:
        return None
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **extras}
    return whole.save_checkpoint(run_dir, step, state, keep=keep)


def load_latest_checkpoint(run_dir: str | Path, model: nn.Module | None = None,
                           optimizer: torch.optim.Optimizer | None = None,
                           check: Callable[[dict[str, Any] | None, Path], Any] | None = None
                           ) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, or None if the run has none.

    A file is read whole (an unreadable newest file falls back to the one before). A
    sharded folder is read straight into ``model`` and ``optimizer`` (each rank its part,
    whatever the world size that wrote it) by every rank together; the dict returned then
    holds the rest of the state. ``check(recorded config, path)`` runs before any weight is
    loaded into ``model`` (a resume refuses another run's checkpoint there).
    """
    paths = list_checkpoints(run_dir)
    if paths and paths[-1].is_dir():
        if model is None or optimizer is None:
            raise CheckpointError(f"{paths[-1]} is a sharded checkpoint: load it with the model and optimizer, or "
                                  f"with dlscale.checkpoint.load_model")
        from dlscale.checkpoint import sharded
        if check is not None:
            check(sharded.recorded_config(paths[-1]), paths[-1])
        return paths[-1], sharded.load_sharded_checkpoint(paths[-1], model, optimizer)
    found = whole.load_newest_file(paths, run_dir)
    if found is not None and check is not None:
        check(found[1].get("config"), found[0])
    return found


def _head_outputs(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> tuple[int, torch.dtype]:
    """The output count and dtype of a saved model: the length of its last bias, the head's (both models end in one)."""
    shape, dtype = [value for name, value in shapes.items() if name.endswith("bias")][-1]
    return shape[0], dtype


def load_model(run_dir: str | Path, in_channels: int = 1, num_outputs: int | None = None) -> nn.Module:
    """The model of a run folder's newest checkpoint, whole, in this process (for evaluation or export).

    Whatever wrote it: one process, DDP, Horovod, or FSDP and tensor parallelism on any
    number of ranks (a sharded folder is gathered into the one model). The architecture
    comes from the run's ``config.yaml``.
    """
    from dlscale.config import load_config
    from dlscale.models import build_model

    run_dir = Path(run_dir)
    paths = list_checkpoints(run_dir)
    if not paths:
        raise CheckpointError(f"{checkpoint_dir(run_dir)} holds no checkpoint; train with checkpoints first")
    cfg = load_config(str(run_dir / "config.yaml"))
    newest = paths[-1]
    if newest.is_dir():
        from dlscale.checkpoint import sharded
        shapes = sharded.weight_shapes(newest)  # (from the metadata: no tensor is read)
    else:  # the newest file that loads: a corrupt newest one falls back to the one before, as a resume does
        newest, checkpoint = whole.load_newest_file([p for p in paths if not p.is_dir()], run_dir)
        state = checkpoint["model"]  # (read once, for the shapes and the weights)
        shapes = {name: (tuple(value.shape), value.dtype) for name, value in state.items()}
    outputs, dtype = _head_outputs(shapes)
    model = build_model(cfg, in_channels, num_outputs or outputs).to(dtype)
    if newest.is_dir():
        sharded.load_weights(newest, model)
    else:
        model.load_state_dict(state)
    return model
