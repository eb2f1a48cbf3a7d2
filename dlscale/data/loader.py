"""Reading shards for training: a checked Dataset, a resumable sampler, and ``make_loader``.

Used by ``dlscale.train`` and lesson 02 (workers, pinned memory, prefetch, sharding
across ranks).
"""

from __future__ import annotations

import bisect
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from tqdm.auto import tqdm

from dlscale.config import TrainConfig
from dlscale.data.augment import augment_map, sample_rng
from dlscale.data.scratch import STAGED, make_temp_dir, release
from dlscale.data.shards import MANIFEST, DataError, generate_dataset, read_manifest, read_shard_header
from dlscale.data.synthetic import DATA_VERSION, FieldSpec


class ShardDataset(Dataset):
    """All shard pairs of one split folder, read lazily through memory maps.

    Opening checks every shard's header, so a bad file fails here, by name, and not
    halfway through an epoch inside a worker. With ``augment_seed`` every map is augmented
    (:mod:`dlscale.data.augment`); the index then carries the epoch (``epoch * len + i``, as
    :class:`ResumableDistributedSampler` yields with ``tag_epoch``), so workers need no state.
    """

    def __init__(self, split_dir: str | Path, augment_seed: int | None = None):
        self.split_dir = Path(split_dir)
        self.augment_seed = augment_seed
        if not self.split_dir.is_dir():
            raise DataError(
                f"data folder {self.split_dir} does not exist; generate it with "
                f"`dlscale data generate --out {self.split_dir.parent}` or set data_dir"
            )
        self.x_paths = sorted(self.split_dir.glob("shard-*-x.npy"))
        if not self.x_paths:
            raise DataError(
                f"data folder {self.split_dir} holds no shard-*-x.npy files; see dlscale.data "
                f"for the format, or generate data with `dlscale data generate`"
            )
        self.y_paths = [p.with_name(p.name.replace("-x.npy", "-y.npy")) for p in self.x_paths]
        counts, input_shape, target_shape = [], None, None
        for x_path, y_path in zip(self.x_paths, self.y_paths):
            x, y = read_shard_header(x_path), read_shard_header(y_path)
            if x.ndim != 4 or y.ndim != 2:
                raise DataError(
                    f"shard {x_path} has shape {x.shape} with targets {y.shape}; expected "
                    f"(n, channels, height, width) and (n, n_targets)"
                )
            if len(x) != len(y):
                raise DataError(f"shard {x_path} has {len(x)} maps but {y_path.name} has {len(y)} targets")
            if input_shape is None:
                input_shape, target_shape = x.shape[1:], y.shape[1:]
            elif x.shape[1:] != input_shape or y.shape[1:] != target_shape:
                raise DataError(
                    f"shard {x_path} holds maps of shape {x.shape[1:]} and targets {y.shape[1:]}, "
                    f"but {self.x_paths[0].name} holds {input_shape} and {target_shape}; "
                    f"all shards of a split must match"
                )
            counts.append(len(x))
        self.input_shape = tuple(input_shape)
        self.num_targets = int(target_shape[0])
        self.offsets = np.cumsum([0] + counts).tolist()
        self._open: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.offsets[-1]

    def _shard(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if index not in self._open:
            self._open[index] = (
                np.load(self.x_paths[index], mmap_mode="r"),
                np.load(self.y_paths[index], mmap_mode="r"),
            )
        return self._open[index]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = divmod(index, len(self))
        shard = bisect.bisect_right(self.offsets, index) - 1
        x, y = self._shard(shard)
        row = index - self.offsets[shard]
        x, y = torch.from_numpy(np.array(x[row])), torch.from_numpy(np.array(y[row]))
        if self.augment_seed is not None:
            x = augment_map(x, sample_rng(self.augment_seed, epoch, index))
        return x, y

    def __getstate__(self) -> dict:
        # Memory maps do not travel to worker processes; each worker opens its own.
        return {**self.__dict__, "_open": {}}


class ResumableDistributedSampler(DistributedSampler):
    """A ``DistributedSampler`` that can start partway through an epoch.

    The order of an epoch depends only on (seed, epoch), so skipping the samples a rank
    already consumed resumes exactly where an interrupted run stopped.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, tag_epoch: bool = False):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start_index = 0
        self.tag_epoch = tag_epoch  # yield epoch * len(dataset) + index, for per-epoch augmentation

    def set_position(self, epoch: int, start_index: int = 0) -> None:
        """Start ``epoch`` at this rank's ``start_index``-th sample."""
        self.set_epoch(epoch)
        self.start_index = start_index

    def __iter__(self) -> Iterator[int]:
        offset = self.epoch * len(self.dataset) if self.tag_epoch else 0
        return iter([offset + index for index in list(super().__iter__())[self.start_index :]])

    def __len__(self) -> int:
        return self.num_samples - self.start_index


def synthetic_dir(cfg: TrainConfig) -> Path:
    """Where the synthetic set for these settings lives: one folder per distinct set."""
    return Path("data") / (
        f"mini-cosmoflow-{DATA_VERSION}-s{cfg.image_size}-n{cfg.train_samples}-v{cfg.val_samples}"
        f"-noise{cfg.noise:g}-seed{cfg.seed}"
    )


def prepare_data(cfg: TrainConfig, progress: bool | None = None) -> Path:
    """The data folder for ``cfg``: the user's ``data_dir``, or the synthetic set (made if missing)."""
    if cfg.data_dir:
        path = Path(cfg.data_dir)
        if path.is_file() and _archive_name(path) and cfg.stage_dir:
            return path  # a packed data set, unpacked to node-local storage by stage_data
        if not path.is_dir():
            raise DataError(
                f"data_dir {path} does not exist; generate it with "
                f"`dlscale data generate --out {path}`, or leave data_dir empty for the synthetic set"
            )
        return path
    path = synthetic_dir(cfg)
    if not (path / MANIFEST).is_file():
        generate_dataset(
            path,
            FieldSpec(image_size=cfg.image_size, noise=cfg.noise),
            cfg.train_samples,
            cfg.val_samples,
            cfg.shard_size,
            seed=cfg.seed,
            progress=cfg.progress if progress is None else progress,
        )
    return path


def mini_cosmoflow(config: str | TrainConfig = "tiny", **overrides: Any) -> tuple[ShardDataset, ShardDataset]:
    """The training and validation sets of a config as plain Datasets of (map, targets), generated on first use.

    The one kit import of the plain-PyTorch scripts in ``recipes/``: the same maps in the same order
    that ``dlscale.train`` reads for this config (``mini_cosmoflow("tiny", image_size=32)``).
    """
    from dlscale.config import load_config

    cfg = config.override(overrides) if isinstance(config, TrainConfig) else load_config(config, overrides)
    root = prepare_data(cfg, progress=False)
    return ShardDataset(root / "train"), ShardDataset(root / "val")


ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def pack_data(data_root: str | Path, archive: str | Path) -> Path:
    """Pack a data folder into one compressed tar file (``.tar.gz``), the way data sets are kept on a shared
    file system: one large file instead of many small ones, which a parallel file system serves far better."""
    import tarfile

    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".part")
    with tarfile.open(partial, "w:gz" if archive.name.endswith(("gz", "tgz")) else "w") as tar:
        tar.add(data_root, arcname=_archive_name(archive) or Path(data_root).name)  # unpacks as the archive's name
    os.replace(partial, archive)
    return archive


