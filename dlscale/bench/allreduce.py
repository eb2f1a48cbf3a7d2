"""``dlscale bench allreduce``: all-reduce time and bus bandwidth over message sizes (lessons 05 and 06)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from dlscale.reporting.tables import markdown_table

ALLREDUCE_SIZES = tuple(4 * 1024 * 4**i for i in range(9))


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``2·(n−1)/n · bytes / time``, comparable across sizes of job."""
    return 2 * (world_size - 1) / world_size * size_bytes / seconds


def slowest_rank(seconds: float, device: torch.device) -> float:
    """The largest of every rank's ``seconds``, reduced on the benchmark's device (NCCL takes no CPU tensors)."""
    from dlscale import distributed

    return float(distributed.all_reduce_max(torch.tensor(seconds, dtype=torch.float64, device=device)))


def bench_allreduce(
    sizes: Iterable[int] = ALLREDUCE_SIZES,
    device: str = "auto",
    min_seconds: float = 0.2,
    max_iters: int = 50,
    data_parallel: str = "auto",
    rounds: int = 1,
) -> list[dict]:
    """Time the all-reduce of float32 tensors of each size on the active backend; run on every rank.

    The backend is the process group (gloo on CPUs, NCCL on GPUs) or, with
    ``data_parallel="horovod"`` (the default under horovodrun), Horovod. Each size runs a
    few untimed iterations, then enough timed ones to last about ``min_seconds`` (at most
    ``max_iters``). With ``rounds`` the sizes take turns that many times and each row is the
    median round (a busy spell then spoils one round, not the row). Returns rows on every rank
    (rank 0 prints them).
    """
    from dlscale import distributed

    env = distributed.init(device, data_parallel=data_parallel)
    if not env.distributed:
        raise distributed.DistributedError(
            "bench allreduce needs several ranks: run it under torchrun, srun, "
            "mpirun or horovodrun, or pass --nproc N to start N local processes"
        )
    backend = (
        env.backend
        if env.backend != "horovod"
        else "horovod (gloo)"
        if not env.device.startswith("cuda")
        else "horovod (nccl)"
    )
    target = torch.device(env.device)
    sync = torch.cuda.synchronize if target.type == "cuda" else (lambda: None)
    sizes = list(sizes)
    timed = {size: [] for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            timed[size].append(_time_allreduce(size, target, sync, min_seconds, max_iters))
    rows = []
    for size in sizes:
        seconds = statistics.median(timed[size])
        rows.append(
            {
                "bytes": size,
                "ms": 1000 * seconds,
                "rounds": rounds,
                "algbw_gbs": size / seconds / 1e9,
                "busbw_gbs": bus_bandwidth(size, seconds, env.world_size) / 1e9,
                "world_size": env.world_size,
                "backend": backend,
            }
        )
    return rows


def _time_allreduce(size: int, target: torch.device, sync, min_seconds: float, max_iters: int) -> float:
    """Seconds per all-reduce of ``size`` bytes, as the slowest rank saw them."""
    from dlscale import distributed

    tensor = torch.ones(size // 4, dtype=torch.float32, device=target)
    # Timed by hand, not by torch.utils.benchmark: its adaptive repetition would let ranks make
    # different numbers of calls, and each call is a collective. Three untimed calls size the
    # timed loop, and the count comes from the slowest rank's estimate so that all agree.
    sync()
    start = time.perf_counter()
    for _ in range(3):
        distributed.all_reduce_sum(tensor)
    sync()
    estimate = slowest_rank((time.perf_counter() - start) / 3, target)
    iters = int(min(max_iters, max(3, min_seconds / max(estimate, 1e-9))))
    start = time.perf_counter()
    for _ in range(iters):
        distributed.all_reduce_sum(tensor)
    sync()
    return slowest_rank((time.perf_counter() - start) / iters, target)  # the slowest rank sets the pace


def format_allreduce(rows: list[dict]) -> str:
    def size(row: dict) -> str:
        return f"{row['bytes'] / 2**20:g} MiB" if row["bytes"] >= 2**20 else f"{row['bytes'] / 1024:g} KiB"

    table = markdown_table(
        ["size", "time (ms)", "algbw (GB/s)", "busbw (GB/s)"],
        [(size(row), f"{row['ms']:.3f}", f"{row['algbw_gbs']:.3f}", f"{row['busbw_gbs']:.3f}") for row in rows],
    )
    return f"all-reduce, {rows[0]['world_size']} ranks, {rows[0]['backend']}\n\n{table}"


def save_allreduce(rows: list[dict], out_dir: str | Path) -> Path:
    """Write ``allreduce.json`` and ``allreduce.png`` into ``out_dir``."""
    from dlscale.reporting.plots import allreduce_bandwidth

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "allreduce.json").write_text(json.dumps(rows, indent=1) + "\n")
    allreduce_bandwidth(rows).savefig(out_dir / "allreduce.png", dpi=120)
    return out_dir
