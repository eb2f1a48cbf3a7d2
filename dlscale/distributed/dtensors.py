"""Tensors that FSDP or tensor parallelism split over ranks (DTensors): local views and whole-tensor norms.

Under FSDP2 and DTensor tensor parallelism a parameter is a ``DTensor``: each rank holds a
shard (``to_local()``), and the whole tensor exists only across ranks. Element-wise updates
(an optimizer's arithmetic) work shard by shard. A norm does not: the norm of a shard is
not the norm of the tensor, so a trust ratio (LARS, LAMB) or a clipping factor taken from
local norms would differ on every rank and from one process. :func:`full_norms` adds the
squared norms of the shards over the ranks that hold them, one all-reduce per mesh
dimension the tensors are split along.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn


@functools.cache  # (asked for every parameter at every step)
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support has no DTensor
        return None
    return DTensor


def is_sharded(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (a parameter, gradient or state that FSDP or TP split over ranks)."""
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(tensor, dtensor)


def local(tensor: Tensor) -> Tensor:
    """This rank's part of ``tensor``: the shard of a DTensor (sharing its storage), else the tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def full_norms(tensors: list[Tensor], like: list[Tensor] | None = None) -> Tensor:
    """The L2 norm of each *whole* tensor, as one tensor (float32 at least, float64 for float64 tensors).

    ``tensors`` may be DTensors or local shards; ``like`` (same order) names the DTensors
    the shards belong to when ``tensors`` are already local. Every rank of the mesh must call
    this with the same list, as with any collective.
    """
    like = tensors if like is None else like
    norms = torch.stack(torch._foreach_norm([local(t) for t in tensors]))
    norms = norms if norms.dtype == torch.float64 else norms.float()
    split: dict[tuple, tuple] = {}
    for index, original in enumerate(like):
        if is_sharded(original):
            # (not is_shard(): FSDP over a tensor-parallel shard is a _StridedShard, which says False)
            dims = tuple(d for d, placement in enumerate(original.placements) if not placement.is_replicate())
            if dims:
                key = (id(original.device_mesh), dims)
                split.setdefault(key, (original.device_mesh, dims, []))[2].append(index)
    for mesh, dims, indices in split.values():  # (same order on every rank: the parameters' order)
        index = _index_on(tuple(indices), norms.device)
        squares = norms.index_select(0, index) ** 2
        for dim in dims:
            torch.distributed.all_reduce(squares, group=mesh.get_group(dim))
        norms = norms.index_copy(0, index, squares.sqrt())
    return norms


@functools.lru_cache(maxsize=256)
def _index_on(indices: tuple[int, ...], device: torch.device) -> Tensor:
    """``indices`` as a tensor on ``device``, made once: a new one would be a blocking host-to-device copy
    at every step (the same lists come back each step: clipping, and each LARS/LAMB group)."""
    return torch.tensor(indices, device=device)


def clip_factor(grads: list[Tensor], max_norm: float, across: Any = None) -> Tensor:
    """The factor (at most 1) that brings the global norm of ``grads`` (whole tensors) down to ``max_norm``.

    torch's formula, ``max_norm / (norm + 1e-6)``; also LAMB's optional global clip. ``across`` is a process group
    whose ranks hold *other* parameters (a pipeline's stages): their squared norms are added to this rank's.
    """
    total = torch.linalg.vector_norm(full_norms(grads))
    if across is not None:
        squares = total**2
        torch.distributed.all_reduce(squares, group=across)
        total = squares.sqrt()
    return (max_norm / (total + 1e-6)).clamp(max=1.0)


def clip_grad_norm_(parameters: list[nn.Parameter], max_norm: float, across: Any = None) -> None:
    """Scale the gradients in place so that their global norm is at most ``max_norm``.

    ``torch.nn.utils.clip_grad_norm_`` when no gradient is split and no other rank holds other parameters; with
    DTensors it takes the norm of the whole gradients (:func:`full_norms`), also when split and plain tensors mix
    (tensor parallelism leaves norms and the head whole), and with ``across`` (a pipeline's ranks: a process group)
    the norm of every stage's gradients together.
    """
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if across is None and not any(is_sharded(g) for g in grads):
        nn.utils.clip_grad_norm_(params, max_norm)
        return
    factor = clip_factor(grads, max_norm, across)
    torch._foreach_mul_([local(g) for g in grads], factor.to(local(grads[0]).dtype))
