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

#: What each of the lessons' extras gives them, by import name, or a command they run (``mpirun``), with the machines
#: it installs on (pyproject.toml's markers: Intel's packages on x86-64 Linux only, no NVTX on macOS).
#: ``dlscale info --require EXTRAS`` imports each: the image's build stops there when a lesson's engine is missing.
LESSON_ENGINES: dict[str, tuple[str, ...]] = {
    "notebooks": ("jupyterlab", "ipykernel", "ipywidgets", "ipyparallel", "nbclient", "papermill"),
    "kmeans": ("sklearn", "numba", "scipy", "threadpoolctl", "daal4py", "mpi4py", "mpirun"),
    "mpi": ("mpi4py", "mpirun"),
    "hpo": ("optuna",),
    "tracking": ("wandb",),
    "profiling": ("nvtx",),
    "slides": ("sphinx_revealjs", "latex2mathml"),
}
#: Engines installed only on some machines, and the test of this one
_ONLY_ON = {
    "daal4py": lambda: platform.machine() in ("x86_64", "AMD64"),
    "mpirun": lambda: platform.machine() in ("x86_64", "AMD64"),
    "nvtx": lambda: sys.platform != "darwin",
}


def missing_engines(extras: str | list[str]) -> tuple[list[str], list[str]]:
    """(present, missing) of the engines the named extras (``"notebooks,kmeans"``) give the lessons on this machine:
    each module imported (a library it cannot load counts as missing), ``mpirun`` beside the interpreter. A missing
    one reads ``"daal4py (kmeans: ImportError: ...)"``."""
    import importlib
    import importlib.metadata

    names = [extra.strip() for extra in (extras.split(",") if isinstance(extras, str) else extras) if extra.strip()]
    if "all" in names:  # (pyproject's `all`: every extra)
        names = [*names, *LESSON_ENGINES]
    try:  # (the kit's other extras, dev and bench, give the lessons no engine)
        provided = set(importlib.metadata.metadata("dlscale").get_all("Provides-Extra") or [])
    except importlib.metadata.PackageNotFoundError:  # (the kit on PYTHONPATH, not installed)
        provided = set()
    unknown = [extra for extra in names if extra not in LESSON_ENGINES and extra not in provided | {"all"}]
    if unknown:
        raise ValueError(f"no extra named {', '.join(unknown)} (the lessons' extras: {', '.join(LESSON_ENGINES)})")
    names = [extra for extra in dict.fromkeys(names) if extra in LESSON_ENGINES]
    present: list[str] = []
    missing: list[str] = []
    for extra in names:
        for engine in LESSON_ENGINES[extra]:
            if engine in present or any(m.startswith(f"{engine} ") for m in missing):
                continue
            if not _ONLY_ON.get(engine, lambda: True)():
                continue
            if engine == "mpirun":  # (where lesson 08 starts it: Intel MPI's wheel puts it beside the interpreter)
                beside = Path(sys.executable).with_name("mpirun")
                found, why = beside.exists(), f"not beside the interpreter ({beside})"
            else:
                try:
                    importlib.import_module(engine)
                    found, why = True, ""
                except Exception as err:  # (an ImportError, or a library the module cannot load)
                    found, why = False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            if found:
                present.append(engine)
            else:
                missing.append(f"{engine} ({extra}: {why})")
    return present, missing


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
