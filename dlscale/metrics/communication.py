"""Bytes each rank sends per optimizer step, by layout: what DDP, FSDP and tensor parallelism cost on the wire.

Counted for ring collectives (NCCL's and gloo's large-message algorithm), where a rank of N sends
(N-1)/N of the buffer in a reduce-scatter or an all-gather and twice that in an all-reduce:

- DDP all-reduces every gradient once: 2 (N-1)/N x parameter bytes;
- FSDP (ZeRO-3, resharding after the forward pass) all-gathers the parameters for the forward
  pass and again for the backward pass, and reduce-scatters the gradients: 3 (N-1)/N x parameter
  bytes, 1.5x DDP's;
- tensor parallelism all-reduces activations instead: in each transformer block, the attention's
  and the MLP's outputs in the forward pass and their input gradients in the backward pass, four
  all-reduces of (batch x tokens x width) values per block.
"""

from __future__ import annotations


def data_parallel_bytes(parameters: int, ranks: int, bytes_per_value: int = 4) -> dict[str, float]:
    """Bytes one rank sends per step under DDP and FSDP, for a model of ``parameters`` values."""
    share = (ranks - 1) / ranks
    return {"DDP": 2 * share * parameters * bytes_per_value, "FSDP": 3 * share * parameters * bytes_per_value}


def tensor_parallel_bytes(batch: int, tokens: int, width: int, blocks: int, ranks: int,
                          bytes_per_value: int = 4) -> float:
    """Bytes one rank sends per step when each of ``blocks`` transformer blocks is split over ``ranks``."""
    return 4 * blocks * 2 * (ranks - 1) / ranks * batch * tokens * width * bytes_per_value
