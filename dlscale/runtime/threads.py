"""How many CPU threads a process gives torch, chosen from the CPUs it was given.

torch starts with one thread per core of the machine, whatever the process was given. On a
shared node, or with several ranks on one node, that oversubscribes the cores: on a busy
2-core machine one training process ran at 108 samples/s with 2 threads and 1,605 with 1.
So every training and K-Means process sets its thread count from what it was given, in
this order:

1. the config's ``threads``, when a run asks for a count (lesson 02 trains on one thread);
2. ``OMP_NUM_THREADS``, when the user (or torchrun, which sets 1) chose it;
3. ``SLURM_CPUS_PER_TASK``, the CPUs Slurm gave each task (capped by the affinity mask);
4. the process's affinity mask (``taskset``, srun's binding, a container's CPU set), less the CPUs that other
   processes keep busy when it starts (:func:`busy_cpus`): on a shared node — a hub's CPU node, a login node, a
   laptop with the lab, the kernel and engines on the same cores — a thread per masked core lands some threads on
   cores another process holds, and torch's threads then wait for each other at every operator's barrier.
   Measured on 2 vCPUs (Milan): beside one spinning process, 2 threads ran at 187-211 samples/s and 1 thread
   at 453, against 706-730 alone.

The choice is recorded in ``summary.json`` (``threads``), so a comparison can show that both
sides ran with the same CPUs per process. Where the kit chose from the mask, a single-process CPU run watches its
step time (:class:`ThreadWatch`): a neighbour that starts after the run does slows the steps, and the count is
chosen again; with fewer threads than CPUs it looks again now and then, for a neighbour that left.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a process uses and where it came from."""

    count: int
    source: str  # "config threads", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK" or "affinity mask" (and what was busy)
    cpus: int  # CPUs in the process's affinity mask
    busy: int = 0  # of those, the CPUs other processes kept busy when the choice was made

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


#: A CPU that other processes kept busier than this share of a sample is not free for a thread.
BUSY_SHARE = 0.5
#: How long :func:`busy_cpus` watches the CPUs (a process starts once: a tenth of a second is not felt).
SAMPLE_S = 0.1


