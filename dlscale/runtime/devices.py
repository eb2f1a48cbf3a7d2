"""Which device a run uses: ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, checked.

Training (``device=``), K-Means (``KMeans(device=...)``) and ``dlscale kmeans --device`` all
resolve their setting here, so a GPU that is not there is the same clear error everywhere.
"""

from __future__ import annotations

import torch

from dlscale.errors import DlscaleError


class DeviceError(DlscaleError):
    """The requested device is not available here; the message says what to use instead."""


def cpu_name() -> str:
    """The CPU as the kernel names it, with its family and model numbers where it gives them (AMD's Zen 3 Milan is
    family 25 model 1): what a benchmark names beside its figures."""
    import platform
    from pathlib import Path

    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            found.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = found.get("model name") or found.get("Model") or platform.processor() or platform.machine()  # (x86, Arm)
    numbers = f", family {found['cpu family']} model {found['model']}" if "cpu family" in found else ""
    return name + numbers


def device_for_ranks(ranks_on_node: int) -> str:
    """The device for one process to compare with ``ranks_on_node`` ranks started on this node with ``device=auto``.

    NCCL puts one rank on a GPU, so ranks that outnumber this node's GPUs train on the CPU (the process group's
    ``init`` says so); a single-process run compared with them must too, or the two differ by the device's
    rounding, not by what the lesson measures. Elsewhere ``auto``.
    """
    return "cpu" if 0 < torch.cuda.device_count() < ranks_on_node else "auto"


def resolve_device(spec: str | torch.device | None, error: type[DlscaleError] = DeviceError) -> torch.device:
    """``auto`` (or None) picks CUDA when present; asking for a GPU that is not there raises ``error``."""
    if spec is None or spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise error(f"device={spec} was asked for, but {_why_no_gpu()}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise error(f"device={spec} was asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def _why_no_gpu() -> str:
    """Why this torch sees no GPU, and the fix: a CPU-only build, or a node without one."""
    if torch.version.cuda is None and torch.version.hip is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build. Install a GPU build into the environment: "
            f"on NVIDIA GPUs PyPI's torch for Linux (make setup), on AMD GPUs (Frontier) a ROCm build from "
            f"PyTorch's ROCm wheel index (make setup TORCH_INDEX=https://download.pytorch.org/whl/rocmX.Y, "
            f"see the README); or train on the CPU with device=cpu"
        )
    return (
        f"this torch ({torch.__version__}) sees no GPU on this node: run on a GPU node (ask for GPUs with "
        f"--gpus-per-node), check CUDA_VISIBLE_DEVICES, or train on the CPU with device=cpu"
    )


#: The GPU each local rank uses, in local-rank order, where a site's GPU numbering runs against its
#: CPU numbering (Perlmutter: "3,2,1,0", so that rank 0, bound to the first cores, gets the GPU on
#: their NUMA domain). Read inside each task: Slurm sets CUDA_VISIBLE_DEVICES again for every task
#: of a step, so an order exported to CUDA_VISIBLE_DEVICES in the batch shell never reaches the ranks.
GPU_ORDER_VARIABLE = "DLSCALE_GPU_ORDER"


def gpu_index(local_rank: int, visible: int, order: str | None = None) -> int:
    """The index (among the ``visible`` GPUs) that the task of ``local_rank`` uses.

    ``order`` (``DLSCALE_GPU_ORDER``, e.g. ``"3,2,1,0"``) applies when the task sees every GPU it
    names; a task that sees fewer (``--gpu-bind``, ``--gpus-per-task``) was already given its own,
    and takes ``local_rank`` modulo what it sees.
    """
    if visible < 1:
        raise DeviceError("no GPU is visible to this task; check --gpus-per-node and CUDA_VISIBLE_DEVICES")
    if order:
        try:
            indices = [int(i) for i in order.split(",")]
        except ValueError:
            raise DeviceError(
                f"{GPU_ORDER_VARIABLE}={order!r} is not a comma-separated list of GPU numbers, e.g. 3,2,1,0"
            ) from None
        if sorted(indices) != list(range(len(indices))):
            raise DeviceError(f"{GPU_ORDER_VARIABLE}={order!r} must name each of the GPUs 0..{len(indices) - 1} once")
        if len(indices) == visible:
            return indices[local_rank % visible]
    return local_rank % visible


def to_device(
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch on ``device`` in ``dtype`` (float64 for ``precision=fp64``), the maps in NHWC if asked."""
    x = x.to(device, dtype, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device, dtype, non_blocking=True)
