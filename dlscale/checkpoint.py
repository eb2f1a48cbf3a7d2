"""Checkpoints that are never half-written and resume a run exactly.

A checkpoint holds the model, optimizer, LR scheduler and grad-scaler states, every
random generator's state and the position in the data, so a resumed run logs the same
losses as one that was never interrupted (bit for bit on the CPU). Files are written to
a temporary name and renamed into place, so a job killed mid-write leaves the previous
checkpoint intact. They load with ``torch.load(weights_only=True)``: no pickled code runs.

Runs whose parameters are split over ranks (FSDP, tensor parallelism) write a *folder* per
checkpoint instead, every rank its shard, through ``torch.distributed.checkpoint``
(:mod:`dlscale.sharded_checkpoint`); the folder too appears under its name only when whole.
Both kinds are listed, kept and cleared here, and :func:`load_model` reads either into one
process.

Only a fresh start (``resume=false``) removes an earlier run's checkpoints
(:func:`clear_checkpoints`); a resumed run keeps the one it resumed from until a newer one
has been renamed into place, so a job that dies twice loses nothing.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DlscaleError

_NAME = re.compile(r"^ckpt-(\d{8})(\.pt)?$")  # a file (one process wrote it) or a folder (sharded)


class CheckpointError(DlscaleError):
    """No usable checkpoint where one was expected; the message names the file."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints of a run, files and sharded folders, oldest first (by step, not by file time)."""
    folder = checkpoint_dir(run_dir)
    found = [p for p in folder.glob("ckpt-*") if _NAME.search(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME.search(p.name).group(1)))


def clear_checkpoints(run_dir: str | Path) -> int:
    """Remove a run folder's checkpoints and half-written temporary files; return how many went."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return 0
    doomed = [*list_checkpoints(run_dir), *folder.glob(".ckpt-*.tmp")]
    for path in doomed:
        remove_checkpoint(path)
    return len(doomed)


def remove_checkpoint(path: Path) -> None:
    """Delete one checkpoint, a file or a sharded folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically, keeping the ``keep`` newest."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-{step:08d}.pt"
    tmp = folder / f".{path.name}.tmp"
    save_synced(state, tmp)  # on disk before the rename makes it visible
    os.replace(tmp, path)
    for old in list_checkpoints(run_dir)[:-keep]:
        remove_checkpoint(old)
    return path


def save_synced(obj: Any, path: Path) -> None:
    """``torch.save`` and fsync: the bytes are on disk when this returns."""
    torch.save(obj, path)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def load_latest_checkpoint(run_dir: str | Path, model: torch.nn.Module | None = None,
                           optimizer: torch.optim.Optimizer | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, or None if the run has none.

    A newest file that fails to load (a disk filled up, a copy broke off) is reported
    and the one before it is used; if every file fails, a :class:`CheckpointError` says so.
    A sharded folder is read straight into ``model`` and ``optimizer`` (each rank its part,
    whatever the world size that wrote it) by every rank together; the dict returned then
    holds the rest of the state.
    """
    paths = list_checkpoints(run_dir)
    if paths and paths[-1].is_dir():
        if model is None or optimizer is None:
            raise CheckpointError(f"{paths[-1]} is a sharded checkpoint: load it with the model and optimizer, or "
                                  f"with dlscale.checkpoint.load_model")
        from .sharded_checkpoint import load_sharded_checkpoint  # (only runs that meet one need DCP)
        return paths[-1], load_sharded_checkpoint(paths[-1], model, optimizer)
    failures = []
    for path in reversed(paths):
        try:
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way
            failures.append(f"{path.name}: {err}")
            warnings.warn(f"checkpoint {path} could not be loaded ({err}); trying an older one", stacklevel=2)
    if failures:
        raise CheckpointError(f"no checkpoint in {checkpoint_dir(run_dir)} could be loaded: {'; '.join(failures)}. "
                              f"Start afresh with resume=false, or restore a good checkpoint")
    return None


def rng_state() -> dict[str, Any]:
    """Every random generator the training touches, in a form ``weights_only`` loading accepts."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": list(random.getstate()[1]),
        "python_gauss": random.getstate()[2],
    }
    if torch.cuda.is_available():
        # This rank's device only: a state per visible GPU would not load on a node that sees fewer.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # older checkpoints: get_rng_state_all, one state per visible GPU
            index = torch.cuda.current_device()
            if index >= len(cuda):
                warnings.warn(f"the checkpoint holds CUDA random states for {len(cuda)} GPU(s), none for device "
                              f"{index}; that device's generator keeps its seed", stacklevel=2)
                return
            cuda = cuda[index]
        torch.cuda.set_rng_state(cuda)


