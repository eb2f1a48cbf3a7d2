"""Is staging to node-local storage worth it? One packed data set read in place, against staged once and read there.

Lesson 02 measures it: a data set kept as one compressed archive on a shared file system costs
its whole decompression on every epoch that reads it in place; staged (unpacked once to
node-local storage, :func:`dlscale.data.stage_data`), each epoch reads plain files.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from dlscale.data import pack_data, stage_data


def bench_staging(data_root: str | Path, archive: str | Path, stage_root: str | Path | None = None) -> dict[str, Any]:
    """Pack ``data_root`` into ``archive``, then time reading the archive whole, staging it, reading the copy.

    Returns the archive's size in MiB, the three times in seconds, the staged folder, and after how
    many epochs staging has paid for itself (None when reading the staged copy was not faster).
    """
    archive = pack_data(data_root, archive)
    start = time.perf_counter()
    with tarfile.open(archive) as tar:  # what an epoch that reads the archive in place pays
        for member in tar:
            if member.isfile():
                tar.extractfile(member).read()
    read_packed = time.perf_counter() - start
    start = time.perf_counter()
    staged = stage_data(archive, str(stage_root or tempfile.mkdtemp(prefix="dlscale_stage_")))
    stage_once = time.perf_counter() - start
    start = time.perf_counter()
    for path in staged.rglob("*.npy"):
        path.read_bytes()
    read_local = time.perf_counter() - start
    saving = read_packed - read_local
    return {
        "packed_mib": archive.stat().st_size / 2**20,
        "read_packed_s": read_packed,
        "stage_once_s": stage_once,
        "read_local_s": read_local,
        "staged": staged,
        "epochs_to_pay_off": 1 + int(stage_once // saving) if saving > 0 else None,
    }
