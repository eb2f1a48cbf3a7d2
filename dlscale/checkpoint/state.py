"""What a training checkpoint holds beside the weights: schedule, scaler, random generators, position, config.

The same for both formats. A resumed run restores all of it, so that it logs the same
losses as one that was never interrupted (bit for bit on the CPU). Everything is in a form
``torch.load(weights_only=True)`` accepts: no pickled code runs on load.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every random generator the training touches, in a form ``weights_only`` loading accepts."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
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
    np.random.set_state(
        (
            "MT19937",
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # older checkpoints: get_rng_state_all, one state per visible GPU
            index = torch.cuda.current_device()
            if index >= len(cuda):
                warnings.warn(
                    f"the checkpoint holds CUDA random states for {len(cuda)} GPU(s), none for device "
                    f"{index}; that device's generator keeps its seed",
                    stacklevel=2,
                )
                return
            cuda = cuda[index]
        torch.cuda.set_rng_state(cuda)


def training_state(
    step: int,
    steps_per_epoch: int,
    cfg: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    noise: Any,
) -> dict[str, Any]:
    """Everything a run needs to continue exactly from ``step``: what :func:`save_checkpoint` writes."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        **training_extras(step, steps_per_epoch, cfg, scheduler, scaler, noise),
    }


def training_extras(
    step: int,
    steps_per_epoch: int,
    cfg: Any,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    noise: Any,
    data_identity: str | None = None,
) -> dict[str, Any]:
    """The state beside the weights and the optimizer: schedule, scaler, random generators, position, config
    (with the data's identity, :func:`dlscale.data.data_identity`, where the run read a ``data_dir``)."""
    config = {**cfg.to_dict(), **({"data_identity": data_identity} if data_identity else {})}
    return {
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": rng_state(),
        "position": {"step": step, "steps_per_epoch": steps_per_epoch, "global_batch_size": cfg.global_batch_size},
        "config": config,
        "noise_scale": dict(noise.__dict__),
    }


def restore_training(
    ckpt: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    noise: Any,
) -> int:
    """Load a :func:`training_state` into the live objects and return its step.

    That the checkpoint is this run's (same model, data, batch, optimizer, seed) was checked before
    any of it was read, against its recorded config (:func:`dlscale.config.resume_check.check_resume`).
    Without ``"model"`` (a sharded checkpoint) the weights and optimizer state were loaded already.
    """
    if "model" in ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    noise.__dict__.update(ckpt.get("noise_scale", {}))
    return int(ckpt["position"]["step"])
