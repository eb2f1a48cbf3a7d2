"""``dlscale bench allreduce``, ``scaling`` and ``breakdown``: the distributed benchmarks (lessons 05, 09 and 11), each
timing ranks side by side; the two costs beside the all-reduce are in :mod:`dlscale.cli.bench_costs`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dlscale.cli.bench_costs import add_term_options, breakdown_split
from dlscale.cli.options import MIN_MEASURED_STEPS, config_arguments, number, positive_list, sizes
from dlscale.config import load_config
from dlscale.errors import RangeError


def _bench_allreduce(args: argparse.Namespace) -> int:
    from dlscale import distributed
    from dlscale.bench.allreduce import ALLREDUCE_SIZES, bench_allreduce, format_allreduce, save_allreduce
    from dlscale.jobs.local_ranks import horovodrun_command, run_local, torchrun_command

    if distributed.detect_launcher() == "single":
        if args.nproc < 2:
            raise distributed.DistributedError(
                "bench allreduce needs several ranks: pass --nproc N (N >= 2), or run "
                "it under torchrun, srun, mpirun or horovodrun"
            )
        forwarded = [
            "dlscale",
            "bench",
            "allreduce",
            "--max-mib",
            str(args.max_mib),
            "--out",
            args.out,
            "--device",
            args.device,
            "--rounds",
            str(args.rounds),
        ] + (["--horovod"] if args.horovod else [])
        start = horovodrun_command if args.horovod else torchrun_command
        return run_local(start(args.nproc, forwarded), "bench allreduce", capture=False).returncode
    sizes = [s for s in ALLREDUCE_SIZES if s <= args.max_mib * 2**20]
    rows = bench_allreduce(
        sizes, device=args.device, data_parallel="horovod" if args.horovod else "auto", rounds=args.rounds
    )
    if distributed.is_main():
        print(format_allreduce(rows))
        print(f"allreduce.json and allreduce.png in {save_allreduce(rows, args.out)}/")
    distributed.shutdown()
    return 0


def add_bench_allreduce(bench_commands: Any) -> None:
    allreduce = bench_commands.add_parser(
        "allreduce",
        help="all-reduce time and bus bandwidth, 4 KiB to 256 MiB",
        description="Time the all-reduce over message sizes on the active backend (torch.distributed with gloo "
        "on CPUs and NCCL on GPUs, or Horovod with --horovod) and report the algorithm and bus "
        "bandwidth (bus = 2(n-1)/n x bytes/time, as nccl-tests). Run it under torchrun/srun/mpirun/"
        "horovodrun, or with --nproc N for N local processes.",
    )
    allreduce.add_argument(
        "--nproc", type=number(int, 1), default=2, help="local processes when not launched by a launcher"
    )
    allreduce.add_argument("--max-mib", type=number(float, 0, above=True), default=256, help="largest message in MiB")
    allreduce.add_argument("--device", default="auto")
    allreduce.add_argument(
        "--horovod", action="store_true", help="time Horovod's all-reduce (local ranks start under horovodrun --gloo)"
    )
    allreduce.add_argument(
        "--rounds", type=number(int, 1), default=1, help="the sizes take turns this many times (median)"
    )
    allreduce.add_argument("--out", default="runs/allreduce")
    allreduce.set_defaults(handler=_bench_allreduce)


def _bench_scaling(args: argparse.Namespace) -> int:
    from dlscale.bench.scaling import bench_scaling, format_scaling

    rows = bench_scaling(load_config(args.config, args.overrides), procs=args.procs, steps=args.steps, out_dir=args.out)
    print(format_scaling(rows))
    print(f"scaling.json and scaling.png in {args.out}/")
    return 0


def add_bench_scaling(bench_commands: Any) -> None:
    scaling = bench_commands.add_parser(
        "scaling",
        help="weak and strong scaling of the training over local processes",
        description="Train at each process count under torchrun: strong scaling keeps the global batch, weak "
        "scaling keeps the per-rank batch. Prints throughput, speedup and efficiency.",
    )
    config_arguments(scaling)
    scaling.add_argument("--procs", type=sizes, default=[1, 2], help="comma-separated process counts (default 1,2)")
    scaling.add_argument("--steps", type=number(int, MIN_MEASURED_STEPS), default=60)
    scaling.add_argument("--out", default="runs/scaling")
    scaling.set_defaults(handler=_bench_scaling)


def _bench_breakdown(args: argparse.Namespace) -> int:
    from dlscale.bench.breakdown import bench_breakdown, format_breakdown, local_runner, slurm_runner
    from dlscale.runtime.threads import affinity_cpus, fair_threads

    cfg = load_config(args.config, args.overrides)
    sizes = args.sizes
    cpus = affinity_cpus()
    if not args.slurm and max(sizes) > cpus:  # (local ranks beyond the CPUs measure contention, not scaling)
        raise RangeError(
            f"--sizes {max(sizes)}: this process has {cpus} CPU(s), so at most {cpus} local ranks; "
            f"use --slurm SCRIPT for nodes"
        )
    runner = (
        slurm_runner(cfg, args.slurm, dict(os.environ), args.tasks_per_node)
        if args.slurm
        else local_runner(cfg, args.threads or fair_threads(max(sizes)))
    )
    result = bench_breakdown(
        cfg,
        sizes,
        runner,
        steps=args.steps,
        rounds=args.rounds,
        buckets=args.buckets,
        static_graph=args.static_graph,
        unit="nodes" if args.slurm else "ranks",
        ranks_per_unit=args.tasks_per_node if args.slurm else 1,
        out_dir=args.out,
        split=breakdown_split(args),
    )
    print(format_breakdown(result))
    print(f"breakdown.json and breakdown.png in {args.out}/")
    return 0


def add_bench_breakdown(bench_commands: Any) -> None:
    breakdown = bench_commands.add_parser(
        "breakdown",
        help="where the scaling efficiency goes: exposed I/O, exposed communication, the rest",
        description="At each size train the same step (weak scaling) as it runs, with the data already in memory, "
        "with every rank alone (no communication) and with other DDP bucket sizes, in turns over rounds; "
        "split the lost efficiency into exposed I/O, exposed communication and the rest. Local ranks "
        "under torchrun, or nodes through a Slurm script with --slurm. Writes breakdown.json and "
        "breakdown.png.",
    )
    config_arguments(breakdown)
    breakdown.add_argument("--sizes", type=sizes, default=[1, 2], help="comma-separated ranks (or nodes with --slurm)")
    breakdown.add_argument(
        "--steps", type=number(int, MIN_MEASURED_STEPS), default=150, help="steps per run (the first 5 are not timed)"
    )
    breakdown.add_argument(
        "--rounds", type=number(int, 1), default=2, help="every way runs once per round, in turns (median)"
    )
    breakdown.add_argument(
        "--buckets",
        type=positive_list,
        default=[1.0],
        help="other bucket_cap_mb values to try (comma-separated; default 1)",
    )
    breakdown.add_argument("--static-graph", action="store_true", help="also set static_graph in the bucket runs")
    breakdown.add_argument(
        "--threads", type=number(int, 0), default=0, help="torch threads per rank (0 = the CPUs shared)"
    )
    breakdown.add_argument(
        "--slurm",
        default=None,
        metavar="SCRIPT",
        help="submit each run as a job of SIZE nodes with this script (slurm/SITE/train.sbatch)",
    )
    breakdown.add_argument("--tasks-per-node", type=number(int, 1), default=1, help="with --slurm: ranks per node")
    breakdown.add_argument(
        "--allreduce",
        default=None,
        metavar="JSON",
        help="allreduce.json of dlscale bench allreduce here: split the exposed communication into DDP's own cost, "
        "the overlap's slow-down and the exposed all-reduce (the whole all-reduce priced on the link fitted to it)",
    )
    add_term_options(breakdown)
    breakdown.add_argument("--out", default="runs/breakdown")
    breakdown.set_defaults(handler=_bench_breakdown)
