"""Mixed precision as one policy: an autocast context and a grad scaler, one code path.

``Precision.resolve("auto" | "fp32" | "bf16" | "fp16", device)`` checks what the device can
do and returns a policy whose ``autocast()`` runs the forward pass in the chosen type and
whose ``grad_scaler()`` is a :class:`torch.amp.GradScaler` that is enabled only for fp16
(bf16 has fp32's exponent range and needs no loss scaling). The training step is then the
same for every precision::

    with policy.autocast():
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

``"auto"`` picks bf16 on GPUs that have it (Ampere and newer: A100, H100, MI250X), fp16 with
loss scaling on Volta-class GPUs (Summit's V100), and fp32 on CPUs, where bf16 only pays on
chips with AMX or AVX-512-BF16 (ask for it explicitly). ``"fp64"`` keeps the parameters and
the data in float64 with autocast off: slow, and meant for checks that two ways of computing
the same step agree (the equivalence tests), where float32 rounding, amplified by Adam-type
updates, would otherwise depend on which CPU kernels ran. Lesson 03 uses
:func:`gradient_underflow` to show why fp16 needs the scaler.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ContextManager

import torch
from torch import nn

from dlscale.errors import DlscaleError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "fp64")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


class PrecisionError(DlscaleError):
    """The device cannot do the precision asked for; the message says what it can do."""


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _rocm_arch(device: torch.device) -> str | None:
    """The AMD GPU's architecture (``gfx90a`` on MI250X), or None on CUDA builds of torch."""
    if not torch.version.hip:
        return None
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]


#: AMD architectures with bf16 matrix instructions: MI200 (gfx90a), MI300 (gfx94x), MI350 (gfx950), RDNA3/4.
_ROCM_BF16 = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def supports_bf16(device: torch.device | str) -> bool:
    """Whether the GPU computes in bf16 natively: NVIDIA compute capability 8.0+ (Ampere), or a bf16 AMD part.

    Not ``torch.cuda.is_bf16_supported()``: by default it counts emulation and says yes on a V100
    or T4, where bf16 runs slowly and fp16 with loss scaling is the right choice.
    """
    device = torch.device(device)
    arch = _rocm_arch(device)
    if arch is not None:
        return arch.startswith(_ROCM_BF16)
    return _capability(device)[0] >= 8


@dataclass(frozen=True)
class Precision:
    """A resolved precision (``fp32``, ``bf16`` or ``fp16``) for one device type."""

    name: str
    device_type: str
    fsdp_casts: bool = False  # FSDP's mixed-precision policy casts the parameters: no autocast on top

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes in (float32 or float64 means autocast is off)."""
        return _DTYPES[self.name]

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the parameters and of the inputs: float64 for ``fp64``, float32 otherwise."""
        return torch.float64 if self.name == "fp64" else torch.float32

    @classmethod
    def resolve(cls, request: str, device: torch.device | str) -> "Precision":
        """The policy for ``request`` on ``device``, or a :class:`PrecisionError` if it cannot run there."""
        device = torch.device(device)
        if request not in PRECISIONS:
            raise PrecisionError(f"precision must be one of {', '.join(PRECISIONS)}; got {request!r}")
        if device.type == "cuda":
            major, minor = _capability(device)
            name = torch.cuda.get_device_name(device)
            bf16 = supports_bf16(device)
            if request == "auto":
                request = "bf16" if bf16 else "fp16" if major >= 7 else "fp32"
            if request == "bf16" and not bf16:
                raise PrecisionError(
                    f"precision=bf16 needs a GPU with bfloat16 (Ampere or newer, compute 8.0+); "
                    f"{name} has compute {major}.{minor}: use precision=fp16 (with loss scaling) "
                    f"or fp32"
                )
            if request == "fp16" and major < 6:
                raise PrecisionError(
                    f"precision=fp16 needs compute 6.0 or newer; {name} has {major}.{minor}: use precision=fp32"
                )
            return cls(request, "cuda")
        if device.type == "cpu":
            return cls("fp32" if request == "auto" else request, "cpu")
        if request == "fp64":
            return cls("fp64", device.type)
        if request not in ("auto", "fp32"):
            raise PrecisionError(f"precision={request} is not supported on {device.type} devices here; use fp32")
        return cls("fp32", device.type)

    def autocast(self) -> ContextManager:
        """The context for the forward pass and loss (a no-op for fp32)."""
        if self.name in ("fp32", "fp64") or self.fsdp_casts:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self, init_scale: float = 2.0**16) -> torch.amp.GradScaler:
        """A GradScaler that scales only for fp16; with anything else its calls pass straight through."""
        return torch.amp.GradScaler(self.device_type, init_scale=init_scale, enabled=self.name == "fp16")

    def __str__(self) -> str:
        return self.name


@dataclass
class Underflow:
    """How many gradient elements that are non-zero in fp32 become zero in fp16."""

    unscaled: float
    scaled: float
    scale: float
    elements: int


def gradient_underflow(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.mse_loss,
    scale: float = 2.0**16,
) -> Underflow:
    """Fractions of gradient elements lost to fp16 underflow, without and with loss scaling.

    The gradients of a half-precision copy of ``model`` are compared with the fp32 ones:
    an element that is non-zero in fp32 but exactly zero in fp16 has underflowed (fp16's
    smallest positive value is about 6e-8). Multiplying the loss by ``scale`` before the
    backward pass lifts small gradients into range, which is what the GradScaler does.
    """
    reference = [p.grad for p in _grads(model, x, y, loss_fn, 1.0, torch.float32)]
    alive = [g != 0 for g in reference]
    total = int(sum(a.sum() for a in alive))
    fractions = []
    for factor in (1.0, scale):
        grads = _grads(model, x, y, loss_fn, factor, torch.float16)
        lost = sum(int(((g.grad == 0) & a).sum()) for g, a in zip(grads, alive))
        fractions.append(lost / max(total, 1))
    return Underflow(unscaled=fractions[0], scaled=fractions[1], scale=scale, elements=total)


def _grads(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable, factor: float, dtype: torch.dtype
) -> list[nn.Parameter]:
    import copy

    twin = copy.deepcopy(model).to(dtype)
    twin.train()
    loss = loss_fn(twin(x.to(dtype)).float(), y.float()) * factor
    loss.backward()
    return [p for p in twin.parameters() if p.grad is not None]
