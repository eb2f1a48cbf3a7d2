"""Reading a sharded (DCP) checkpoint folder without running code that the folder brings.

``torch.distributed.checkpoint`` reads a folder's ``.metadata`` with a plain ``pickle.load`` and every
non-tensor item (an optimizer's learning rate, its betas) with ``torch.load(weights_only=False)``: a
crafted folder in a run's ``checkpoints/`` would run its code on a resume or an export. Here the metadata
goes through an unpickler that builds only DCP's own metadata classes, torch's sizes, dtypes and layouts and
paths, and the items through ``torch.load(weights_only=True)``. Anything else is refused with
:class:`~dlscale.checkpoint.store.UnreadableCheckpoint`, and the loaders fall back to an older checkpoint,
as for a damaged file. So is metadata that reads outside the folder (a data file named by a path, a link, a device)
or declares more tensor bytes than its files hold (what a loader would allocate before reading a byte).
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
import stat
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.store import UnreadableCheckpoint

#: The classes and functions a DCP ``.metadata`` pickle may name, by module.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo", "_StoragePrefix"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(path: Path) -> Any:
    """The ``.metadata`` of a sharded checkpoint folder, read safely; :class:`UnreadableCheckpoint` if it cannot be."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(path) / ".metadata"
    try:
        metadata = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
    except FileNotFoundError:
        raise UnreadableCheckpoint(
            f"{Path(path).name} has no .metadata (an empty or incomplete sharded folder)"
        ) from None
    except Exception as err:  # noqa: BLE001 - damaged or crafted: either way it is not read
        raise UnreadableCheckpoint(f"{Path(path).name}/.metadata was refused: {err}") from None
    if not isinstance(metadata, Metadata):
        raise UnreadableCheckpoint(f"{Path(path).name}/.metadata holds a {type(metadata).__name__}, not DCP metadata")
    held = _data_files(Path(path), metadata)
    declared = _declared_bytes(Path(path), metadata)
    if declared > held:
        raise UnreadableCheckpoint(
            f"{Path(path).name}/.metadata declares {declared:,} bytes of tensors but its data files hold {held:,} "
            f"(a crafted or damaged folder)"
        )
    return metadata


#: A data file DCP writes (``__0_0.distcp``): a plain name in the checkpoint's folder, never a path.
_PLAIN_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _data_files(folder: Path, metadata: Any) -> int:
    """The bytes of the data files ``metadata`` names, once each; :class:`UnreadableCheckpoint` unless every entry
    lies inside a plain file of ``folder`` (not a path, a link or a device) and within its size."""
    entries = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict):
        raise UnreadableCheckpoint(f"{folder.name}/.metadata lists no data files")
    sizes: dict[str, int] = {}
    for entry in entries.values():
        name = getattr(entry, "relative_path", None)
        if not isinstance(name, str) or not _PLAIN_FILE.fullmatch(name):
            raise UnreadableCheckpoint(
                f"{folder.name}/.metadata names {str(name)[:80]!r} as a data file: only plain file names inside the "
                f"checkpoint's folder are read"
            )
        if name not in sizes:
            try:
                info = os.lstat(folder / name)
            except OSError as err:
                raise UnreadableCheckpoint(
                    f"{folder.name}/{name}, named in its .metadata, cannot be read ({err.strerror})"
                ) from None
            if not stat.S_ISREG(info.st_mode):
                raise UnreadableCheckpoint(f"{folder.name}/{name} is not a plain file (a link, a folder or a device)")
            sizes[name] = info.st_size
        offset, length = getattr(entry, "offset", None), getattr(entry, "length", None)
        if not all(type(n) is int and n >= 0 for n in (offset, length)) or offset + length > sizes[name]:
            raise UnreadableCheckpoint(
                f"{folder.name}/.metadata places an entry at {offset!r}+{length!r} in {name}, which holds "
                f"{sizes[name]:,} bytes"
            )
    return sum(sizes.values())


def _declared_bytes(folder: Path, metadata: Any) -> int:
    """The bytes of every tensor ``metadata`` declares (each whole tensor, as a loader would allocate it)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(items, dict):
        raise UnreadableCheckpoint(f"{folder.name}/.metadata lists no tensors")
    total = 0
    for key, item in items.items():
        if isinstance(item, BytesStorageMetadata):
            continue
        size, dtype = getattr(item, "size", None), getattr(getattr(item, "properties", None), "dtype", None)
        if (
            not isinstance(item, TensorStorageMetadata)
            or not isinstance(size, tuple)
            or not all(type(n) is int and n >= 0 for n in size)
            or not isinstance(dtype, torch.dtype)
        ):
            raise UnreadableCheckpoint(f"{folder.name}/.metadata describes {str(key)[:80]} without a valid size")
        total += math.prod(size) * dtype.itemsize
    return total


def reader(path: Path) -> Any:
    """A DCP storage reader for ``path`` whose metadata is read by :func:`read_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_metadata(path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def planner() -> Any:
    """DCP's default load planner, with the non-tensor items read by ``torch.load(weights_only=True)``."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                item = torch.load(value, weights_only=True)
            except Exception as err:  # noqa: BLE001
                raise UnreadableCheckpoint(
                    f"an item ({read_item.dest_index.fqn}) of a sharded checkpoint was refused: "
                    f"{str(err).splitlines()[0][:200]}"
                ) from None
            # Handed on as bytes of our own writing, so the planner's own placing (no private API) does the rest.
            value = io.BytesIO()
            torch.save(item, value)
            value.seek(0)
            super().load_bytes(read_item, value)

    return SafePlanner()
