"""Data-parallel plumbing: how this process was launched, the process group, DDP.

Every launcher leaves its own environment variables; :func:`detect` reads them (never a
hard-coded ``SLURM_PROCID``), so the same code runs under ``torchrun``, Slurm's ``srun``,
``mpirun`` (Open MPI, MPICH, Intel MPI), notebook-driven engines, or on its own:

================  ==========================================================================
torchrun          ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
srun              ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``; the master is the
                  first host of ``SLURM_JOB_NODELIST`` (never the login node, never
                  ``localhost`` on several nodes)
mpirun            ``OMPI_COMM_WORLD_*``, ``PMI_RANK``/``PMI_SIZE`` (MPICH, Intel MPI),
                  ``PMIX_RANK``; the master from ``MASTER_ADDR`` or broadcast with mpi4py
horovodrun        ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``
================  ==========================================================================

:func:`init` then creates the process group — NCCL on CUDA, gloo on CPU — with a timeout,
so a dead or missing peer ends every rank with a clear error instead of a hang; or, with
``data_parallel="horovod"`` (the default under horovodrun), starts Horovod instead. The
collectives below (:func:`all_reduce_mean`, :func:`broadcast_object`, :func:`barrier`, ...)
go to whichever is active, so the training loop has one code path. Lessons 00, 05 and 06
use it; ``dlscale.train`` calls it.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import horovod_backend
from .errors import DlscaleError, import_optional

#: Launchers in the order they are checked, with a variable each one always sets.
LAUNCHER_MARKERS = (
    ("horovodrun", "HOROVOD_RANK"),
    ("torchrun", "TORCHELASTIC_RUN_ID"),
    ("torchrun", "LOCAL_RANK"),
    ("slurm", "SLURM_PROCID"),
    ("mpi", "OMPI_COMM_WORLD_RANK"),
    ("mpi", "PMI_RANK"),
    ("mpi", "PMIX_RANK"),
)
DEFAULT_PORT = 29500
#: Seconds a draining :func:`shutdown` leaves the GIL to gloo's worker threads (see there).
_DRAIN_PAUSE_S = 0.05

#: ``horovod.torch`` once :func:`init` has started Horovod; the collectives then go through it.
_horovod: Any = None


class DistributedError(DlscaleError):
    """The job's processes could not form or keep a process group; the message says why."""


def detect_launcher(environ: Mapping[str, str] | None = None) -> str:
    """``horovodrun``, ``torchrun``, ``slurm``, ``mpi``, a name set in ``DLSCALE_LAUNCHER``, or ``single``.

    A Slurm *allocation* (``SLURM_JOB_ID`` without ``SLURM_PROCID``, e.g. a Jupyter server
    on a compute node) is still a single process: only ``srun`` makes ranks.
    """
    environ = os.environ if environ is None else environ
    if environ.get("DLSCALE_LAUNCHER"):
        return environ["DLSCALE_LAUNCHER"]
    for launcher, variable in LAUNCHER_MARKERS:
        if variable in environ:
            return launcher
    return "single"


def expand_nodelist(nodelist: str) -> list[str]:
    """Hosts of a Slurm node list: ``nid[001234-001236,001240],login01`` -> four nids and login01."""
    hosts = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{len(low)}d}")
    return hosts


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job: ranks, sizes, the launcher, and (after init) its device."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launcher: str = "single"
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    device: str = "cpu"
    backend: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        """One line for logs and lesson 00."""
        if not self.distributed:
            return f"single process ({self.launcher}) on {self.device}"
        return (f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}) via "
                f"{self.launcher}, {self.backend} on {self.device}, master {self.master_addr}:{self.master_port}")


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if environ.get(name, "") != "":
            return int(environ[name])
    if default is None:
        raise DistributedError(f"none of {', '.join(names)} is set")
    return default


def _tasks_on_first_node(value: str) -> int:
    """``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` such as ``4`` or ``4(x2),2``."""
    return int(re.match(r"\d+", value).group()) if value else 1


def _mpi_master(environ: Mapping[str, str]) -> str:
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    MPI = import_optional("mpi4py.MPI", "mpi", "under mpirun without MASTER_ADDR, broadcasting rank 0's address",
                          DistributedError, "or set MASTER_ADDR to the first host of the job")
    return MPI.COMM_WORLD.bcast(socket.gethostname() if MPI.COMM_WORLD.Get_rank() == 0 else None, root=0)


