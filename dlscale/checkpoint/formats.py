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
from dlscale.checkpoint.store import CheckpointError, UnreadableCheckpoint, checkpoint_dir, list_checkpoints


def save_training_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extras: dict[str, Any],
    *,
    sharded: bool,
    is_main: bool,
    keep: int = 2,
) -> Path | None:
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


def load_latest_checkpoint(
    run_dir: str | Path,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    check: Callable[[dict[str, Any] | None, Path], Any] | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that opens, or None if the run has none.

    A file is read whole; a sharded folder's metadata and training state are read (safely: no code in them
    runs), then its tensors straight into ``model`` and ``optimizer`` (each rank its part, whatever the world
    size that wrote it) by every rank together; the dict returned then holds the rest of the state. A newest
    checkpoint that does not open (damaged, empty, crafted) is reported and the one before it is used.
    ``check(recorded config, path)`` runs before any weight is loaded into ``model`` (a resume refuses
    another run's checkpoint there).
    """
    paths = list_checkpoints(run_dir)
    if paths and paths[-1].is_dir() and (model is None or optimizer is None):
        raise CheckpointError(
            f"{paths[-1]} is a sharded checkpoint: load it with the model and optimizer, or "
            f"with dlscale.checkpoint.load_model"
        )

    def read(path: Path) -> dict[str, Any]:
        state = _open(path)
        if check is not None:  # (another run's checkpoint is refused, not skipped)
            check(state.get("config"), path)
        if model is not None:  # (one that opens but does not fit the model is skipped like one that does not open)
            _check_fits(path, state, model)
        return state

    found = whole.newest_readable(paths, run_dir, read)
    if found is None:
        return None
    path, state = found
    if path.is_dir():
        from dlscale.checkpoint import sharded

        return path, sharded.load_sharded_checkpoint(path, model, optimizer)
    return path, state


def _saved_shapes(path: Path, state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each saved weight's shape, by name: from a file's tensors, or a sharded folder's metadata (nothing read)."""
    if path.is_dir():
        from dlscale.checkpoint import sharded

        return {name: shape for name, (shape, _) in sharded.weight_shapes(path).items()}
    return {name: tuple(value.shape) for name, value in state["model"].items()}


def misfit(saved: dict[str, tuple[int, ...]], model: nn.Module) -> str | None:
    """How the saved weights differ from ``model``'s (a name missing or extra, a shape), or None where they fit.

    The shapes are global ones (a DTensor's ``shape`` is the whole tensor's), so a sharded model compares alike. A
    pipeline's part of a model (``pipeline_part``: this rank's stages, under the whole model's names) takes its own
    weights from a checkpoint that holds them all: the others' are not extra."""
    live = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    for name in live:
        if name not in saved:
            return f"it has no weight {name}"
        if tuple(saved[name]) != live[name]:
            return f"its {name} is {list(saved[name])} where the model's is {list(live[name])}"
    extra = [] if getattr(model, "pipeline_part", False) else sorted(saved.keys() - live.keys())
    return f"it holds {len(extra)} weight(s) the model has not ({extra[0]})" if extra else None


def _check_fits(path: Path, state: dict[str, Any], model: nn.Module) -> None:
    """:class:`UnreadableCheckpoint` if the checkpoint's weights would not load into ``model``."""
    why = misfit(_saved_shapes(path, state), model)
    if why:
        raise UnreadableCheckpoint(f"{path.name} does not fit the model: {why}")


def _open(path: Path) -> dict[str, Any]:
    """A file's whole state, or a sharded folder's training state (its tensors are read later, into the model)."""
    if path.is_dir():
        from dlscale.checkpoint import sharded

        return sharded.open_folder(path)
    return whole.read_file(path)


def _head_outputs(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], path: Path) -> tuple[int, torch.dtype]:
    """The output count and dtype of a saved model: the length of its last bias, the head's (both models end in one)."""
    biases = [value for name, value in shapes.items() if name.endswith("bias") and len(value[0]) == 1]
    if not biases:
        raise CheckpointError(f"{path} holds no model of the kit (no output layer's bias among its weights)")
    shape, dtype = biases[-1]
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
    # The newest that opens, whichever format: a damaged, empty or crafted newest one falls back, as a resume does.
    newest, checkpoint = whole.newest_readable(paths, run_dir, _open)
    if newest.is_dir():
        from dlscale.checkpoint import sharded

        shapes = sharded.weight_shapes(newest)  # (from the metadata: no tensor is read)
    else:
        state = checkpoint["model"]  # (read once, for the shapes and the weights)
        shapes = {name: (tuple(value.shape), value.dtype) for name, value in state.items()}
    outputs, dtype = _head_outputs(shapes, newest)
    model = build_model(cfg, in_channels, num_outputs or outputs).to(dtype)
    why = misfit({name: shape for name, (shape, _) in shapes.items()}, model)  # (before any tensor is read)
    if why:
        raise CheckpointError(
            f"{newest} holds the weights of another model than {run_dir}/config.yaml describes "
            f"(model={cfg.model}, width={cfg.width}, depth={cfg.depth}): {why[:200]}; restore the run's own config.yaml"
        )
    if newest.is_dir():
        sharded.load_weights(newest, model)
    else:
        model.load_state_dict(state)
    return model
