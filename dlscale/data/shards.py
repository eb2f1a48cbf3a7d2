"""The on-disk shard format, its writer, and a checked reader.

A data folder holds one sub-folder per split, each a set of numpy shard pairs::

    DATA_DIR/
      manifest.json                  what was generated and how (optional for your own data)
      train/shard-00000-x.npy        float32 inputs,  shape (n, channels, height, width)
      train/shard-00000-y.npy        float32 targets, shape (n, n_targets), normalised to [-1, 1]
      train/shard-00001-x.npy ...
      val/shard-00000-x.npy ...

Plain ``.npy`` files were chosen over HDF5 because numpy reads them with no extra
dependency and memory-maps them, so a DataLoader worker reads only the maps it needs.
Your own data in this layout trains unchanged. Every shard is checked when a dataset
opens it: a missing folder, a truncated or corrupt file, values in another byte order than
this machine's, or shards of different shapes give one :class:`DataError` that names the file
and what to do; ``dlscale data check`` opens them the same way, so it refuses what training refuses.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dlscale.data.scratch import make_temp_dir, release
from dlscale.data.synthetic import TARGET_NAMES, FieldSpec, generate_fields, normalize_targets
from dlscale.errors import DlscaleError
from dlscale.runtime.memory import available_memory

MANIFEST = "manifest.json"
SPLITS = ("train", "val")


class DataError(DlscaleError):
    """A data folder or shard cannot be used; the message names the file and the fix."""


def shard_paths(split_dir: Path, index: int) -> tuple[Path, Path]:
    return split_dir / f"shard-{index:05d}-x.npy", split_dir / f"shard-{index:05d}-y.npy"


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def write_shards(
    split_dir: Path, inputs: np.ndarray, targets: np.ndarray, shard_size: int, first_index: int = 0
) -> list[str]:
    """Write arrays as shard pairs of at most ``shard_size`` samples; return the shard names."""
    split_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for offset in range(0, len(inputs), shard_size):
        x_path, y_path = shard_paths(split_dir, first_index + offset // shard_size)
        _save_npy_atomic(x_path, np.ascontiguousarray(inputs[offset : offset + shard_size], dtype=np.float32))
        _save_npy_atomic(y_path, np.ascontiguousarray(targets[offset : offset + shard_size], dtype=np.float32))
        names.append(x_path.name)
    return names


def read_shard_header(path: Path) -> np.ndarray:
    """Memory-map one .npy file, turning any failure into a :class:`DataError` naming it."""
    if not path.is_file():
        raise DataError(f"shard {path} is missing; regenerate the data folder or restore the file")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # numpy raises ValueError, OSError or EOFError depending on the damage
        raise DataError(
            f"shard {path} is truncated or corrupt ({err}); delete the data folder and "
            f"regenerate it (`dlscale data generate`), or replace the file"
        ) from None
    _check_numbers(path, array.dtype)
    return array


def _check_numbers(path: Path, dtype: np.dtype) -> None:
    """A :class:`DataError` naming the shard where torch cannot read its numbers as they are: another byte order than
    this machine's (a big-endian ``>f4`` written elsewhere), or values that are no real numbers (text, dates)."""
    if dtype.kind not in "fiub":
        raise DataError(
            f"shard {path} holds {dtype} values, which training cannot read: a shard holds float32 maps and targets; "
            f"write it again with np.save(path, array.astype(np.float32))"
        )
    if not dtype.isnative:
        raise DataError(
            f"shard {path} holds {dtype.str} values, in another byte order than this machine's: convert it once, "
            f"np.save(path, np.load(path).astype(np.float32))"
        )


def non_finite_values(path: Path, chunk: int = 256) -> int:
    """How many NaN or infinite values a shard holds (read in chunks of ``chunk`` samples through its memory map)."""
    array = read_shard_header(path)
    return sum(
        int(np.count_nonzero(~np.isfinite(array[start : start + chunk]))) for start in range(0, len(array), chunk)
    )