def training_state(step: int, steps_per_epoch: int, cfg: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: Any, scaler: torch.amp.GradScaler, noise: Any) -> dict[str, Any]:
    """Everything a run needs to continue exactly from ``step``: what :func:`save_checkpoint` writes."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **training_extras(
        step, steps_per_epoch, cfg, scheduler, scaler, noise)}


def training_extras(step: int, steps_per_epoch: int, cfg: Any, scheduler: Any, scaler: torch.amp.GradScaler,
                    noise: Any) -> dict[str, Any]:
    """The state beside the weights and the optimizer: schedule, scaler, random generators, position, config."""
    return {"scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(),
            "position": {"step": step, "steps_per_epoch": steps_per_epoch, "global_batch_size": cfg.global_batch_size},
            "config": cfg.to_dict(), "noise_scale": dict(noise.__dict__)}


def restore_training(ckpt: dict[str, Any], path: Path, steps_per_epoch: int, cfg: Any, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
                     noise: Any) -> int:
    """Load a :func:`training_state` into the live objects and return its step (same batch and epoch length only).

    Without ``"model"`` (a sharded checkpoint) the weights and optimizer state were loaded already.
    """
    saved = ckpt["position"]
    if saved["steps_per_epoch"] != steps_per_epoch or saved["global_batch_size"] != cfg.global_batch_size:
        raise CheckpointError(
            f"checkpoint {path} was written with global_batch_size={saved['global_batch_size']} "
            f"({saved['steps_per_epoch']} steps per epoch), but this run has global_batch_size="
            f"{cfg.global_batch_size} ({steps_per_epoch} steps per epoch); resume with the same settings, "
            f"or start afresh with resume=false")
    if "model" in ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    noise.__dict__.update(ckpt.get("noise_scale", {}))
    return int(saved["step"])


def load_model(run_dir: str | Path, in_channels: int = 1, num_outputs: int | None = None) -> torch.nn.Module:
    """The model of a run folder's newest checkpoint, whole, in this process (for evaluation or export).

    Whatever wrote it: one process, DDP, Horovod, or FSDP and tensor parallelism on any
    number of ranks (a sharded folder is gathered into the one model). The architecture
    comes from the run's ``config.yaml``.
    """
    from .config import load_config
    from .models import build_model

    run_dir = Path(run_dir)
    paths = list_checkpoints(run_dir)
    if not paths:
        raise CheckpointError(f"{checkpoint_dir(run_dir)} holds no checkpoint; train with checkpoints first")
    cfg = load_config(str(run_dir / "config.yaml"))
    newest = paths[-1]
    if newest.is_dir():
        from .sharded_checkpoint import load_sharded_weights
        return load_sharded_weights(newest, lambda outputs: build_model(cfg, in_channels, outputs), num_outputs)
    state = torch.load(newest, map_location="cpu", weights_only=True)["model"]
    head = [value for key, value in state.items() if key.endswith("bias")][-1]  # (the head's, as for a folder)
    model = build_model(cfg, in_channels, num_outputs or head.shape[0]).to(head.dtype)
    model.load_state_dict(state)
    return model
