"""``dlscale bench ...`` (ratios measured side by side) and ``dlscale experiment large-batch`` (lesson 07's sweep)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dlscale.cli.bench_costs import add_bench_ddp_cost, add_bench_overlap
from dlscale.cli.bench_distributed import add_bench_allreduce, add_bench_breakdown, add_bench_scaling
from dlscale.cli.options import MIN_MEASURED_STEPS, config_arguments, counts_or_none, number, sizes
from dlscale.config import load_config


def add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for add in (
        add_bench_optim,
        add_bench_ladder,
        add_bench_loader,
        add_bench_threads,
        add_bench_allreduce,
        add_bench_scaling,
        add_bench_breakdown,
        add_bench_ddp_cost,
        add_bench_overlap,
        add_bench_memory,
        add_bench_kmeans,
        add_bench_parity,
    ):
        add(bench_commands)


def _bench_optim(args: argparse.Namespace) -> int:
    from dlscale.bench.optimizers import bench_optimizers, comparison_lines, format_rows, timm_optimizers

    if timm_optimizers() is None:
        print(
            "timm is not installed: comparing with torch's optimizers only "
            "(pip install --no-deps timm adds timm's Lamb and Lars)"
        )
    rows = bench_optimizers(args.models.split(","), steps=args.steps, rounds=args.rounds, device=args.device)
    print(format_rows(rows))
    print("\n".join(comparison_lines(rows)))
    return 0


def add_bench_optim(bench_commands: Any) -> None:
    optim = bench_commands.add_parser(
        "optim",
        help="optimizer step time: LAMB, LARS, AdamW, SGD (and timm's)",
        description="Time optimizer.step() of each optimizer in turns, on the lesson "
        "model and a ~25 M parameter model, and print ratios to AdamW.",
    )
    optim.add_argument("--models", default="lesson,25M", help="comma-separated: lesson, 25M")
    optim.add_argument("--steps", type=number(int, 1), default=10, help="steps per timed round")
    optim.add_argument("--rounds", type=number(int, 1), default=5, help="rounds (the median is reported)")
    optim.add_argument("--device", default="cpu", help="cpu or cuda")
    optim.set_defaults(handler=_bench_optim)


def _bench_ladder(args: argparse.Namespace) -> int:
    from dlscale.bench.ladder import bench_ladder, format_ladder

    rows = bench_ladder(
        load_config(args.config, args.overrides), steps=args.steps, out_dir=args.out, rounds=args.rounds
    )
    print(format_ladder(rows))
    print(f"ladder.json and ladder.png in {args.out}/")
    return 0


def add_bench_ladder(bench_commands: Any) -> None:
    ladder = bench_commands.add_parser(
        "ladder",
        help="the optimization ladder: each rung adds one speed-up, all measured in one run",
        description="fp32 baseline -> loader workers and pinned memory -> channels_last -> mixed precision -> "
        "fused optimizer -> torch.compile -> CUDA graphs (GPU only); prints samples/s and speedups, "
        "writes ladder.json and ladder.png.",
    )
    config_arguments(ladder)
    ladder.add_argument("--steps", type=number(int, MIN_MEASURED_STEPS), default=60, help="training steps per rung")
    ladder.add_argument(
        "--rounds", type=number(int, 1), default=1, help="train every rung this many times, in turns (median)"
    )
    ladder.add_argument("--out", default="runs/ladder")
    ladder.set_defaults(handler=_bench_ladder)


def _bench_loader(args: argparse.Namespace) -> int:
    from dlscale.bench.loader import bench_loader

    report = bench_loader(load_config(args.config, args.overrides), batches=args.batches)
    print(
        f"input pipeline alone: {report['samples_per_s']:,.0f} samples/s over {report['batches']} batches of "
        f"{report['batch_size']} (workers {report['num_workers']}, pinned memory {report['pin_memory']})"
    )
    return 0


def add_bench_loader(bench_commands: Any) -> None:
    loader = bench_commands.add_parser("loader", help="samples/s of the input pipeline alone (no model)")
    config_arguments(loader)
    loader.add_argument("--batches", type=number(int, 1), default=50)
    loader.set_defaults(handler=_bench_loader)


def _bench_threads(args: argparse.Namespace) -> int:
    from dlscale.bench.threads import bench_threads, format_threads

    rows = bench_threads(args.config, steps=args.steps, rounds=args.rounds, busy=args.busy, out_dir=args.out)
    print(format_threads(rows))
    return 0


def add_bench_threads(bench_commands: Any) -> None:
    threads = bench_commands.add_parser(
        "threads",
        help="training on a shared node: the kit's thread choice against fixed counts, alone and beside busy processes",
    )
    threads.add_argument("config", nargs="?", default="demo", help="config name or YAML path (default demo)")
    threads.add_argument(
        "--steps", type=number(int, MIN_MEASURED_STEPS), default=200, help="steps per run (default 200)"
    )
    threads.add_argument("--rounds", type=number(int, 1), default=3, help="runs of each setting (default 3)")
    threads.add_argument("--busy", type=number(int, 1), default=1, help="spinning neighbours (default 1)")
    threads.add_argument("--out", default="runs/bench_threads", help="where the runs go (default runs/bench_threads)")
    threads.set_defaults(handler=_bench_threads)


def _bench_memory(args: argparse.Namespace) -> int:
    from dlscale.bench.memory import bench_memory, format_memory

    rows = bench_memory(load_config(args.config, args.overrides), steps=args.steps, out_dir=args.out)
    print(format_memory(rows))
    print(
        f"memory.json in {args.out}/ (per rank: the largest rank's figures; peak = CUDA's allocator peak on a GPU, "
        f"the process's peak resident set on a CPU)"
    )
    return 0


def add_bench_memory(bench_commands: Any) -> None:
    memory = bench_commands.add_parser(
        "memory",
        help="bytes each rank holds under DDP, FSDP and tensor parallelism, and the step time",
        description="Train a few steps of the same model as 1 process, DDP and FSDP on 2 and 4 ranks, FSDP with "
        "activation checkpointing, and FSDP x tensor parallel 2x2 (local processes under torchrun). "
        "Prints per rank the parameter, gradient and optimizer-state bytes counted from the tensors it "
        "holds, the peak memory and the step time, with the ratios to DDP on as many ranks.",
    )
    config_arguments(memory, default="vit")
    memory.add_argument(
        "--steps", type=number(int, MIN_MEASURED_STEPS), default=10, help="steps per layout (the first 5 are not timed)"
    )
    memory.add_argument("--out", default="runs/memory")
    memory.set_defaults(handler=_bench_memory)


def _bench_kmeans(args: argparse.Namespace) -> int:
    from dlscale.bench.kmeans import bench_kmeans, format_kmeans

    rows = bench_kmeans(
        n=args.n,
        d=args.d,
        k=args.k,
        iterations=args.iters,
        procs=args.procs,
        out_dir=args.out,
        rounds=args.rounds,
        kinds=tuple(args.kinds.split(",")),
        photo_k=tuple(args.photo_k),
    )
    print(format_kmeans(rows))
    print(f"kmeans.json and kmeans.png in {args.out}/")
    return 0


def add_bench_kmeans(bench_commands: Any) -> None:
    kmeans_bench = bench_commands.add_parser(
        "kmeans",
        help="K-Means: dlscale-torch, daal4py and scikit-learn side by side, and 1-vs-2-process scaling",
        description="Fit the same data from the same initial centres with each engine, on blobs, on noise and on a "
        "photo's colours, for the first iterations and to convergence, and print iterations, inertia, "
        "seconds and the ratios to scikit-learn; then strong and weak scaling of the distributed "
        "backends over local processes (torchrun, mpirun) on the first kind.",
    )
    kmeans_bench.add_argument(
        "--kinds",
        default="blobs,noise,china,flower,mixture",
        help="kinds of data: blobs, noise (no clusters), china and flower (a photo's colours), "
        "mixture (128 features, 40 overlapping clusters)",
    )
    kmeans_bench.add_argument("--n", type=number(int, 1), default=1_000_000, help="samples of blobs (noise: 0.4 n)")
    kmeans_bench.add_argument("--d", type=number(int, 1), default=32, help="features of blobs and noise")
    kmeans_bench.add_argument("--k", type=number(int, 1), default=64, help="clusters of blobs and noise")
    kmeans_bench.add_argument(
        "--photo-k", type=sizes, default=[16, 64], help="clusters (colours) of the photos (default 16,64)"
    )
    kmeans_bench.add_argument("--iters", type=number(int, 1), default=8, help="Lloyd iterations of the first phase")
    kmeans_bench.add_argument(
        "--procs",
        type=counts_or_none,
        default=[1, 2],
        help="process counts for the scaling runs ('' = none; default 1,2)",
    )
    kmeans_bench.add_argument(
        "--rounds", type=number(int, 1), default=3, help="fits per engine; the median is reported"
    )
    kmeans_bench.add_argument("--out", default="runs/bench_kmeans")
    kmeans_bench.set_defaults(handler=_bench_kmeans)


def _bench_parity(args: argparse.Namespace) -> int:
    from dlscale.lessons.parity import SINGLE_PROCESS, format_parity, parity_threads, time_stage

    stages = {name[:2]: name for name in SINGLE_PROCESS}
    unknown = [number for number in args.stages.split(",") if number.strip() not in stages]
    if unknown:
        print(
            f"dlscale bench parity: --stages: no single-process stage {', '.join(unknown)}; the stages are "
            f"{', '.join(stages)}",
            file=sys.stderr,
        )
        return 2
    threads = parity_threads(args.threads)  # (once, for both sides of every stage)
    rows = [
        time_stage(stages[number.strip()], args.rounds, threads, config=args.config, epochs=args.epochs)
        for number in args.stages.split(",")
    ]
    print(format_parity(rows))
    return 0


def add_bench_parity(bench_commands: Any) -> None:
    parity = bench_commands.add_parser(
        "parity",
        help="the engine against the plain recipe: each stage and its engine twin, timed in turns",
        description="Run each single-process stage of recipes/ and its engine twin (dlscale.train with the same "
        "settings) in turns, in one process on the same data, and print the time of each and their ratio "
        "(the engine's cost over the plain loop), with the largest loss difference (0: the same steps).",
    )
    parity.add_argument("--stages", default="01,02,03,04", help="comma-separated stage numbers (01, 02, 03, 04)")
    parity.add_argument("--config", default="demo", help="the data set both train on (default demo, the README's run)")
    parity.add_argument("--epochs", type=number(int, 1), default=3)
    parity.add_argument(
        "--rounds", type=number(int, 1), default=3, help="timed runs of each, in turns (the median is reported)"
    )
    parity.add_argument(
        "--threads",
        type=number(int, 0),
        default=0,
        help="torch threads of both sides (default 0: chosen once as the engine chooses, and printed)",
    )
    parity.set_defaults(handler=_bench_parity)


def _experiment_large_batch(args: argparse.Namespace) -> int:
    from dlscale.bench.large_batch import format_table, large_batch_sweep

    rows = large_batch_sweep(args.out, size=args.size, recipes=args.recipes.split(",") if args.recipes else None)
    print(format_table(rows))
    print(f"table and figure in {args.out}/ (table.md, table.csv, sweep.png)")
    return 0


def add_experiment(commands: Any) -> None:
    experiment = commands.add_parser("experiment", help="multi-run experiments (lesson 07's large-batch sweep)")
    experiment_commands = experiment.add_subparsers(dest="experiment_command", required=True, metavar="EXPERIMENT")
    sweep = experiment_commands.add_parser(
        "large-batch",
        help="batch-size sweep: LR scaling rules, warmup, LARS and LAMB",
        description="Train a baseline batch B0, then 8x, 32x and 128x B0 with each recipe for the same number "
        "of epochs; write a table and a plot. --size ci takes a few minutes on 2 CPU cores; "
        "--size full is meant for one GPU.",
    )
    sweep.add_argument("--size", choices=("ci", "full"), default="ci")
    sweep.add_argument("--out", default="runs/large_batch", help="folder for the runs, table and figure")
    sweep.add_argument("--recipes", default=None, help="comma-separated subset of the recipes")
    sweep.set_defaults(handler=_experiment_large_batch)
