"""What one rank holds in memory: parameter, gradient and optimizer-state bytes, and the peak.

The bytes are counted from the tensors this rank really holds (a DTensor's local shard,
not the whole tensor), so the table of ``dlscale bench memory`` shows what FSDP and tensor
parallelism save, not an estimate. The peak is CUDA's allocator peak on a GPU and the
process's peak resident set on a CPU, which also counts the interpreter and torch's libraries:
on Linux since :func:`reset_peak` (``VmHWM``, reset through ``/proc/self/clear_refs``), so that a
process that trains several runs in turn (a notebook's engine) reports each run's own; elsewhere
since the process started (``ru_maxrss``).
"""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Any

import torch
from torch import nn

from dlscale.distributed.dtensors import local


def _bytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's parameter, gradient and optimizer-state bytes (its shards, where split)."""
    params = list(model.parameters())
    states = [
        v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor) and v.numel() > 1
    ]  # (a step counter is not state worth counting)
    return {
        "parameters": _bytes(params),
        "gradients": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": _bytes(states),
    }


def peak_bytes(device: torch.device) -> int:
    """The peak memory of this rank: CUDA's allocator peak, or the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:  # Linux: the high-water mark since reset_peak
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # (Linux reports KiB, macOS bytes)


def reset_peak(device: torch.device) -> None:
    """Start the peak afresh, once the model is in its final layout (the whole model that FSDP or TP shard in place
    was on the device until then): CUDA's allocator peak on a GPU; on a CPU under Linux the resident set's
    high-water mark (then the current resident set: the interpreter, torch, the data), so that an engine that
    trained before reports this run's peak. Elsewhere a CPU's peak cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # (5: the peak resident set size reset to the current one; Linux 4.0 and later)


def memory_row(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> dict[str, int]:
    """:func:`tensor_bytes` and :func:`peak_bytes` as one row."""
    return {**tensor_bytes(model, optimizer), "peak": peak_bytes(device)}


#: Bytes per parameter that training keeps, by optimizer: the weights, their gradients, the optimizer's state.
OPTIMIZER_STATES = {"sgd": 1, "lars": 1, "adamw": 2, "lamb": 2}  # momentum; Adam's two moments


def estimate_bytes(
    parameters: int, optimizer: str = "adamw", ranks: int = 1, sharded: bool = False, bytes_per_value: int = 4
) -> dict[str, float]:
    """What one rank holds for ``parameters`` parameters: weights, gradients and optimizer state, in bytes.

    fp32 training keeps 4 bytes of each per value; Adam-type optimizers keep two values per
    parameter (first and second moment), SGD with momentum one. ``sharded`` (FSDP, ZeRO-3)
    divides all three by ``ranks``; DDP keeps all of them on every rank.
    """
    share = ranks if sharded else 1
    weights = parameters * bytes_per_value / share
    return {"parameters": weights, "gradients": weights, "optimizer_state": OPTIMIZER_STATES[optimizer] * weights}


def saved_activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes the forward pass of ``model`` on ``x`` keeps for the backward pass (the activations), counted exactly.

    Every tensor autograd saves goes through ``saved_tensors_hooks``; parameters are not
    counted (they are held anyway). With activation checkpointing a block saves only its input.
    """
    params = {p.data_ptr() for p in model.parameters()}
    seen: set[tuple[int, int]] = set()
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if tensor.data_ptr() not in params and key not in seen:  # (a storage saved twice is held once)
            seen.add(key)
            total += key[1]
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x).sum().backward()  # (the backward runs the recomputation, which saves again: counted once)
    model.zero_grad(set_to_none=True)
    return total


class HeldActivations:
    """The bytes autograd holds for backward passes still to come: now (``held``) and at most (``peak``).

    A context manager: inside it, every tensor autograd saves (an activation) is counted when saved and uncounted when
    autograd lets it go (its backward has run, or its graph was dropped); a storage saved several times counts once,
    and the parameters of ``model`` (held anyway) not at all. It measures what a pipeline's schedule keeps alive on a
    stage (GPipe: every micro-batch's activations before the first backward; 1F1B: a few) on any device, the CPU
    included, where no allocator peak tells activations from the rest.
    """

    def __init__(self, model: nn.Module):
        self._parameters = {_storage(p)[0] for p in model.parameters()}
        self._saved: dict[int, int] = {}  # storage -> how many saved tensors share it
        self.held = self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> "HeldActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> Any:
        key, size = _storage(tensor)
        if key in self._parameters or size == 0:
            return tensor
        if not self._saved.get(key):
            self.held += size
            self.peak = max(self.peak, self.held)
        self._saved[key] = self._saved.get(key, 0) + 1
        # (detached: a saved output keeps its own graph node alive through its grad_fn, a cycle through C++ that
        # Python's collector cannot break; the storage, what is counted, is the same)
        return _Saved(tensor.detach(), self, key, size)

    def _release(self, key: int, size: int) -> None:
        self._saved[key] -= 1
        if not self._saved[key]:
            del self._saved[key]
            self.held -= size


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    """(where, bytes) of the memory a tensor uses on this rank: a DTensor's (tensor parallelism) is its local
    shard's, as a wrapper subclass has no storage of its own."""
    local = getattr(tensor, "_local_tensor", tensor)  # (DTensor keeps its shard there; to_local() would be traced)
    storage = local.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class _Saved:
    """One saved tensor while autograd holds it; autograd drops it after its backward, and then it is uncounted."""

    __slots__ = ("tensor", "counter", "key", "size")

    def __init__(self, tensor: torch.Tensor, counter: HeldActivations, key: int, size: int):
        self.tensor, self.counter, self.key, self.size = tensor, counter, key, size

    def __del__(self) -> None:
        self.counter._release(self.key, self.size)


def _unpack(saved: Any) -> torch.Tensor:
    return saved.tensor if isinstance(saved, _Saved) else saved


def checkpointing_trade(cfg: Any, batch: int = 32, repeats: int = 5) -> dict[bool, dict[str, float]]:
    """Activation checkpointing off and on for ``cfg``'s model: bytes saved for backward, seconds per step.

    Both models start from the same seed and see the same batch of random maps; the time is
    the mean of ``repeats`` forward and backward passes (lesson 10).
    """
    import time

    from dlscale.models import build_model

    x = torch.randn(batch, 1, cfg.image_size, cfg.image_size)
    trade = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg.override({"activation_checkpointing": checkpointing}))
        saved = saved_activation_bytes(model, x)
        start = time.perf_counter()
        for _ in range(repeats):
            model(x).sum().backward()
        trade[checkpointing] = {"saved_bytes": saved, "seconds": (time.perf_counter() - start) / repeats}
    return trade
