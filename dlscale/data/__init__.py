"""Data: the synthetic "mini-CosmoFlow" maps, their shard format on disk, and the loaders.

- :mod:`dlscale.data.synthetic` draws the maps (2-D Gaussian random fields, P(k) ∝ A·k^-n);
- :mod:`dlscale.data.shards` writes and checks the ``.npy`` shard folders;
- :mod:`dlscale.data.loader` reads them for training (``make_loader``).
"""

from dlscale.data.loader import (
    ResumableDistributedSampler,
    ShardDataset,
    make_loader,
    mini_cosmoflow,
    pack_data,
    prepare_data,
    stage_data,
    synthetic_dir,
)
from dlscale.data.shards import (
    DataError,
    data_identity,
    generate_dataset,
    non_finite_values,
    read_manifest,
    write_shards,
)
from dlscale.data.synthetic import TARGET_NAMES, FieldSpec, denormalize_targets, generate_fields, normalize_targets

__all__ = [
    "DataError",
    "FieldSpec",
    "data_identity",
    "ResumableDistributedSampler",
    "ShardDataset",
    "TARGET_NAMES",
    "denormalize_targets",
    "generate_dataset",
    "generate_fields",
    "make_loader",
    "mini_cosmoflow",
    "non_finite_values",
    "normalize_targets",
    "pack_data",
    "prepare_data",
    "read_manifest",
    "stage_data",
    "synthetic_dir",
    "write_shards",
]
