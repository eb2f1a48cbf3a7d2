"""Where am I? The hardware, versions, site and launcher that lesson 00 and ``dlscale info`` show."""

from __future__ import annotations

import importlib.util
import os
import platform
import socket
import sys
from typing import Any

import torch

from dlscale import __version__
from dlscale.distributed import detect_launcher
from dlscale.runtime.threads import affinity_set

#: Optional packages and the extra that installs each.
OPTIONAL = {"nvtx": "profiling", "wandb": "tracking", "horovod": "horovod", "daal4py": "kmeans",
            "mpi4py": "mpi", "sklearn": "kmeans", "ipyparallel": "notebooks", "jupyterlab": "notebooks"}


def detect_site(environ: dict[str, str] | None = None, hostname: str | None = None) -> str:
    """A best guess at the computing site, from variables the sites set in every login."""
    environ = dict(os.environ) if environ is None else environ
    hostname = socket.gethostname() if hostname is None else hostname
    if environ.get("NERSC_HOST"):
        return f"NERSC {environ['NERSC_HOST'].capitalize()}"
    system = environ.get("LMOD_SYSTEM_NAME", "") or hostname
    for name in ("frontier", "summit", "andes", "crusher"):
        if name in system.lower():
            return f"OLCF {name.capitalize()}"
    if environ.get("SLURM_CLUSTER_NAME"):
        return f"Slurm cluster {environ['SLURM_CLUSTER_NAME']}"
    return "a workstation or laptop"


def describe() -> dict[str, Any]:
    """Facts about this process's environment, as a flat mapping."""
    info: dict[str, Any] = {
        "dlscale": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "site": detect_site(),
        "platform": platform.platform(),
        "cpu cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "launcher": detect_launcher(),
        "slurm job": os.environ.get("SLURM_JOB_ID", "none"),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info[f"gpu {index}"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute {props.major}.{props.minor}"
        from dlscale.runtime.precision import supports_bf16
        info["bf16 supported"] = supports_bf16(torch.device("cuda"))
    for module, extra in OPTIONAL.items():
        info[f"optional {module}"] = "installed" if importlib.util.find_spec(module) else f"missing (extra: {extra})"
    return info


def task_line(environ: dict[str, str] | None = None) -> str:
    """One line saying what this task was given: rank, host, CPUs and the settings that bind them.

    ``slurm/launch.sh SITE probe`` runs it in every task of a job, to check a site's binding.
    """
    environ = dict(os.environ) if environ is None else environ
    cpus = affinity_set()
    settings = " ".join(f"{name}={environ.get(name, '-')}" for name in
                        ("SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"))
    rank, size = environ.get("SLURM_PROCID", environ.get("RANK", "0")), environ.get("SLURM_NTASKS", "1")
    return (f"task {rank}/{size} on {socket.gethostname()}: {len(cpus)} cpu(s) "
            f"[{','.join(map(str, cpus))}], torch threads {torch.get_num_threads()}, {settings}")


def report() -> str:
    """:func:`describe` as aligned text."""
    info = describe()
    width = max(map(len, info))
    return "\n".join(f"{key:<{width}}  {value}" for key, value in info.items())