def generate_dataset(
    out_dir: str | Path,
    spec: FieldSpec,
    train_samples: int,
    val_samples: int,
    shard_size: int = 1024,
    seed: int = 0,
    progress: bool = True,
    shared: bool = False,
) -> dict[str, Any]:
    """Generate the synthetic dataset into ``out_dir`` and return its manifest.

    Each shard draws from its own seeded generator, so the data depend only on the seed
    and sizes, not on the order of generation. The folder is built under a temporary
    name and renamed into place, so a crash never leaves a half-written dataset that
    looks complete, and several processes may race to create it safely; a temporary folder that
    a killed generation left is removed by the next one (:mod:`dlscale.data.scratch`).

    The folder and its files get the modes the user's umask gives (readable by others under the usual 022); with
    ``shared`` they, and the parent folders this call makes, are readable by everyone whatever the umask (a data
    set generated once for a room of attendees).
    """
    out_dir = Path(out_dir)
    check_generation_fits(
        out_dir, spec.image_size, train_samples + val_samples, min(shard_size, max(train_samples, val_samples))
    )
    made = [folder for folder in (out_dir.parent, *out_dir.parent.parents) if not folder.exists()]
    tmp = make_temp_dir(out_dir.parent, out_dir.name)  # (and removes those a killed generation left)
    start = time.perf_counter()
    manifest: dict[str, Any] = {
        "format": "dlscale-shards",
        "version": 1,
        "input_shape": [1, spec.image_size, spec.image_size],
        "target_names": list(TARGET_NAMES),
        "target_ranges": spec.target_ranges.tolist(),
        "generator": {**asdict(spec), "seed": seed},
        "splits": {},
    }
    total = train_samples + val_samples
    try:
        with tqdm(total=total, desc="generating maps", unit="map", disable=not progress) as bar:
            for split_id, (split, count) in enumerate(zip(SPLITS, (train_samples, val_samples))):
                names = []
                for index, offset in enumerate(range(0, count, shard_size)):
                    rng = np.random.default_rng([seed, split_id, index])
                    maps, params = generate_fields(min(shard_size, count - offset), spec, rng)
                    names += write_shards(
                        tmp / split, maps, normalize_targets(params, spec.target_ranges), shard_size, first_index=index
                    )
                    bar.update(len(maps))
                manifest["splits"][split] = {"samples": count, "shards": names}
        seconds = time.perf_counter() - start
        manifest["generation"] = {"seconds": round(seconds, 3), "samples_per_s": round(total / seconds, 1)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.replace(release(tmp, shared), out_dir)
        except OSError:
            if not (out_dir / MANIFEST).is_file():  # not a finished twin from another process
                raise
        for folder in made if shared else []:  # (made under this umask: the room must pass through them too)
            folder.chmod(folder.stat().st_mode & 0o7777 | 0o555)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DataError(
            f"{out_dir.parent} is on a full disk or over its quota ({err.strerror}) while generating "
            f"{out_dir.name}; nothing was left there. Free space, or generate elsewhere (--out)"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


#: Bytes of memory per pixel of a shard while its maps are drawn (float64 noise, complex spectra, the blur):
#: measured peak 52.5 (tracemalloc, 64 maps of 256x256); rounded up.
_GENERATION_BYTES_PER_PIXEL = 56


def check_generation_fits(out_dir: Path, image_size: int, samples: int, shard_size: int) -> None:
    """A :class:`DataError` before anything is drawn when the set will not fit on the disk under ``out_dir`` or one
    shard's drawing will not fit in this machine's free memory (``image_size=65536`` would ask for terabytes)."""
    pixels = image_size * image_size
    disk = samples * pixels * 4
    memory = shard_size * pixels * _GENERATION_BYTES_PER_PIXEL
    parent = next((p for p in (out_dir.parent, *out_dir.parent.parents) if p.exists()), Path("."))
    free_disk = shutil.disk_usage(parent).free
    free_memory = available_memory()
    gib = 2**30
    if disk > free_disk:
        raise DataError(
            f"{samples:,} maps of {image_size}x{image_size} take {disk / gib:,.1f} GiB, but {parent} has "
            f"{free_disk / gib:,.1f} GiB free: lower image_size or the sample counts, or generate "
            f"elsewhere (--out)"
        )
    if free_memory and memory > free_memory:
        raise DataError(
            f"drawing a shard of {shard_size:,} maps of {image_size}x{image_size} needs about "
            f"{memory / gib:,.1f} GiB of memory, and {free_memory / gib:,.1f} GiB is free: lower shard_size "
            f"or image_size"
        )


def data_identity(data_dir: str | Path, sample: int = 1 << 12) -> str:
    """A digest of a data folder's shards: their names, sizes, and first and last ``sample`` bytes.

    It stays the same when the folder is moved or staged elsewhere and changes with the data, at the
    cost of reading 8 KiB per shard (every rank reads it at start, from a parallel file system too).
    A resume compares it (another data set under the same keys is another run).
    """
    root = Path(data_dir)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.npy")):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(sample))
            if size > 2 * sample:
                handle.seek(-sample, os.SEEK_END)
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def read_manifest(data_dir: str | Path) -> dict[str, Any] | None:
    """The folder's manifest, or None for a user's folder that has none."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return None
    fix = "regenerate the data folder, or remove the manifest (your own data need none)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        why = " ".join(str(err).split())[:120] if not isinstance(err, RecursionError) else "nested too deep"
        raise DataError(f"{path} is not valid JSON ({why}); {fix}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path} holds a JSON {type(manifest).__name__}, not an object of settings; {fix}")
    return manifest
