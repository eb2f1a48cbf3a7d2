"""The plumbing every stage of the recipe shares, in plain PyTorch: the device, the logged losses and
samples/s, checkpoint files, named ranges and a profiling window, and the command line.

Copy it beside the stage you take into your own project (the stages import it from their folder).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from typing import Callable, Literal, get_args, get_origin

import torch
import torch.distributed as dist


def from_launcher(*names: str, default: int = 0) -> int:
    """The first of the environment variables `names` that is set, as a number: what the launcher told this
    process (its rank, the number of ranks, its rank on the node), else `default`."""
    return int(next((os.environ[name] for name in names if name in os.environ), default))


def use_free_cpus() -> int:
    """One torch thread per CPU of this process that no other process keeps busy now, and at least one.

    torch takes a thread per core; on a shared node (a hub's CPU node, a laptop running Jupyter beside the
    training) the threads on cores another process holds make the rest wait at every operator: on 2 cores beside
    one busy process, 2 threads ran 3.5x slower than alone, 1 thread 1.6x. OMP_NUM_THREADS, if set, wins
    (torchrun sets it to 1)."""
    if os.environ.get("OMP_NUM_THREADS") or not os.path.exists("/proc/stat"):
        return torch.get_num_threads()

    def busy_and_all():  # jiffies per CPU: (not idle, all), from the kernel's counters
        rows = [line.split() for line in open("/proc/stat") if line[:3] == "cpu" and line[3].isdigit()]
        return {int(r[0][3:]): (sum(map(int, r[1:8])) - int(r[4]) - int(r[5]), sum(map(int, r[1:8]))) for r in rows}

    mine, before, own, start = os.sched_getaffinity(0), busy_and_all(), time.process_time(), time.monotonic()
    time.sleep(0.1)  # (this process sleeps; its own threads may still spin after earlier work: taken off below)
    after, own, took = busy_and_all(), time.process_time() - own, time.monotonic() - start
    shares = [(after[c][0] - before[c][0]) / max(1, after[c][1] - before[c][1]) for c in mine if c in after]
    busy = int(sum(shares) - own / took + 0.5)  # CPUs other processes keep busy, rounded
    torch.set_num_threads(max(1, len(mine) - max(0, busy)))
    return torch.get_num_threads()


def pick_device(device: str, local_rank: int = 0) -> torch.device:
    """This process's device. "auto": a GPU of its own where there is one, else the CPU. A GPU asked for and
    missing is an error, not a CPU run. A process that sees one GPU (srun --gpus-per-task=1, --gpu-bind=closest)
    takes it; one that sees several, the local_rank-th. NCCL refuses two ranks on one GPU: where the launcher
    (torchrun, horovodrun, the lessons' engines) starts more ranks on this node than it has GPUs, "auto" trains on the CPU
    and says so, and "cuda" stops. On a CPU, torch's threads are the CPUs other work leaves free (use_free_cpus)."""
    visible = torch.cuda.device_count()
    # ranks on this node, as torchrun (and the lessons' engines) or horovodrun say; srun binds a GPU per task
    on_node = from_launcher("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE", default=1)
    shared = 0 < visible < on_node
    if device == "auto":
        if shared and local_rank == 0:
            print(f"{on_node} ranks on this node and {visible} GPU(s): the ranks train on the CPU (gloo)")
        device = "cuda" if visible and not shared else "cpu"
    if not device.startswith("cuda"):
        use_free_cpus()
        return torch.device(device)
    if visible == 0 or shared or (visible > 1 and local_rank >= visible):
        raise SystemExit(f"--device {device}: local rank {local_rank} of {on_node} on this node, and it shows "
                         f"{visible} GPUs to this torch (CUDA {torch.version.cuda}; NCCL puts one rank on a GPU): "
                         f"use a GPU node, fewer ranks per node, or --device auto or cpu")
    index = 0 if visible == 1 else local_rank
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class Progress:
    """Every step's loss, read from the device once per block of `every` steps (not once per step), and each
    block's samples/s: its clock stops when the block's losses have arrived, so its work is done. With several
    ranks the block is averaged over them in one all-reduce (torch.distributed's, or `average`'s: Horovod's)."""

    def __init__(self, every: int, samples_per_step: int, average: Callable | None = None):
        self.every, self.samples_per_step, self.losses, self.throughput = every, samples_per_step, [], []
        self.average = average or (_all_reduce_mean if dist.is_available() and dist.is_initialized() else None)
        self.speak = (dist.get_rank() == 0) if self.average is _all_reduce_mean else True
        self.begin()

    def begin(self) -> None:  # at each epoch: validation and checkpoints are not training time
        self.pending, self.start = [], time.perf_counter()

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Keep a step's loss; without one (an epoch's end), read the block so far."""
        self.pending += [] if loss is None else [loss.detach()]
        if self.pending and (loss is None or len(self.pending) == self.every):
            block = torch.stack(self.pending)
            self.losses += (self.average(block) if self.average else block).tolist()
            self.throughput.append(len(self.pending) * self.samples_per_step / (time.perf_counter() - self.start))
            if self.speak:
                print(f"step {len(self.losses)}: loss {self.losses[-1]:.4f}, {self.throughput[-1]:.1f} samples/s")
            self.begin()


def _all_reduce_mean(block: torch.Tensor) -> torch.Tensor:
    """The mean over the ranks: each rank's loss is its share's, their mean the global batch's."""
    dist.all_reduce(block)
    return block / dist.get_world_size()


