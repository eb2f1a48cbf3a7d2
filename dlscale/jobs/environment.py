"""Where am I? The hardware, versions, site and launcher that lesson 00 and ``dlscale info`` show."""

from __future__ import annotations

import importlib.util
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from dlscale import __version__
from dlscale.distributed import detect_launcher
from dlscale.runtime.devices import GPU_ORDER_VARIABLE, gpu_index
from dlscale.runtime.threads import affinity_set, parse_cpu_list

#: Optional packages and the extra that installs each (or the command, for Horovod).
OPTIONAL = {
    "nvtx": "profiling",
    "wandb": "tracking",
    "horovod": "make horovod",
    "daal4py": "kmeans",
    "mpi4py": "mpi",
    "sklearn": "kmeans",
    "ipyparallel": "notebooks",
    "jupyterlab": "notebooks",
}


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
            info[f"gpu {index}"] = (
                f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute {props.major}.{props.minor}"
            )
        from dlscale.runtime.precision import supports_bf16

        info["bf16 supported"] = supports_bf16(torch.device("cuda"))
    for module, extra in OPTIONAL.items():
        how = extra if " " in extra else f"extra: {extra}"  # (Horovod has no extra: its build script)
        info[f"optional {module}"] = "installed" if importlib.util.find_spec(module) else f"missing ({how})"
    return info


def task_line(environ: dict[str, str] | None = None, sysfs: Path = Path("/sys")) -> str:
    """One line saying what this task was given: rank, host, CPUs, the settings that bind them, and its GPU.

    ``slurm/launch.sh SITE probe`` runs it in every task of a job, to check a site's binding: the
    GPU is the one training would choose (``DLSCALE_GPU_ORDER`` applied), with its NUMA node beside
    the NUMA nodes of the task's cores, and a warning when they differ.
    """
    environ = dict(os.environ) if environ is None else environ
    cpus = affinity_set()
    settings = " ".join(
        f"{name}={environ.get(name, '-')}"
        for name in (
            "SLURM_CPUS_PER_TASK",
            "SRUN_CPUS_PER_TASK",
            "OMP_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES",
            GPU_ORDER_VARIABLE,
        )
    )
    rank, size = environ.get("SLURM_PROCID", environ.get("RANK", "0")), environ.get("SLURM_NTASKS", "1")
    return (
        f"task {rank}/{size} on {socket.gethostname()}: {len(cpus)} cpu(s) "
        f"[{','.join(map(str, cpus))}], torch threads {torch.get_num_threads()}, {settings}; "
        f"{_gpu_binding(environ, cpus, sysfs)}"
    )


def _gpu_binding(environ: dict[str, str], cpus: list[int], sysfs: Path) -> str:
    """The GPU this task trains on and whether it sits on the NUMA node of the task's cores."""
    cpu_nodes = sorted({node for node, members in _numa_cpus(sysfs).items() if members & set(cpus)})
    where = f"cores on NUMA node(s) {','.join(map(str, cpu_nodes)) or '?'}"
    if not torch.cuda.is_available():
        return f"no GPU, {where}"
    local_rank = int(environ.get("SLURM_LOCALID", environ.get("LOCAL_RANK", "0")))
    index = gpu_index(local_rank, torch.cuda.device_count(), environ.get(GPU_ORDER_VARIABLE))
    props = torch.cuda.get_device_properties(index)
    bus = (
        f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:"
        f"{getattr(props, 'pci_device_id', 0):02x}.0"
    )
    gpu_node = _read_int(sysfs / "bus/pci/devices" / bus / "numa_node")
    line = f"gpu {index} ({bus}) on NUMA node {'?' if gpu_node is None else gpu_node}, {where}"
    if gpu_node is not None and gpu_node >= 0 and cpu_nodes and gpu_node not in cpu_nodes:
        line += (
            f" -- MISMATCH: local rank {local_rank}'s GPU is on another NUMA node than its cores; set "
            f"{GPU_ORDER_VARIABLE} (slurm/sites/*.env) so that each local rank gets the GPU beside its cores"
        )
    return line


def _numa_cpus(sysfs: Path) -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from ``/sys/devices/system/node`` (empty where the kernel shows none)."""
    nodes = {}
    for folder in sorted((sysfs / "devices/system/node").glob("node[0-9]*")):
        try:
            nodes[int(folder.name[4:])] = set(parse_cpu_list((folder / "cpulist").read_text()))
        except (OSError, ValueError):
            continue
    return nodes


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def environment_report() -> str:
    """:func:`describe` as aligned text."""
    info = describe()
    width = max(map(len, info))
    return "\n".join(f"{key:<{width}}  {value}" for key, value in info.items())
