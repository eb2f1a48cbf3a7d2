"""FLOPs and model FLOPs utilisation: a model's training FLOPs per sample, the device's peak, and MFU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: Dense peaks from NVIDIA's and AMD's data sheets, by a part of the name torch reports; the first match wins,
#: so the PCIe and NVL cards (lower clocks and power) come before the SXM H100's plain "H100".
PEAK_FLOPS = {
    ("A100", "bf16"): 312e12,
    ("A100", "fp16"): 312e12,
    ("A100", "tf32"): 156e12,
    ("A100", "fp32"): 19.5e12,
    ("H100 PCIe", "bf16"): 756e12,
    ("H100 PCIe", "fp16"): 756e12,
    ("H100 PCIe", "tf32"): 378e12,
    ("H100 PCIe", "fp32"): 51e12,
    ("H100 NVL", "bf16"): 835e12,
    ("H100 NVL", "fp16"): 835e12,
    ("H100 NVL", "tf32"): 417.5e12,
    ("H100 NVL", "fp32"): 60e12,
    ("H100", "bf16"): 989e12,
    ("H100", "fp16"): 989e12,
    ("H100", "tf32"): 494.7e12,
    ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12,
    ("H200", "fp16"): 989e12,
    ("H200", "tf32"): 494.7e12,
    ("H200", "fp32"): 67e12,
    ("V100", "fp16"): 125e12,
    ("V100", "fp32"): 15.7e12,
    ("MI250X", "bf16"): 191.5e12,
    ("MI250X", "fp16"): 191.5e12,
    ("MI250X", "fp32"): 47.9e12,
}


def peak_flops(device: torch.device | str, precision: str) -> float | None:
    """The peak FLOP/s of a known GPU for ``precision``, or None (CPUs, unknown GPUs)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for (gpu, prec), flops in PEAK_FLOPS.items() if gpu in name and prec == precision), None)


def peak_precision(device: torch.device | str, precision: str, convolutions: bool = True) -> str:
    """The precision whose peak an ``fp32`` run really runs at: ``tf32`` where the kernels doing most of
    the FLOPs use TF32 and the GPU has it -- cuDNN for a model of ``convolutions`` (on by default in
    PyTorch), cuBLAS for matmuls (``torch.backends.cuda.matmul.allow_tf32``, off by default) --
    otherwise ``precision`` itself.
    """
    device = torch.device(device)
    if precision != "fp32" or device.type != "cuda":
        return precision
    tf32 = torch.backends.cudnn.allow_tf32 if convolutions else torch.backends.cuda.matmul.allow_tf32
    name = torch.cuda.get_device_name(device)
    has_tf32 = any(gpu in name for gpu, prec in PEAK_FLOPS if prec == "tf32")
    return "tf32" if tf32 and has_tf32 else "fp32"


@dataclass(frozen=True)
class FlopCount:
    """A training step's FLOPs per sample, the share of them in convolutions (cuDNN) rather than matmuls, and what
    recomputation adds."""

    per_sample: float
    convolution_share: float = 0.0
    #: FLOPs per sample that activation checkpointing adds by running forward passes again in the backward: work
    #: the hardware does but the model does not need (MFU leaves them out; hardware utilisation counts them).
    recomputed: float = 0.0


def count_flops(
    model: nn.Module,
    input_shape: Sequence[int],
    loss_fn: Callable | None = None,
    targets: int | None = None,
    batch: int = 2,
) -> FlopCount:
    """FLOPs of one training step (forward and backward) per sample, counted by ``FlopCounterMode``.

    ``targets`` is the number of regression targets; by default, as many as the model outputs.
    A model on the meta device is counted without memory or kernels (the training counts so,
    before the model is sharded); a real model is left as it was found.
    """
    from torch.utils.flop_counter import FlopCounterMode

    first = next(model.parameters())
    # The count does not depend on values; no RNG draws.
    x = torch.zeros(batch, *input_shape, device=first.device, dtype=first.dtype)
    loss_fn = loss_fn or nn.functional.mse_loss
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        y = torch.zeros(batch, out.shape[1] if targets is None else targets, device=first.device, dtype=first.dtype)
        loss_fn(out, y).backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # batch-norm statistics moved during the count
    total = counter.get_total_flops()
    convolutions = sum(n for op, n in counter.get_flop_counts().get("Global", {}).items() if "convolution" in str(op))
    return FlopCount(total / batch, convolutions / total if total else 0.0)


def flops_per_sample(
    model: nn.Module,
    input_shape: Sequence[int],
    loss_fn: Callable | None = None,
    targets: int | None = None,
    batch: int = 2,
) -> float:
    """FLOPs of one training step (forward and backward) per sample (:func:`count_flops`)."""
    return count_flops(model, input_shape, loss_fn, targets, batch).per_sample


def mfu(samples_per_s: float, flops_per_sample_: float, peak: float | None, tensor_parallel: int = 1) -> float | None:
    """Model FLOPs utilisation of one device: achieved training FLOP/s over its peak (None if unknown).

    ``samples_per_s`` is one rank's rate. Under tensor parallelism ``tensor_parallel`` ranks share each
    sample's FLOPs (each computes its share of every layer), so one device does 1/``tensor_parallel`` of them; the
    engine passes tensor parallel × pipeline stages (a stage computes its blocks' share).
    """
    if not peak:
        return None
    return samples_per_s * flops_per_sample_ / tensor_parallel / peak
