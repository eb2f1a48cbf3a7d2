"""Which device a run uses: ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, checked.

Training (``device=``), K-Means (``KMeans(device=...)``) and ``dlscale kmeans --device`` all
resolve their setting here, so a GPU that is not there is the same clear error everywhere.
"""

from __future__ import annotations

import torch

from dlscale.errors import DlscaleError


class DeviceError(DlscaleError):
    """The requested device is not available here; the message says what to use instead."""


def resolve_device(spec: str | torch.device | None, error: type[DlscaleError] = DeviceError) -> torch.device:
    """``auto`` (or None) picks CUDA when present; asking for a GPU that is not there raises ``error``."""
    if spec is None or spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise error(f"device={spec} was asked for, but this torch sees no CUDA GPU "
                        f"(torch {torch.__version__}); use device=auto or device=cpu, or run on a GPU node")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise error(f"device={spec} was asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, channels_last: bool = False,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch on ``device`` in ``dtype`` (float64 for ``precision=fp64``), the maps in NHWC if asked."""
    x = x.to(device, dtype, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device, dtype, non_blocking=True)