def _cpu_times() -> dict[int, tuple[int, int]]:
    """{cpu: (busy jiffies, all jiffies)} from /proc/stat ({} where there is none)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    times = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]  # idle and iowait
            times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_cpus(cpus: list[int] | None = None, seconds: float = SAMPLE_S) -> int:
    """How many of ``cpus`` (this process's mask) other processes keep busy now: the non-idle time of those CPUs
    over ``seconds``, from /proc/stat, less this process's own (its OpenMP threads may still spin after the work
    before), in CPUs, rounded (a CPU busy more than :data:`BUSY_SHARE` of the time counts). 0 where the kernel does
    not say (not Linux)."""
    cpus = affinity_set() if cpus is None else cpus
    before, own, start = _cpu_times(), time.process_time(), time.monotonic()
    if not before:
        return 0
    time.sleep(seconds)
    after, own, seconds = _cpu_times(), time.process_time() - own, max(time.monotonic() - start, 1e-3)
    used = []
    for cpu in cpus:
        if cpu in before and cpu in after:
            busy, total = (a - b for a, b in zip(after[cpu], before[cpu]))
            used.append(busy / total if total > 0 else 0.0)
    if not used:
        return 0
    others = sum(used) - own / seconds  # (in CPUs: each CPU's busy share, less this process's CPU time)
    return max(0, min(len(used), int(others + (1 - BUSY_SHARE))))


def choose_threads(
    environ: dict[str, str] | None = None, cpus: int | None = None, requested: int = 0, busy: int | None = None
) -> ThreadChoice:
    """The thread count for a process with this environment and ``cpus`` CPUs in its mask; a ``requested``
    count (the config's ``threads``) wins over everything. ``busy``: how many of them other processes keep busy
    (measured by :func:`busy_cpus` when the mask is this process's own); a thread each for the others, at least one."""
    environ = os.environ if environ is None else environ
    own_mask = cpus is None
    cpus = affinity_cpus() if cpus is None else cpus
    if requested > 0:
        return ThreadChoice(requested, "config threads", cpus)
    explicit = _positive_int(environ.get("OMP_NUM_THREADS"))
    if explicit:
        return ThreadChoice(explicit, "OMP_NUM_THREADS", cpus)
    per_task = _positive_int(environ.get("SLURM_CPUS_PER_TASK"))
    if per_task:
        return ThreadChoice(min(per_task, cpus), "SLURM_CPUS_PER_TASK", cpus)
    if busy is None:
        busy = _remember_busy(busy_cpus()) if own_mask and cpus > 1 else 0
    busy = min(busy, cpus - 1)
    if busy:
        return ThreadChoice(cpus - busy, f"affinity mask, {busy} of its {cpus} CPUs busy with other work", cpus, busy)
    return ThreadChoice(cpus, "affinity mask", cpus)


#: How long a count of busy CPUs stands for :func:`threads_now`: work started within it takes the same count, so that
#: a process pays the count's tenth of a second at most this often.
RECOUNT_S = 30.0
_last_busy: tuple[float, int] | None = None  # (time.monotonic() of the count, busy CPUs)


def _remember_busy(busy: int) -> int:
    global _last_busy
    _last_busy = (time.monotonic(), busy)
    return busy


def threads_now(environ: dict[str, str] | None = None) -> ThreadChoice:
    """The threads for work that starts now in this process (a K-Means fit), chosen as :func:`choose_threads` chooses
    a process's, never more than torch's own count (a user's ``torch.set_num_threads`` stands). The busy CPUs are
    counted again only when the last count is older than :data:`RECOUNT_S`: a fit of a tenth of a second does not pay
    a tenth of a second each time, and a neighbour that came or went since is seen at the next count."""
    ceiling = torch.get_num_threads()
    if ceiling == 1:  # (nothing to count: one thread is the least)
        return ThreadChoice(1, "torch's own count", affinity_cpus())
    last = _last_busy
    fresh = last is not None and time.monotonic() - last[0] < RECOUNT_S
    choice = choose_threads(environ, busy=last[1] if fresh else None)
    if choice.count > ceiling:
        return ThreadChoice(ceiling, f"{choice.source}; torch's own count is lower", choice.cpus, choice.busy)
    return choice


def apply_threads(environ: dict[str, str] | None = None, requested: int = 0) -> ThreadChoice:
    """Set torch's intra-op thread count by :func:`choose_threads` and return the choice."""
    choice = choose_threads(environ, requested=requested)
    if torch.get_num_threads() != choice.count:
        torch.set_num_threads(choice.count)
    return choice


@contextlib.contextmanager
def pinned_threads(count: int) -> Iterator[None]:
    """torch's threads and ``OMP_NUM_THREADS`` set to ``count`` meanwhile, both put back after: what the two sides of a
    comparison in one process run with, so neither counts the busy CPUs for itself (the plain recipe's
    ``use_free_cpus`` and the engine's :func:`choose_threads` keep what ``OMP_NUM_THREADS`` says)."""
    kept, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(count)
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        torch.set_num_threads(kept)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp


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


#: Steps whose median step time the watch compares.
WATCH_WINDOW = 20
#: A window this many times slower than the first after a choice looks at the CPUs again.
WATCH_JUMP = 1.4
#: With fewer threads than CPUs, the watch looks again every this many windows (a neighbour that has gone).
WATCH_RECHECK = 10


class ThreadWatch:
    """Chooses torch's threads again when a run's step slows, or now and then while it runs on fewer than its CPUs.

    It watches only a count the kit chose from the affinity mask (a count the user, torchrun or Slurm set is kept),
    in one training process without loader workers (its own workers and ranks would count as neighbours). Each
    look costs :data:`SAMPLE_S` of sleep (:func:`busy_cpus`), at most once per window of :data:`WATCH_WINDOW` steps.
    """

    def __init__(
        self,
        choice: ThreadChoice,
        active: bool = True,
        busy: Callable[[], int] = busy_cpus,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        window: int = WATCH_WINDOW,
        jump: float = WATCH_JUMP,
        recheck: int = WATCH_RECHECK,
    ):
        self.active = active and choice.source.startswith("affinity mask") and choice.cpus > 1
        self.cpus, self.count = choice.cpus, choice.count
        self._busy, self._set, self.window, self.jump, self.recheck = busy, set_threads, window, jump, recheck
        self._times: list[float] = []
        self._baseline: float | None = None
        self._windows = 0
        #: (step, threads before, threads after, CPUs busy with other work) for every change
        self.changes: list[tuple[int, int, int, int]] = []

    def observe(self, step: int, seconds: float) -> tuple[int, int, int, int] | None:
        """One step's time; returns the change it made, if it made one."""
        if not self.active:
            return None
        self._times.append(seconds)
        if len(self._times) < self.window:
            return None
        median = statistics.median(self._times)
        self._times.clear()
        self._windows += 1
        if self._baseline is None:
            self._baseline = median
            return None
        slowed = median > self.jump * self._baseline
        if not slowed and not (self.count < self.cpus and self._windows % self.recheck == 0):
            return None
        busy = min(self._busy(), self.cpus - 1)
        count = self.cpus - busy
        if count == self.count:
            if slowed:
                self._baseline = median  # (slower for another reason: this is the pace to compare with now)
            return None
        change = (step, self.count, count, busy)
        self.count, self._baseline = count, None  # (the new count's first window is its own baseline)
        self._set(count)
        self.changes.append(change)
        return change
