"""Sharded checkpoints for FSDP and tensor parallelism, through ``torch.distributed.checkpoint`` (DCP).

When no rank holds the whole model, no rank can write it alone. Every rank writes its
shards into one folder with DCP, which also records where each piece of each tensor lives
(``.metadata``), so the folder loads into *any* layout: the same ranks (an exact resume),
fewer or more ranks (resharding), or one process (:func:`load_weights`).

The folder is written as ``.ckpt-NNNNNNNN.tmp`` and renamed to ``ckpt-NNNNNNNN`` by rank 0
only after every rank has finished its part, so a job killed while writing leaves a
temporary folder that resume never reads, and the previous checkpoint stays. Beside the
tensors: ``training.pt`` (schedule, scaler, position, config; rank 0) and one
``rng-rankNNNNN.pt`` per rank (each rank's random generators).
"""

from __future__ import annotations

import contextlib
import errno
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlscale.checkpoint import safe_dcp
from dlscale.checkpoint.store import (
    CheckpointError,
    UnreadableCheckpoint,
    checkpoint_paths,
    keep_newest,
    remove_checkpoint,
    save_synced,
)
from dlscale.distributed import barrier, group_is_up, rank

#: How the optimizer's state is written: flattened, its settings (lr, betas...) kept per parameter. Nested, its
#: ``param_groups`` list would be one object under one key, and DCP keeps a single rank's copy of such an object: under
#: a pipeline, whose stages hold different parameters, the other stages would find none of their own on resuming.
FLAT = "flat"


def _flat(flat: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=flat)


def save_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extras: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Every rank writes its part of step ``step``; rank 0 renames the folder into place and keeps ``keep``.

    ``extras`` is :func:`dlscale.checkpoint.state.training_extras` of this rank (its ``rng`` is
    saved per rank; the rest by rank 0). Collective: every rank calls it.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final, tmp = checkpoint_paths(run_dir, step, sharded=True)
    me = rank()
    if me == 0:
        remove_checkpoint(tmp)  # a half-written folder of an earlier, killed attempt at this step
        tmp.mkdir(parents=True)
    barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_flat())
    with dcp_errors(
        f"the checkpoint {final.name} in {final.parent} was not written",
        "the last good checkpoint there is intact: free space (or choose another run_dir), then resume=true",
    ):
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    rest = dict(extras)
    save_synced(rest.pop("rng"), tmp / f"rng-rank{me:05d}.pt")
    if me == 0:
        save_synced({**rest, "optimizer_layout": FLAT}, tmp / "training.pt")
    barrier()  # every rank's files are on disk
    if me == 0:
        os.replace(tmp, final)
        keep_newest(run_dir, keep, written=step)
    barrier()  # nobody goes on (or resumes) before the folder has its name
    return final


def load_sharded_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a sharded folder into ``model`` and ``optimizer`` (any layout); return the rest of the state.

    Collective when distributed. A rank that did not exist in the run that wrote the folder
    (resharded to more ranks) takes rank 0's random generators.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rest = torch.load(path / "training.pt", map_location="cpu", weights_only=True)
    options = _flat(rest.pop("optimizer_layout", None) == FLAT)  # (a folder written before: nested groups)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optimizer": optimizer_state}
    with dcp_errors(f"{path} could not be read", _RESTORE):
        dcp.load(state, storage_reader=safe_dcp.reader(path), planner=safe_dcp.planner(), no_dist=not group_is_up())
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options
    )
    own = path / f"rng-rank{rank():05d}.pt"
    rest["rng"] = torch.load(own if own.exists() else path / "rng-rank00000.pt", map_location="cpu", weights_only=True)
    return rest


def open_folder(path: Path) -> dict[str, Any]:
    """Rank 0's ``training.pt`` of a sharded folder, once its metadata has been read safely
    (:mod:`~dlscale.checkpoint.safe_dcp`); :class:`UnreadableCheckpoint` for an empty, incomplete or crafted folder."""
    safe_dcp.read_metadata(path)
    training = path / "training.pt"
    try:
        rest = torch.load(training, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - missing, damaged or not tensors and plain containers
        raise UnreadableCheckpoint(
            f"{path.name}/training.pt: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        ) from None
    if not isinstance(rest, dict) or "position" not in rest:
        raise UnreadableCheckpoint(f"{path.name}/training.pt holds no training state")
    return rest


def recorded_config(path: Path) -> dict[str, Any] | None:
    """The config a sharded folder was written with (from rank 0's ``training.pt``; no tensor is read)."""
    return open_folder(path).get("config")


def weight_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each saved weight's shape and dtype, by name, from a sharded folder's metadata (no tensor is read)."""
    metadata = safe_dcp.read_metadata(path).state_dict_metadata
    return {
        key.removeprefix("model."): (tuple(value.size), value.properties.dtype)
        for key, value in metadata.items()
        if key.startswith("model.") and hasattr(value, "size")
    }


def load_weights(path: Path, model: nn.Module) -> None:
    """The whole model of a sharded folder, gathered into ``model`` in this process."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # (one process is the intent)
        with dcp_errors(f"{path} could not be read", _RESTORE):
            dcp.load(state, storage_reader=safe_dcp.reader(path), planner=safe_dcp.planner(), no_dist=True)
    model.load_state_dict(state["model"])


_RESTORE = "move it out of checkpoints/ (the one before it is then used), or restore it from a copy"


@contextlib.contextmanager
def dcp_errors(what: str, then: str) -> Iterator[None]:
    """DCP's failures as one :class:`CheckpointError` line, "``what``: the first rank's cause; ``then``".

    DCP gathers every rank's exception into a ``CheckpointException``, a ``BaseException`` that passes every
    ``except Exception`` (and the CLI's one-line errors) with a traceback per rank."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as err:
        raise CheckpointError(f"{what}: {_first_cause(err)}; {then}") from None


def _first_cause(err: BaseException) -> str:
    """The lowest rank's exception of a ``CheckpointException``, in one line (a kit's error as its own message)."""
    for at, failure in sorted(getattr(err, "failures", {}).items()):
        cause = failure[0] if isinstance(failure, tuple) else failure
        if getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full or over its quota (rank {at})"
        text = " ".join(str(cause).split())[:200]
        return text if isinstance(cause, CheckpointError) else f"rank {at}: {type(cause).__name__}: {text}"
    return "DCP gave no cause"
