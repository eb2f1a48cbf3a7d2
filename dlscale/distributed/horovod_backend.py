"""Horovod behind the same calls as DDP: joining the job, the optimizer, the first broadcast.

With DDP the *model* is wrapped and gradients are all-reduced in buckets during the
backward pass. Horovod wraps the *optimizer* instead: ``hvd.DistributedOptimizer`` starts
an all-reduce for each gradient as soon as it is ready, and waits for them all in
``synchronize()`` just before the update. Everything else (rank-0 files, reduced metrics,
broadcast history) goes through :mod:`dlscale.distributed.process_group`, which routes its collectives
here when Horovod is up, and the training step asks a
:class:`dlscale.distributed.grad_sync.HorovodSync`, so the loop has one code path for both.

Horovod is an optional extra: ``scripts/build_horovod.sh`` builds it (see its header for why a build is needed)
with gloo for CPU tensors, and with NCCL's operations for GPU tensors where torch is a CUDA build and the CUDA
toolkit's ``nvcc`` is found (``HOROVOD_GPU=nccl`` or ``cpu`` chooses); without them a GPU tensor's first all-reduce
fails, which :func:`init` refuses ahead. On NERSC, OLCF and most sites Horovod comes from the site's container or
module, and DDP is the recommended path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
from torch import nn

from dlscale.config.train_config import FIELDS
from dlscale.errors import DlscaleError, import_optional, importable

#: What to do when Horovod cannot be imported.
INSTALL_HINT = (
    "build it for this environment with `make horovod` (scripts/build_horovod.sh: Horovod 0.28.1 with "
    "gloo, a few minutes), or on a cluster load the site's Horovod module or container"
)

#: Attributes the layer-wise optimizers keep on the instance rather than in their groups;
#: ``hvd.DistributedOptimizer`` rebuilds the optimizer from its groups, so these are copied over.
_INSTANCE_SETTINGS = ("exclude_1d", "max_grad_norm", "defaults")


class HorovodError(DlscaleError):
    """Horovod is missing, or cannot start the way this job was launched."""


def load() -> ModuleType:
    """``horovod.torch``, or a :class:`HorovodError` that says how to get it."""
    return import_optional("horovod.torch", "horovod", "data_parallel=horovod", HorovodError, INSTALL_HINT)


def available() -> bool:
    """Whether Horovod can be imported (for optional tests and benchmarks)."""
    return importable("horovod.torch")


def init(launcher: str, timeout_s: float, on_gpu: bool = False) -> ModuleType:
    """``hvd.init()`` with a gloo timeout, so that a rank that never arrives ends the job with an error.

    ``on_gpu``: the ranks will all-reduce GPU tensors, which needs a Horovod built with NCCL.
    """
    hvd = load()
    if on_gpu and not hvd.nccl_built():
        raise HorovodError(
            "this Horovod was built without NCCL (scripts/build_horovod.sh builds NCCL's operations only where "
            "torch is a CUDA build and nvcc is found), so "
            "its first all-reduce of GPU tensors would fail ('Requested ReadyEvent with GPU device but "
            "not compiled with CUDA'). Use the site's Horovod (built with HOROVOD_GPU_OPERATIONS=NCCL), "
            "data_parallel=ddp, or device=cpu"
        )
    if launcher in ("mpi", "slurm") and not hvd.mpi_built():
        raise HorovodError(
            f"this job was started by {launcher}, but this Horovod was built without MPI "
            f"(the gloo build of scripts/build_horovod.sh); launch it with `horovodrun --gloo -np N`, "
            f"or use a site Horovod built with MPI"
        )
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, int(timeout_s))))
    if not hvd.is_initialized():
        try:
            hvd.init()
        except Exception as err:  # noqa: BLE001 - any start-up failure gets the same explanation
            raise HorovodError(
                f"hvd.init() failed ({type(err).__name__}: {err}); check that every rank was "
                f"started by the same horovodrun/mpirun/srun"
            ) from None
    return hvd


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    fp16_compression: bool = False,
    backward_passes_per_step: int = 1,
) -> torch.optim.Optimizer:
    """``optimizer`` behind ``hvd.DistributedOptimizer``, whose ``synchronize()`` waits for the all-reduce.

    ``hvd.DistributedOptimizer`` rebuilds the optimizer from its groups; settings the
    layer-wise optimizers keep on the instance are copied over.
    """
    hvd = load()
    compression = hvd.Compression.fp16 if fp16_compression else hvd.Compression.none
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=backward_passes_per_step,
        op=hvd.Average,
    )
    for name in _INSTANCE_SETTINGS:
        if name in vars(optimizer):
            setattr(wrapped, name, getattr(optimizer, name))
    return wrapped


def broadcast_initial_state(model: nn.Module, optimizer: torch.optim.Optimizer, resumed: bool) -> None:
    """Rank 0's parameters (and, after a resume, optimizer state) on every rank.

    The optimizer state is sent only when there is some: for an empty state Horovod takes
    a dummy step with zero gradients, which weight decay turns into a real change of the
    parameters, and the run would no longer match one process.
    """
    hvd = load()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if resumed:
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)


@contextlib.contextmanager
def _environment(**defaults: str) -> Iterator[None]:
    """``os.environ`` with ``defaults`` for the names not set, as it was afterwards."""
    added = [name for name in defaults if name not in os.environ]
    os.environ.update({name: defaults[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _as_rank(function: Callable, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Run on a Horovod rank: the function's result, or its error as text (so the caller can name the rank)."""
    try:
        return "ok", function(*args, **kwargs)
    except BaseException as err:  # noqa: BLE001 - reported to the notebook instead of a bare exit status
        return "error", (type(err).__name__, str(err))


# Seconds a rank's gloo operation waits for its peers under `run`: the engine's (dist_timeout_s's default), not
# Horovod's own 30 s, which ended lesson 06's stage once in CI with both ranks' background threads waiting in a recv
# (cause not found: a rank busy in Python past the timeout does not trip it; Horovod's threads keep exchanging
# meanwhile). A rank that dies is still noticed at once: horovod.run stops the rest.
COLLECTIVE_TIMEOUT_S = int(FIELDS["dist_timeout_s"].default)


def run(function: Callable, n: int = 2, *args: Any, hosts: str | None = None, **kwargs: Any) -> list[Any]:
    """Call ``function(*args, **kwargs)`` on ``n`` Horovod ranks (gloo) and return the results in rank order.

    This is ``horovod.run``, the notebook's ``horovodrun``: by default ``n`` local processes
    (``hosts`` such as ``"nid001:4,nid002:4"`` spreads them over nodes reachable by ssh).
    A rank that raises makes the call raise too, with the rank's error; a
    ``NotImplementedError`` (an exercise not yet filled in) is raised as itself.
    The ranks' gloo timeout is ``COLLECTIVE_TIMEOUT_S`` unless ``HOROVOD_GLOO_TIMEOUT_SECONDS`` is set.
    """
    load()
    import horovod

    with _environment(HOROVOD_GLOO_TIMEOUT_SECONDS=str(COLLECTIVE_TIMEOUT_S)):  # horovod.run copies os.environ
        outcomes = horovod.run(
            _as_rank, args=(function, args, kwargs), num_proc=n, hosts=hosts or f"localhost:{n}", use_gloo=True
        )
    failures = [(rank, value) for rank, (status, value) in enumerate(outcomes) if status == "error"]
    for rank, (name, message) in failures:
        if name == "NotImplementedError":
            raise NotImplementedError(message)
    if failures:
        raise HorovodError("; ".join(f"rank {rank}: {name}: {message}" for rank, (name, message) in failures))
    return [value for _, value in outcomes]