def detect(environ: Mapping[str, str] | None = None) -> DistEnv:
    """The :class:`DistEnv` the launcher's environment variables describe (no process group yet)."""
    environ = os.environ if environ is None else environ
    launcher = detect_launcher(environ)
    port = _int(environ, "MASTER_PORT", default=DEFAULT_PORT)
    if launcher == "single":
        return DistEnv()
    if launcher == "slurm":
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
        hosts = expand_nodelist(nodelist) if nodelist else []
        if environ.get("MASTER_ADDR"):
            master = environ["MASTER_ADDR"]
        elif hosts:
            master = hosts[0]
        else:
            raise DistributedError("under srun, SLURM_JOB_NODELIST is not set: cannot tell the master node")
        world = _int(environ, "SLURM_NTASKS", "SLURM_NPROCS")
        per_node = _tasks_on_first_node(environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", ""))
        return DistEnv(_int(environ, "SLURM_PROCID"), _int(environ, "SLURM_LOCALID", default=0), world,
                       per_node, "slurm", master, port)
    if launcher == "horovodrun":
        return DistEnv(_int(environ, "HOROVOD_RANK"), _int(environ, "HOROVOD_LOCAL_RANK", default=0),
                       _int(environ, "HOROVOD_SIZE"), _int(environ, "HOROVOD_LOCAL_SIZE", default=1), "horovodrun",
                       environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"), port)
    if launcher == "mpi":
        rank = _int(environ, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
        world = _int(environ, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_WORLD_SIZE")
        local = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID", default=0)
        local_size = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", default=world)
        master = _mpi_master(environ) if world > 1 else "127.0.0.1"
        return DistEnv(rank, local, world, local_size, "mpi", master, port)
    # torchrun, and helpers that set torchrun's variables (DLSCALE_LAUNCHER names them)
    world = _int(environ, "WORLD_SIZE", default=1)
    return DistEnv(_int(environ, "RANK", default=0), _int(environ, "LOCAL_RANK", default=0), world,
                   _int(environ, "LOCAL_WORLD_SIZE", default=world), launcher,
                   environ.get("MASTER_ADDR", "127.0.0.1"), port)


def resolve_data_parallel(choice: str, launcher: str) -> str:
    """``ddp``, ``fsdp`` or ``horovod``: ``auto`` means Horovod under horovodrun, DDP everywhere else."""
    if choice == "auto":
        return "horovod" if launcher == "horovodrun" else "ddp"
    if choice == "fsdp" and launcher == "horovodrun":
        raise DistributedError("data_parallel=fsdp needs torch.distributed, but this job was started by horovodrun, "
                               "which sets up Horovod; launch FSDP with torchrun, srun or mpirun")
    if choice == "ddp" and launcher == "horovodrun":
        raise DistributedError("this job was started by horovodrun, which sets up Horovod, not torch.distributed; "
                               "use data_parallel=horovod (or auto), or launch DDP with torchrun, srun or mpirun")
    return choice


def init(device: str = "auto", backend: str | None = None, timeout_s: float = 300.0,
         environ: Mapping[str, str] | None = None, data_parallel: str = "auto") -> DistEnv:
    """Join the job: pick the device (``cuda:LOCAL_RANK`` on GPUs) and, with several ranks, the process group.

    ``backend`` defaults to NCCL on CUDA and gloo otherwise. A peer that does not join, or
    dies later, makes collective calls fail after ``timeout_s`` instead of hanging forever.
    With ``data_parallel="horovod"`` Horovod is started instead and reports the ranks.
    """
    global _horovod
    env = detect(environ)
    if resolve_data_parallel(data_parallel, env.launcher) == "horovod":
        hvd = horovod_backend.init(env.launcher, timeout_s)
        _horovod = hvd
        env = replace(env, rank=hvd.rank(), local_rank=hvd.local_rank(), world_size=hvd.size(),
                      local_world_size=hvd.local_size(), backend="horovod")
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.is_available():
        index = env.local_rank % torch.cuda.device_count() if device in ("auto", "cuda") else torch.device(device).index
        torch.cuda.set_device(index)
        resolved = f"cuda:{index}"
    else:
        resolved = "cpu" if device == "auto" else device
    env = replace(env, device=resolved)
    if not env.distributed or env.backend == "horovod":
        return env
    backend = backend or ("nccl" if resolved.startswith("cuda") else "gloo")
    if dist.is_initialized():
        return replace(env, backend=dist.get_backend())
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # NCCL errors end the job instead of hanging it
    try:
        dist.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}", rank=env.rank,
                                world_size=env.world_size, timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as err:  # noqa: BLE001 - any failure to form the group gets the same explanation
        raise DistributedError(
            f"rank {env.rank} of {env.world_size} could not join the process group at {env.master_addr}:"
            f"{env.master_port} within {timeout_s:.0f} s ({type(err).__name__}: {err}). Check that every rank "
            f"started, that MASTER_ADDR is a compute node every rank can reach, and that the port is free") from None
    return replace(env, backend=backend)


def uses_horovod() -> bool:
    """Whether :func:`init` started Horovod (rather than a torch.distributed process group)."""
    return _horovod is not None


def group_size() -> int:
    """Ranks in the active group: Horovod's, torch.distributed's, or 1."""
    if _horovod is not None:
        return _horovod.size()
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def shutdown(drain: bool = True) -> None:
    """Leave the process group or Horovod (a no-op when there is none).

    ``drain`` (a normal end) first meets the other ranks at a barrier. Pass ``drain=False``
    when a rank may be dead or stuck: the barrier would wait for it until the timeout.
    """
    global _horovod
    if _horovod is not None:
        _horovod.shutdown()
        _horovod = None
    if dist.is_available() and dist.is_initialized():
        if drain:
            # A gloo worker thread frees a finished collective's tensors just after the caller
            # resumes, and that takes the GIL. If the process is already exiting by then, Python
            # ends the thread mid-destructor and the rank dies of SIGABRT ("terminate called
            # without an active exception", about 1 in 100 two-rank runs with torch 2.13). The
            # barrier completes every rank's collectives; the barrier's own work still holds the
            # last one until a worker frees it after we resume, so the pause (the GIL released)
            # lets that happen before the interpreter can start finalizing.
            dist.barrier()
            time.sleep(_DRAIN_PAUSE_S)
        dist.destroy_process_group()


def barrier() -> None:
    if _horovod is not None:
        _horovod.barrier()
    elif dist.is_available() and dist.is_initialized():
        dist.barrier()


def is_main() -> bool:
    """True on rank 0, and in a single process."""
    if _horovod is not None:
        return _horovod.rank() == 0
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on the main rank only."""
    if is_main():
        print(*args, **kwargs)


def _all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    """``op`` (``Sum`` or ``Max``) over ranks, in place, with Horovod or torch.distributed."""
    if group_size() > 1:
        if _horovod is not None:
            _horovod.allreduce_(tensor, op=getattr(_horovod, op))
        else:
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
    return tensor


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (for a master, a daemon or an engine to listen on)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def collective_device() -> torch.device:
    """Where a collective's tensors must live: this rank's GPU under NCCL (it rejects CPU tensors), else the CPU."""
    if _horovod is None and dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over ranks, in place (unchanged in a single process)."""
    return _all_reduce(tensor, "Sum")


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum over ranks, in place (unchanged in a single process)."""
    return _all_reduce(tensor, "Max")


def all_reduce_mean(value: torch.Tensor | float) -> torch.Tensor | float:
    """The mean over ranks of a tensor (in place) or a number."""
    size = group_size()
    if size == 1:
        return value
    if isinstance(value, torch.Tensor):
        return all_reduce_sum(value).div_(size)
    tensor = torch.tensor(float(value), dtype=torch.float64, device=collective_device())
    return float(all_reduce_sum(tensor)) / size


def all_reduce_max_flag(flag: bool, device: str | torch.device = "cpu") -> bool:
    """True on every rank if it is true on any rank (used for a stop signal that reached one rank)."""
    if group_size() == 1:
        return flag
    return bool(all_reduce_max(torch.tensor([1.0 if flag else 0.0], device=device)).item())


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank."""
    if _horovod is not None:
        # The name must match on every rank; Horovod's default is the type of obj, which differs off the root.
        return _horovod.broadcast_object(obj, root_rank=src, name="dlscale.broadcast_object")
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order, on every rank (``[obj]`` in one process)."""
    if _horovod is not None:
        return _horovod.allgather_object(obj, name="dlscale.all_gather_object")
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def wrap_model(model: nn.Module, env: DistEnv, bucket_cap_mb: float = 25.0, gradient_as_bucket_view: bool = True,
               static_graph: bool = False) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when there are several ranks, else unchanged.

    Under Horovod the model stays as it is: Horovod wraps the optimizer instead
    (:func:`wrap_optimizer`).
    """
    if not env.distributed or env.backend == "horovod":
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.device(env.device).index] if env.device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb,
                                   gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph)


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module, env: DistEnv, fp16_compression: bool = False,
                   backward_passes_per_step: int = 1) -> tuple[torch.optim.Optimizer, Any]:
    """Under Horovod, ``optimizer`` behind ``hvd.DistributedOptimizer`` and the object to ``synchronize()``.

    Under DDP (or in one process) the optimizer is returned unchanged with ``None``: DDP has
    already averaged the gradients when ``backward()`` returns.
    """
    if env.backend != "horovod":
        return optimizer, None
    return horovod_backend.distributed_optimizer(optimizer, model, fp16_compression, backward_passes_per_step)
