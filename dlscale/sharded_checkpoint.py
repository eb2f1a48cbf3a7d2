"""Sharded checkpoints for FSDP and tensor parallelism, through ``torch.distributed.checkpoint`` (DCP).

When no rank holds the whole model, no rank can write it alone. Every rank writes its
shards into one folder with DCP, which also records where each piece of each tensor lives
(``.metadata``), so the folder loads into *any* layout: the same ranks (an exact resume),
fewer or more ranks (resharding), or one process (:func:`load_sharded_weights`).

The folder is written as ``.ckpt-NNNNNNNN.tmp`` and renamed to ``ckpt-NNNNNNNN`` by rank 0
only after every rank has finished its part, so a job killed while writing leaves a
temporary folder that resume never reads, and the previous checkpoint stays. Beside the
tensors: ``training.pt`` (schedule, scaler, position, config; rank 0) and one
``rng-rankNNNNN.pt`` per rank (each rank's random generators).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import checkpoint_dir, list_checkpoints, remove_checkpoint, save_synced
from .distributed import barrier


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save_sharded_checkpoint(run_dir: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                            extras: dict[str, Any], keep: int = 2) -> Path:
    """Every rank writes its part of step ``step``; rank 0 renames the folder into place and keeps ``keep``.

    ``extras`` is :func:`dlscale.checkpoint.training_extras` of this rank (its ``rng`` is
    saved per rank; the rest by rank 0). Collective: every rank calls it.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = checkpoint_dir(run_dir)
    final, tmp = folder / f"ckpt-{step:08d}", folder / f".ckpt-{step:08d}.tmp"
    rank = _rank()
    if rank == 0:
        remove_checkpoint(tmp)  # a half-written folder of an earlier, killed attempt at this step
        tmp.mkdir(parents=True)
    barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    rest = dict(extras)
    save_synced(rest.pop("rng"), tmp / f"rng-rank{rank:05d}.pt")
    if rank == 0:
        save_synced(rest, tmp / "training.pt")
    barrier()  # every rank's files are on disk
    if rank == 0:
        os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep]:
            remove_checkpoint(old)
    barrier()  # nobody goes on (or resumes) before the folder has its name
    return final


def load_sharded_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a sharded folder into ``model`` and ``optimizer`` (any layout); return the rest of the state.

    Collective when distributed. A rank that did not exist in the run that wrote the folder
    (resharded to more ranks) takes rank 0's random generators.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rest = torch.load(path / "training.pt", map_location="cpu", weights_only=True)
    own = path / f"rng-rank{_rank():05d}.pt"
    rest["rng"] = torch.load(own if own.exists() else path / "rng-rank00000.pt", map_location="cpu",
                             weights_only=True)
    return rest


def load_sharded_weights(path: Path, build: Callable[[int], nn.Module], num_outputs: int | None = None) -> nn.Module:
    """The whole model of a sharded folder, in this process: ``build(num_outputs)`` filled from the shards.

    ``num_outputs`` defaults to the length of the last saved bias (the head's).
    """
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    head = [value for key, value in metadata.items() if key.startswith("model.") and key.endswith("bias")][-1]
    model = build(num_outputs or head.size[0]).to(head.properties.dtype)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # (one process is the intent)
        dcp.load(state, checkpoint_id=path, no_dist=True)
    model.load_state_dict(state["model"])
    return model

