"""How this process was launched: its rank, the job's size and the master, from the launcher's variables.

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

Nothing here starts a process group: :mod:`dlscale.distributed.process_group` does.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from dlscale.errors import DlscaleError, import_optional

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


class DistributedError(DlscaleError):
    """The job's processes could not form or keep a process group; the message says why."""


class PeerFailedError(DistributedError):
    """A collective failed on this rank because another rank died or was killed: the command leaves at once
    (:func:`dlscale.cli.main`), without finalizing the interpreter beside gloo's worker threads."""


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
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}) via "
            f"{self.launcher}, {self.backend} on {self.device}, master {self.master_addr}:{self.master_port}"
        )


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if environ.get(name, "") != "":
            value = environ[name].strip()
            if not value.isdigit() or (name.endswith("PORT") and not 0 < int(value) < 65536):
                raise DistributedError(
                    f"the environment variable {name}={environ[name]!r} must be a whole number"
                    f"{' from 1 to 65535 (a TCP port)' if name.endswith('PORT') else ' >= 0'}; "
                    f"set it so, or unset it"
                )
            return int(value)
    if default is None:
        raise DistributedError(f"none of {', '.join(names)} is set")
    return default


def _tasks_on_first_node(value: str) -> int:
    """``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` such as ``4`` or ``4(x2),2``."""
    return int(re.match(r"\d+", value).group()) if value else 1


def _mpi_master(environ: Mapping[str, str]) -> str:
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    MPI = import_optional(
        "mpi4py.MPI",
        "mpi",
        "under mpirun without MASTER_ADDR, broadcasting rank 0's address",
        DistributedError,
        "or set MASTER_ADDR to the first host of the job",
    )
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
        return DistEnv(
            _int(environ, "SLURM_PROCID"),
            _int(environ, "SLURM_LOCALID", default=0),
            world,
            per_node,
            "slurm",
            master,
            port,
        )
    if launcher == "horovodrun":
        return DistEnv(
            _int(environ, "HOROVOD_RANK"),
            _int(environ, "HOROVOD_LOCAL_RANK", default=0),
            _int(environ, "HOROVOD_SIZE"),
            _int(environ, "HOROVOD_LOCAL_SIZE", default=1),
            "horovodrun",
            environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"),
            port,
        )
    if launcher == "mpi":
        rank = _int(environ, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
        world = _int(environ, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_WORLD_SIZE")
        local = _int(
            environ, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", default=0
        )
        # (Polaris's PALS says how many ranks share the node: without it, 8 ranks on 2 nodes would seem to share 4 GPUs)
        local_size = _int(
            environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE", default=world
        )
        master = _mpi_master(environ) if world > 1 else "127.0.0.1"
        return DistEnv(rank, local, world, local_size, "mpi", master, port)
    # torchrun, and helpers that set torchrun's variables (DLSCALE_LAUNCHER names them)
    world = _int(environ, "WORLD_SIZE", default=1)
    return DistEnv(
        _int(environ, "RANK", default=0),
        _int(environ, "LOCAL_RANK", default=0),
        world,
        _int(environ, "LOCAL_WORLD_SIZE", default=world),
        launcher,
        environ.get("MASTER_ADDR", "127.0.0.1"),
        port,
    )
