"""The process group: joining the job, which rank am I, and the collectives, on torch.distributed or Horovod.

:func:`init` creates the process group — NCCL on CUDA, gloo on CPU — with a timeout, so a
dead or missing peer ends every rank with a clear error instead of a hang; or, with
``data_parallel="horovod"`` (the default under horovodrun), starts Horovod instead.

This module is the one place that asks "which rank am I, and is a group up":
:func:`rank`, :func:`group_size`, :func:`group_is_up`. The collectives below
(:func:`all_reduce_sum`, :func:`all_gather`, :func:`broadcast_object`, :func:`barrier`, ...)
go to whichever is active — Horovod when it has been initialised, else torch.distributed,
else nothing (one process) — so callers have one code path. The state lives in Horovod and
torch.distributed themselves; nothing here is a global to set or forget.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from dlscale.distributed import horovod_backend
from dlscale.distributed.launch_variables import DistEnv, DistributedError, detect
from dlscale.runtime.devices import GPU_ORDER_VARIABLE, device_for_ranks, gpu_index

#: Seconds a draining :func:`shutdown` leaves the GIL to gloo's worker threads (see there).
_DRAIN_PAUSE_S = 0.05


def _horovod() -> ModuleType | None:
    """``horovod.torch`` when Horovod has been initialised in this process, else None."""
    hvd = sys.modules.get("horovod.torch")
    return hvd if hvd is not None and hvd.is_initialized() else None


def _torch_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def resolve_data_parallel(choice: str, launcher: str) -> str:
    """``ddp``, ``fsdp`` or ``horovod``: ``auto`` means Horovod under horovodrun, DDP everywhere else."""
    if choice == "auto":
        return "horovod" if launcher == "horovodrun" else "ddp"
    if choice == "fsdp" and launcher == "horovodrun":
        raise DistributedError(
            "data_parallel=fsdp needs torch.distributed, but this job was started by horovodrun, "
            "which sets up Horovod; launch FSDP with torchrun, srun or mpirun"
        )
    if choice == "ddp" and launcher == "horovodrun":
        raise DistributedError(
            "this job was started by horovodrun, which sets up Horovod, not torch.distributed; "
            "use data_parallel=horovod (or auto), or launch DDP with torchrun, srun or mpirun"
        )
    return choice


def init(
    device: str = "auto",
    backend: str | None = None,
    timeout_s: float = 300.0,
    environ: Mapping[str, str] | None = None,
    data_parallel: str = "auto",
) -> DistEnv:
    """Join the job: pick the device (``cuda:LOCAL_RANK`` on GPUs) and, with several ranks, the process group.

    ``backend`` defaults to NCCL on CUDA and gloo otherwise. A peer that does not join, or
    dies later, makes collective calls fail after ``timeout_s`` instead of hanging forever.
    With ``data_parallel="horovod"`` Horovod is started instead and reports the ranks.
    """
    env = detect(environ)
    if resolve_data_parallel(data_parallel, env.launcher) == "horovod":
        on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        hvd = horovod_backend.init(env.launcher, timeout_s, on_gpu)
        env = replace(
            env,
            rank=hvd.rank(),
            local_rank=hvd.local_rank(),
            world_size=hvd.size(),
            local_world_size=hvd.local_size(),
            backend="horovod",
        )
    environ = os.environ if environ is None else environ
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.is_available() and device in ("auto", "cuda") and _ranks_share_a_gpu(env, device):
        wants_cuda = False  # (device=auto: the ranks of a notebook on a one-GPU node train on the CPU instead)
    if wants_cuda and torch.cuda.is_available():
        index = (
            gpu_index(env.local_rank, torch.cuda.device_count(), environ.get(GPU_ORDER_VARIABLE))
            if device in ("auto", "cuda")
            else torch.device(device).index
        )
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
    # (TORCH_NCCL_ASYNC_ERROR_HANDLING keeps PyTorch's default, 3: a failed collective tears the process down
    # without aborting the communicators, because an abort can itself hang; pytorch#110723, NVIDIA/nccl#829)
    try:
        # device_id binds the group to this rank's GPU: without it NCCL guesses the GPU from the global rank,
        # which is wrong with cyclic task layouts or tasks per node other than GPUs per node, and can hang.
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _loopback_store(env, timeout, environ)
        dist.init_process_group(
            backend,
            init_method=None if store else f"tcp://{env.master_addr}:{env.master_port}",
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=torch.device(resolved) if backend == "nccl" else None,
        )
    except Exception as err:  # noqa: BLE001 - any failure to form the group: its own words first
        raise DistributedError(
            f"rank {env.rank} of {env.world_size} could not join the {backend} process group: {type(err).__name__}: "
            f"{err}. (If it waited for the other ranks: check that every rank started within {timeout_s:.0f} s and "
            f"that MASTER_ADDR {env.master_addr}:{env.master_port} is a compute node every rank can reach.)"
        ) from None
    return replace(env, backend=backend)


def _loopback_store(env: DistEnv, timeout: datetime.timedelta, environ: Mapping[str, str]) -> Any:
    """The rendezvous store of a job whose ranks all run on this machine, listening on the loopback only.

    torch's own store (``init_method=tcp://``) listens on every interface whatever MASTER_ADDR says, so a job on a
    shared login node or laptop would take connections from the network. Rank 0 binds the socket to the loopback
    itself and hands it to the store. ``None`` (torch's usual way) for any other job, and under torchrun, whose
    agent has made the store already (its static rendezvous has no bind address: docs/architecture.md).
    """
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or not _is_loopback(env.master_addr):
        return None
    return tcp_store(env.master_addr, env.master_port, env.world_size, env.rank == 0, timeout)


def tcp_store(host: str, port: int, size: int, is_master: bool, timeout: datetime.timedelta) -> Any:
    """A TCP store of ``size`` processes on ``host:port``; the master's listens on the loopback only when ``host``
    names it (torch's listens on every interface)."""
    if not is_master:
        return dist.TCPStore(host, port, size, False, timeout)
    if not _is_loopback(host):
        return dist.TCPStore(host, port, size, True, timeout, wait_for_workers=False)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
        # The store takes the socket over; Python must not close it under the store.
        return dist.TCPStore(
            host, port, size, True, timeout, wait_for_workers=False, master_listen_fd=listener.detach()
        )
    except BaseException:
        listener.close()
        raise


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's IPv4 loopback (127.0.0.0/8, or ``localhost``)."""
    return host == "localhost" or host.startswith("127.")


def _ranks_share_a_gpu(env: DistEnv, device: str) -> bool:
    """Whether this node's ranks outnumber its visible GPUs, so two would share one (which NCCL refuses).

    Under Slurm a task bound to its own GPU (``--gpus-per-task``, ``--gpu-bind``) sees one, whatever the
    ranks per node: only more ranks than GPUs that each task sees, several, is sharing there. With
    ``device=auto`` the ranks then train on the CPU, said in one line; asked for ``cuda``, it is an error.
    """
    visible = torch.cuda.device_count()
    # (the rule the lessons' single-process comparisons follow too: device_for_ranks)
    if device_for_ranks(env.local_world_size) == "auto" or (env.launcher == "slurm" and visible == 1):
        return False
    if device != "auto":
        raise DistributedError(
            f"{env.local_world_size} ranks on this node but {visible} GPU(s) visible: NCCL cannot "
            f"put two ranks on one GPU. Start at most {visible} rank(s) per node "
            f"(--nproc-per-node, --ntasks-per-node, the engines' count), or use device=cpu"
        )
    if env.local_rank == 0:
        print(
            f"dlscale: {env.local_world_size} ranks on this node and {visible} GPU(s): the ranks train on the CPU "
            f"(gloo); start one rank per GPU to train on them",
            flush=True,
        )
    return True


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` says a collective failed because another rank died, was killed or went silent.

    NCCL's and the store's failures are ``torch.distributed.DistError``s (``DistBackendError`` for
    the watchdog's timeout); gloo raises a plain ``RuntimeError`` from its transport ("Connection
    closed by peer", "Timed out waiting ... for recv"). Anything else, an out-of-memory error
    among them, is this rank's own.
    """
    if isinstance(err, torch.OutOfMemoryError):
        return False
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return "gloo/transport" in text or "Connection closed by peer" in text or "Timed out waiting" in text


def uses_horovod() -> bool:
    """Whether Horovod (rather than a torch.distributed process group) carries the collectives."""
    return _horovod() is not None


def group_is_up() -> bool:
    """Whether this process is in a group of ranks (Horovod or torch.distributed), even a group of one."""
    return _horovod() is not None or _torch_group()


def rank() -> int:
    """This process's rank in the active group (0 in a single process)."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.rank()
    return dist.get_rank() if _torch_group() else 0


def group_size() -> int:
    """Ranks in the active group: Horovod's, torch.distributed's, or 1."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.size()
    return dist.get_world_size() if _torch_group() else 1


def is_main() -> bool:
    """True on rank 0, and in a single process."""
    return rank() == 0


def shutdown(drain: bool = True) -> None:
    """Leave the process group or Horovod (a no-op when there is none).

    ``drain`` (a normal end) first meets the other ranks at a barrier. Pass ``drain=False``
    when a rank may be dead or stuck: the barrier would wait for it until the timeout.
    """
    hvd = _horovod()
    if hvd is not None:
        hvd.shutdown()
    if _torch_group():
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
    hvd = _horovod()
    if hvd is not None:
        hvd.barrier()
    elif _torch_group():
        dist.barrier()


def _lazy_gloo_group(timeout: datetime.timedelta) -> Any:
    """A gloo group of every rank whose pairs connect when first used (torch's ``TORCH_GLOO_LAZY_INIT``, set while
    the group is made): a monitored barrier links rank 0 with each other rank only, where a full mesh would open
    a socket to every rank on every rank (thousands on a large job, past the usual limit of open files)."""
    before = os.environ.get("TORCH_GLOO_LAZY_INIT")
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    try:
        return dist.new_group(backend="gloo", timeout=timeout)
    finally:
        if before is None:
            del os.environ["TORCH_GLOO_LAZY_INIT"]
        else:
            os.environ["TORCH_GLOO_LAZY_INIT"] = before


@contextlib.contextmanager
def setup_waits(timeout_s: float) -> Iterator[Callable[[str], None]]:
    """``wait(what)`` inside the block: a barrier that waits up to ``timeout_s``, not the group's timeout.

    For the waits while a run sets up that last as long as one rank's work for all (rank 0 writing the
    synthetic data set, a node's first rank staging the shards), which a ``dist_timeout_s`` sized for one
    collective would cut short. A rank that does not arrive in time is named. The waits use gloo's monitored
    barrier in a group made on entry, while every rank is there: its ranks wait for one another under their
    group's timeout, whatever the barrier's own says. Its connections are made lazily (:func:`_lazy_gloo_group`).
    """
    hvd = _horovod()
    if hvd is not None or not _torch_group():
        yield (lambda what: hvd.barrier()) if hvd is not None else (lambda what: None)  # (Horovod bounds none)
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    group = _lazy_gloo_group(timeout)

    def wait(what: str) -> None:
        try:
            dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=True)
        except RuntimeError as err:
            raise DistributedError(
                f"rank {rank()}: not every rank finished {what} within setup_timeout_s="
                f"{timeout_s:g} s ({str(err).splitlines()[0][:200]}); raise setup_timeout_s if "
                f"that work takes longer, or look for a rank that died"
            ) from err

    try:
        yield wait
    finally:
        dist.destroy_process_group(group)


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on the main rank only."""
    if is_main():
        print(*args, **kwargs)


def _all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    """``op`` (``Sum`` or ``Max``) over ranks, in place, with Horovod or torch.distributed."""
    if group_size() > 1:
        hvd = _horovod()
        if hvd is not None:
            hvd.allreduce_(tensor, op=getattr(hvd, op))
        else:
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
    return tensor


def collective_device() -> torch.device:
    """Where a collective's tensors must live: this rank's GPU under NCCL (it rejects CPU tensors), else the CPU."""
    if _horovod() is None and _torch_group() and dist.get_backend() == "nccl":
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


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` of every rank (each the same shape), in rank order, on every rank (``[tensor]`` in one process)."""
    size = group_size()
    if size == 1:
        return [tensor]
    hvd = _horovod()
    if hvd is not None:  # (Horovod concatenates along the first dimension)
        return list(hvd.allgather(tensor.unsqueeze(0), name="dlscale.all_gather").unbind(0))
    gathered = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(gathered, tensor)
    return gathered


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank."""
    hvd = _horovod()
    if hvd is not None:
        # The name must match on every rank; Horovod's default is the type of obj, which differs off the root.
        return hvd.broadcast_object(obj, root_rank=src, name="dlscale.broadcast_object")
    if not _torch_group():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order, on every rank (``[obj]`` in one process)."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.allgather_object(obj, name="dlscale.all_gather_object")
    if not _torch_group():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
