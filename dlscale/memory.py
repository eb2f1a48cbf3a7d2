"""What one rank holds in memory: parameter, gradient and optimizer-state bytes, and the peak.

The bytes are counted from the tensors this rank really holds (a DTensor's local shard,
not the whole tensor), so the table of ``dlscale bench memory`` shows what FSDP and tensor
parallelism save, not an estimate. The peak is CUDA's allocator peak on a GPU and the
process's peak resident set (``ru_maxrss``) on a CPU, which also counts the interpreter
and torch's libraries.
"""

from __future__ import annotations

import resource
import sys

import torch
from torch import nn

from .dtensors import local


def _bytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's parameter, gradient and optimizer-state bytes (its shards, where split)."""
    params = list(model.parameters())
    states = [v for state in optimizer.state.values() for v in state.values()
              if isinstance(v, torch.Tensor) and v.numel() > 1]  # (a step counter is not state worth counting)
    return {"parameters": _bytes(params), "gradients": _bytes(p.grad for p in params if p.grad is not None),
            "optimizer_state": _bytes(states)}


def peak_bytes(device: torch.device) -> int:
    """The peak memory of this rank: CUDA's allocator peak, or the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # (Linux reports KiB, macOS bytes)


def memory_row(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> dict[str, int]:
    """:func:`tensor_bytes` and :func:`peak_bytes` as one row."""
    return {**tensor_bytes(model, optimizer), "peak": peak_bytes(device)}
