"""How many CPU threads a process gives torch, chosen from the CPUs it was given.

torch starts with one thread per core of the machine, whatever the process was given. On a
shared node, or with several ranks on one node, that oversubscribes the cores: on a busy
2-core machine one training process ran at 108 samples/s with 2 threads and 1,605 with 1.
So every training and K-Means process sets its thread count from what it was given, in
this order:

1. the config's ``threads``, when a run asks for a count (lesson 02 trains on one thread);
2. ``OMP_NUM_THREADS``, when the user (or torchrun, which sets 1) chose it;
3. ``SLURM_CPUS_PER_TASK``, the CPUs Slurm gave each task (capped by the affinity mask);
4. the process's affinity mask (``taskset``, srun's binding, a container's CPU set).

The choice is recorded in ``summary.json`` (``threads``), so a comparison can show that both
sides ran with the same CPUs per process.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a process uses and where it came from."""

    count: int
    source: str  # "config threads", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK" or "affinity mask"
    cpus: int  # CPUs in the process's affinity mask

    def to_dict(self) -> dict:
        return asdict(self)


def affinity_set() -> list[int]:
    """The CPUs this process may run on, by number (its affinity mask; all cores where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> list[int]:
    """CPUs of a kernel CPU list such as ``0-15,64-79`` (sysfs ``cpulist``, Slurm's masks in list form)."""
    cpus = []
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def affinity_cpus() -> int:
    """How many CPUs this process may run on."""
    return len(affinity_set())


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value else 0
    except ValueError:
        return None
    return number if number > 0 else None


def choose_threads(environ: dict[str, str] | None = None, cpus: int | None = None, requested: int = 0) -> ThreadChoice:
    """The thread count for a process with this environment and ``cpus`` CPUs in its mask; a ``requested``
    count (the config's ``threads``) wins over everything."""
    environ = os.environ if environ is None else environ
    cpus = affinity_cpus() if cpus is None else cpus
    if requested > 0:
        return ThreadChoice(requested, "config threads", cpus)
    explicit = _positive_int(environ.get("OMP_NUM_THREADS"))
    if explicit:
        return ThreadChoice(explicit, "OMP_NUM_THREADS", cpus)
    per_task = _positive_int(environ.get("SLURM_CPUS_PER_TASK"))
    if per_task:
        return ThreadChoice(min(per_task, cpus), "SLURM_CPUS_PER_TASK", cpus)
    return ThreadChoice(cpus, "affinity mask", cpus)


def apply_threads(environ: dict[str, str] | None = None, requested: int = 0) -> ThreadChoice:
    """Set torch's intra-op thread count by :func:`choose_threads` and return the choice."""
    choice = choose_threads(environ, requested=requested)
    if torch.get_num_threads() != choice.count:
        torch.set_num_threads(choice.count)
    return choice


def per_process_env(threads: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process that gives it exactly ``threads`` threads.

    Used by every side of a comparison (1 process against N ranks), so that an efficiency
    above 100% cannot come from the single process having had fewer or more threads.
    """
    return {**(os.environ if environ is None else environ), "OMP_NUM_THREADS": str(threads)}


def fair_threads(max_processes: int, cpus: int | None = None) -> int:
    """Threads per process so that the largest run of a comparison fits on the CPUs without oversubscribing."""
    cpus = affinity_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, max_processes))