def _archive_name(path: Path) -> str | None:
    return next((path.name[: -len(s)] for s in ARCHIVE_SUFFIXES if path.name.endswith(s)), None)


def stage_data(data_root: str | Path, stage_dir: str, progress: bool = False) -> Path:
    """Copy a data folder (or unpack a ``.tar``/``.tar.gz`` of one) to node-local storage once; return the copy.

    ``stage_dir`` may name environment variables (``$TMPDIR``, ``$SLURM_TMPDIR``). A copy whose
    files already match the source in names and sizes is reused (an unpacked archive is reused
    when its folder is complete); otherwise the data go to a temporary name that is then
    renamed, so an interrupted copy is never read. A copy holds a marker file (:data:`~dlscale.data.scratch.STAGED`):
    only such a copy is ever replaced; a folder of the target's name without it is refused, not deleted.
    """
    source = Path(data_root)
    target_root = Path(os.path.expandvars(os.path.expanduser(stage_dir)))
    if "$" in str(target_root):
        raise DataError(f"stage_dir {stage_dir!r} names an environment variable that is not set")
    archive_name = _archive_name(source) if source.is_file() else None
    if source.is_file() and archive_name is None:
        raise DataError(f"{source} is a file: stage a data folder or a {'/'.join(ARCHIVE_SUFFIXES)} of one")
    target = target_root / (archive_name or source.name)
    if target.exists() or target.is_symlink():
        if not (target / STAGED).is_file():  # never replace what staging did not make
            raise DataError(
                f"stage_dir: {target} exists and was not staged by dlscale, so it is left as it is; "
                f"choose another stage_dir, or move that folder away"
            )
        if archive_name is not None and (target / MANIFEST).is_file():
            return target
    files = [] if archive_name is not None else sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    if (
        archive_name is None
        and target.is_dir()
        and all((target / f).is_file() and (target / f).stat().st_size == (source / f).stat().st_size for f in files)
    ):
        return target
    staging = make_temp_dir(target_root, target.name)
    try:
        if archive_name is not None:
            import tarfile

            with tarfile.open(source) as tar:
                tar.extractall(staging, filter="data")
            unpacked = staging / archive_name
            if not unpacked.is_dir():
                raise DataError(f"{source} does not hold a folder named {archive_name}; pack it with pack_data")
            staging_result = unpacked
        else:
            for name in tqdm(files, desc=f"staging to {target_root}", unit="file", disable=not progress):
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / name, staging / name)
            staging_result = release(staging)
        (staging_result / STAGED).write_text(f"staged by dlscale from {source.resolve()}\n")
        if target.exists():  # (an older or partial copy that staging made: the marker was checked above)
            shutil.rmtree(target)
        os.replace(staging_result, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def auto_workers(cfg: TrainConfig, device: torch.device) -> int:
    """Workers per rank: none on CPU (they would compete with compute for the same cores)."""
    if cfg.num_workers >= 0:
        return cfg.num_workers
    if device.type != "cuda":
        return 0
    return max(1, min(4, (os.cpu_count() or 2) // max(1, torch.cuda.device_count()) - 1))


def make_loader(
    cfg: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
    split: str = "train",
    device: torch.device | str = "cpu",
    data_dir: str | Path | None = None,
) -> DataLoader:
    """A DataLoader over one split for one rank.

    ``train``: shuffled by a :class:`ResumableDistributedSampler` (call its ``set_position``
    each epoch), each rank a disjoint share, full batches only so the global batch is fixed.
    ``val``: each rank an interleaved, disjoint slice in order, no sample dropped or repeated.
    """
    device = torch.device(device)
    root = Path(data_dir) if data_dir is not None else prepare_data(cfg)
    augment = cfg.augment and split == "train"
    dataset = ShardDataset(root / split, augment_seed=cfg.seed if augment else None)
    batch = cfg.micro_batch(world_size) if split == "train" else cfg.per_rank_batch(world_size)
    workers = auto_workers(cfg, device)
    options = dict(num_workers=workers, pin_memory=cfg.pin_memory and device.type == "cuda")
    if workers > 0:
        options.update(prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers)
    if split == "train":
        if len(dataset) // world_size < cfg.per_rank_batch(world_size):
            raise DataError(
                f"{root / split} has {len(dataset)} samples, fewer than one global batch "
                f"({cfg.global_batch_size}); lower global_batch_size or add data"
            )
        sampler = ResumableDistributedSampler(dataset, world_size, rank, seed=cfg.seed, tag_epoch=augment)
        return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True, **options)
    return DataLoader(
        Subset(dataset, range(rank, len(dataset), world_size)), batch_size=batch, shuffle=False, **options
    )


class InMemoryBatches:
    """One epoch of a training loader's batches, read once, prepared (moved to the device) and replayed every epoch.

    What ``data_in_memory=true`` trains on: the step then waits for no loader and copies nothing, so a
    run with it against one without measures what the data path adds to a step (``dlscale bench
    breakdown``). Every epoch replays the first one's batches in the same order: for measuring, not
    for training a model.
    """

    def __init__(self, loader: DataLoader, prepare: Any):
        self.dataset, self.sampler = loader.dataset, loader.sampler  # (the loop still sets the sampler's position)
        self.num_workers, self.pin_memory = loader.num_workers, loader.pin_memory
        loader.sampler.set_position(0, 0)
        self.batches = [prepare(*batch) for batch in loader]

    def __iter__(self) -> Iterator:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def target_names(data_dir: str | Path, num_targets: int) -> list[str]:
    """Names of the target columns from the manifest, or generic names for a user's data; a :class:`DataError` naming
    the manifest where it cannot be read or its names do not fit the shards' ``num_targets`` columns."""
    manifest = read_manifest(data_dir)
    if manifest is None or "target_names" not in manifest:
        return [f"target_{i}" for i in range(num_targets)]
    names = manifest["target_names"]
    if not (isinstance(names, list) and len(names) == num_targets and all(isinstance(n, str) for n in names)):
        raise DataError(
            f"{Path(data_dir) / MANIFEST}: target_names must list the {num_targets} target column(s) of the "
            f"shards by name, got {str(names)[:80]}; fix it, or remove the manifest (your own data need none)"
        )
    return names


def rank_loaders(
    cfg: TrainConfig, env: Any, device: torch.device, data_rank: int | None = None, data_ranks: int | None = None
) -> tuple[DataLoader, DataLoader, Path]:
    """This rank's training and validation loaders, and the folder they read.

    One rank generates the synthetic set while the others wait; with ``stage_dir`` the first
    rank of each node copies the shards to node-local storage once. ``data_rank`` of
    ``data_ranks`` (default: the rank and world size) picks the samples: the ranks of one
    tensor-parallel group read the same ones.
    """
    from dlscale import distributed

    # The others wait for as long as that takes (setup_timeout_s), not dist_timeout_s, meant for one collective.
    with distributed.setup_waits(cfg.setup_timeout_s) as wait:
        if env.is_main:  # one rank generates the synthetic set; the others wait and then find it
            prepare_data(cfg)
        wait("the data set's generation (rank 0)")
        data_root = prepare_data(cfg)
        if cfg.stage_dir:  # one copy per node
            if env.local_rank == 0:
                stage_data(data_root, cfg.stage_dir, progress=cfg.progress and env.is_main)
            wait("staging the shards to stage_dir (each node's first rank)")
            data_root = stage_data(data_root, cfg.stage_dir)
    rank = env.rank if data_rank is None else data_rank
    ranks = env.world_size if data_ranks is None else data_ranks
    train, val = (
        make_loader(cfg, rank, ranks, "train", device, data_root),
        make_loader(cfg, rank, ranks, "val", device, data_root),
    )
    check_splits(train.dataset, val.dataset.dataset, data_root)  # (before training: not after an epoch)
    return train, val, data_root


def check_splits(train: ShardDataset, val: ShardDataset, data_root: str | Path) -> None:
    """A :class:`DataError` naming the folder when the two splits cannot serve one run: an empty split, maps or
    targets of other shapes in the validation split than in the training split, or a manifest that training cannot
    read. ``dlscale data check`` calls it too, so that it refuses what training refuses, in the same words."""
    for name, split in (("train", train), ("val", val)):
        if len(split) == 0:
            raise DataError(f"{Path(data_root) / name} holds no samples (its shards have 0 rows); add data to it")
    if (val.input_shape, val.num_targets) != (train.input_shape, train.num_targets):
        raise DataError(
            f"{Path(data_root) / 'val'} holds maps {val.input_shape} with {val.num_targets} target(s), but "
            f"{Path(data_root) / 'train'} holds {train.input_shape} with {train.num_targets}: both splits "
            f"must hold the same kind of sample"
        )
    target_names(data_root, train.num_targets)  # (the manifest, read here before training, not after the setup)