def save_checkpoint(state: dict, path: str) -> None:
    """A temporary file renamed over the old one: a crash mid-write leaves the previous checkpoint whole."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path: str, run: dict, device: torch.device) -> dict | None:
    """The checkpoint to resume from (None if there is none); one written with other settings is refused."""
    state = torch.load(path, map_location=device) if os.path.exists(path) else None
    if state and state["run"] != run:
        raise SystemExit(f"{path} is another run's ({state['run']}): resume with its settings, or move it away")
    return state


@contextlib.contextmanager
def marked(name: str):
    """A named range: a row of torch.profiler's table and, on a GPU, an NVTX range on Nsight Systems' timeline."""
    with torch.profiler.record_function(name), (torch.cuda.nvtx.range(name) if torch.cuda.is_available()
                                                 else contextlib.nullcontext()):
        yield


class ProfilingWindow:
    """Steps [first, last) of `steps` ("10,15"; "" for none) recorded by torch.profiler (its table printed, a trace
    for Perfetto written) and, on a GPU, by Nsight Systems run with --capture-range=cudaProfilerApi."""

    def __init__(self, steps: str, trace: str = "trace.json"):
        self.first, self.last = (int(s) for s in steps.split(",")) if steps else (0, 0)
        # Under Nsight Systems (it sets NSYS_PROFILING_SESSION_ID) torch.profiler traces the CPU only: a second CUDA
        # tracer in one process fails with CUPTI's "multiple subscribers" error, and nsys records the GPU anyway.
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and not os.environ.get("NSYS_PROFILING_SESSION_ID"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.trace, self.done = trace, 0
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)

    def step(self) -> None:
        """After each training step: start or end the recording at the window's edges."""
        self.done, gpu = self.done + 1, torch.cuda.is_available()
        if self.done in (self.first, self.last) and gpu:
            torch.cuda.synchronize()  # (the kernels queued so far run inside the capture, not after its end)
            (torch.cuda.profiler.start if self.done == self.first else torch.cuda.profiler.stop)()
        if self.done == self.first:
            self.profiler.start()
        elif self.done == self.last:
            self.profiler.stop()
            self.profiler.export_chrome_trace(self.trace)
            print(self.profiler.key_averages().table(sort_by="cpu_time_total", row_limit=20))


def parse_args(main: Callable) -> dict:
    """The command line of a stage: --name value for each argument of its main (--resume, --no-resume for a
    switch, the values of a Literal for one annotated so)."""
    summary = (getattr(sys.modules.get(main.__module__), "__doc__", None) or "\n").splitlines()[0]
    parser = argparse.ArgumentParser(description=summary)
    for name, argument in inspect.signature(main).parameters.items():
        flag, default = "--" + name.replace("_", "-"), argument.default
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, (int, float, str)):
            parser.add_argument(flag, type=type(default), default=default, 
                                choices=get_args(argument.annotation) if get_origin(argument.annotation) is Literal else None)
    return vars(parser.parse_args())
