"""Is a checkpoint this run's? The keys that may change on a resume, and those that make it another run.

A resume continues a run: same model, data, batch, optimizer and seed. What may differ is how
and where it runs (world size, node count, ``max_steps``, paths, logging). The training checks a
checkpoint's recorded config against the current one before any weight is loaded
(:func:`check_resume`), so a job never continues a run that an unrelated job left in its folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlscale.config.train_config import ConfigError, TrainConfig

#: Keys whose change makes another run: the model, the data, the batch, the optimizer and its
#: schedule, the seed. Every other key may change on a resume, and a change is printed.
SAME_RUN_KEYS = (
    "model",
    "width",
    "depth",
    "heads",
    "patch_size",
    "norm",
    "image_size",
    "train_samples",
    "val_samples",
    "noise",
    "augment",
    "seed",
    "global_batch_size",
    "optimizer",
    "lr",
    "lr_scaling",
    "base_batch",
    "momentum",
    "weight_decay",
    "trust_coefficient",
    "larc_mode",
    "warmup_steps",
    "warmup_epochs",
    "warmup_start_factor",
    "decay",
    "grad_clip",
)
#: Keys that are not about the run itself (where the config was read, whether to resume).
_IGNORED = ("name", "resume")


def resume_changes(saved: Mapping[str, Any], cfg: TrainConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(allowed, refused): each key whose value differs, as ``key: (saved, now)``."""
    now = cfg.to_dict()
    allowed, refused = {}, {}
    for key, value in now.items():
        if key in _IGNORED or key not in saved:
            continue
        old = saved[key]
        if isinstance(value, tuple):
            old = tuple(old) if isinstance(old, (list, tuple)) else old
        if old != value:
            (refused if key in SAME_RUN_KEYS else allowed)[key] = (old, value)
    return allowed, refused


def check_resume(
    saved: Mapping[str, Any] | None, cfg: TrainConfig, path: Path, data_identity: str | None = None
) -> list[str]:
    """Refuse a checkpoint of another run (a :class:`ConfigError` naming the keys, or the data); else the changes
    to print. ``data_identity`` is the digest of the shards this run reads (:func:`dlscale.data.data_identity`),
    whether the synthetic set or a ``data_dir``: it is compared with the one the checkpoint recorded."""
    if saved is None:  # (a checkpoint of an older kit records no config)
        return []
    recorded = saved.get("data_identity")
    if data_identity and recorded and recorded != data_identity:
        now = f"data_dir={cfg.data_dir}" if cfg.data_dir else "the synthetic set of these settings"
        then = f"data_dir={saved.get('data_dir')}" if saved.get("data_dir") else "the synthetic set"
        raise ConfigError(
            f"{path} belongs to another run: the shards of {now} are not the data it trained on "
            f"({then}; their names, sizes or contents differ). Resume with the data it trained on "
            f"(the same shards may move: only their content counts), or start afresh in a new folder "
            f"(run_dir=runs/<new name>)"
        )
    allowed, refused = resume_changes(saved, cfg)
    if refused:
        keys = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(
            f"{path} belongs to another run: {keys}. A resume must keep the model, the data, the "
            f"global batch, the optimizer and the seed. Start afresh in a new folder "
            f"(run_dir=runs/<new name>), or with resume=false to replace that run's checkpoints"
        )
    return [f"{k} {old!r} -> {new!r}" for k, (old, new) in allowed.items()]
