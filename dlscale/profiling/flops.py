"""FLOPs and model FLOPs utilisation: a model's training FLOPs per sample, the device's peak, and MFU."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

PEAK_FLOPS = {
    ("A100", "bf16"): 312e12, ("A100", "fp16"): 312e12, ("A100", "tf32"): 156e12, ("A100", "fp32"): 19.5e12,
    ("H100", "bf16"): 989e12, ("H100", "fp16"): 989e12, ("H100", "tf32"): 494.7e12, ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12, ("H200", "fp16"): 989e12, ("H200", "tf32"): 494.7e12, ("H200", "fp32"): 67e12,
    ("V100", "fp16"): 125e12, ("V100", "fp32"): 15.7e12,
    ("MI250X", "bf16"): 191.5e12, ("MI250X", "fp16"): 191.5e12, ("MI250X", "fp32"): 47.9e12,
}


def peak_flops(device: torch.device | str, precision: str) -> float | None:
    """The peak FLOP/s of a known GPU for ``precision``, or None (CPUs, unknown GPUs)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for (gpu, prec), flops in PEAK_FLOPS.items() if gpu in name and prec == precision), None)


def peak_precision(device: torch.device | str, precision: str, convolutions: bool = True) -> str:
    """The precision whose peak an ``fp32`` run really runs at: ``tf32`` where cuDNN (for a model
    of convolutions, PyTorch's default) or cuBLAS (``allow_tf32`` for matmuls) uses TF32 and the GPU
    has it; otherwise ``precision`` itself.
    """
    device = torch.device(device)
    if precision != "fp32" or device.type != "cuda":
        return precision
    tf32 = torch.backends.cudnn.allow_tf32 if convolutions else torch.backends.cuda.matmul.allow_tf32
    name = torch.cuda.get_device_name(device)
    has_tf32 = any(gpu in name for gpu, prec in PEAK_FLOPS if prec == "tf32")
    return "tf32" if tf32 and has_tf32 else "fp32"


def flops_per_sample(model: nn.Module, input_shape: Sequence[int], loss_fn: Callable | None = None,
                     targets: int | None = None, batch: int = 2) -> float:
    """FLOPs of one training step (forward and backward) per sample, counted by ``FlopCounterMode``.

    ``targets`` is the number of regression targets; by default, as many as the model outputs."""
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
    return counter.get_total_flops() / batch


def mfu(samples_per_s: float, flops_per_sample_: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the device's peak (None if unknown)."""
    if not peak:
        return None
    return samples_per_s * flops_per_sample_ / peak
