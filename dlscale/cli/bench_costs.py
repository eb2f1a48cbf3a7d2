"""``dlscale bench ddp-cost`` and ``dlscale bench overlap``: the two costs of data parallelism beside the
all-reduce, measured here for ``dlscale project`` and lesson 11's breakdown; and the options that give
them to ``dlscale project`` and ``dlscale bench breakdown`` (``--ddp-cost``, ``--slowdown``)."""

from __future__ import annotations

import argparse
from typing import Any

from dlscale.cli.options import config_arguments, number, positive_list, sizes
from dlscale.config import load_config
from dlscale.errors import RangeError

#: ``--slowdown``'s default, as typed (dlscale.scaling.slowdown.OVERLAP_SLOWDOWN)
SLOWDOWN_DEFAULT = "0.189"


def add_term_options(parser: Any) -> None:
    """``--ddp-cost`` and ``--slowdown``: the two terms beside the communication, published or measured here."""
    terms = parser.add_argument_group("the two costs beside the communication")
    terms.add_argument(
        "--ddp-cost",
        default="published",
        metavar="published|none|JSON",
        help="DDP's own cost per step, a price per bucket and per byte of gradient: published (the default: PyTorch's "
        "DDP benchmark on a V100, 35 µs per bucket + 33 ps per byte, 3-5%% of a ResNet step), none, or the "
        "ddp_cost.json of dlscale bench ddp-cost",
    )
    terms.add_argument(
        "--slowdown",
        default=SLOWDOWN_DEFAULT,
        metavar="FACTOR|JSON",
        help="how much the communication hidden behind the backward pass slows it, seconds per second hidden: 0 to "
        f"1 (default {SLOWDOWN_DEFAULT}: Lee et al. 2025, compute overlapped with communication 18.9%% slower), or "
        "the overlap.json of dlscale bench overlap",
    )


def step_terms(ddp_cost: str, slowdown: str) -> tuple[Any, tuple[float, str]]:
    """The two terms from their options: DDP's own cost (published, none, or a ddp_cost.json) and the overlapped
    compute's slow-down with where it comes from (a factor, or an overlap.json)."""
    from dlscale.scaling.ddp_cost import NO_DDP_COST, PUBLISHED_DDP_COST, measured_ddp_cost
    from dlscale.scaling.slowdown import OVERLAP_SLOWDOWN_SOURCE, measured_slowdown

    prices = {"published": PUBLISHED_DDP_COST, "none": NO_DDP_COST}.get(ddp_cost) or measured_ddp_cost(ddp_cost)
    try:
        factor = float(slowdown)
    except ValueError:
        return prices, measured_slowdown(slowdown)
    if not 0 <= factor <= 1:
        raise RangeError(f"--slowdown {slowdown}: a factor from 0 to 1, or the overlap.json of dlscale bench overlap")
    return prices, (factor, OVERLAP_SLOWDOWN_SOURCE if slowdown == SLOWDOWN_DEFAULT else "entered on the command line")


def breakdown_split(args: argparse.Namespace) -> Any:
    """``dlscale bench breakdown``'s split of the exposed communication into its terms, when ``--allreduce`` gives
    a link to price the whole all-reduce on (None without)."""
    if not args.allreduce:
        return None
    from dlscale.bench.breakdown_terms import add_communication_terms
    from dlscale.scaling.fit import fit_link, read_allreduce

    prices, (factor, source) = step_terms(args.ddp_cost, args.slowdown)
    link = fit_link(read_allreduce(args.allreduce), name=f"fitted to {args.allreduce}")
    where = (args.ddp_cost, source)
    return lambda result: add_communication_terms(result, link, prices, factor, sources=where)


def _bench_ddp_cost(args: argparse.Namespace) -> int:
    from dlscale.bench.ddp_cost import bench_ddp_cost, format_ddp_cost

    cfg = load_config(args.config, args.overrides)
    sizes = [{"width": width} for width in args.widths] if args.widths else [{}]
    result = bench_ddp_cost(cfg, sizes, args.buckets, blocks=args.blocks, steps=args.steps, out_dir=args.out)
    print(format_ddp_cost(result))
    print(f"ddp_cost.json in {args.out}/ (dlscale project --ddp-cost {args.out}/ddp_cost.json)")
    return 0


def add_bench_ddp_cost(bench_commands: Any) -> None:
    ddp_cost = bench_commands.add_parser(
        "ddp-cost",
        help="DDP's own cost per step on one rank (nothing sent), priced per bucket and per byte",
        description="Time the engine's training step on one rank, its batches in memory, as it is and wrapped in "
        "DistributedDataParallel over a process group of one (gloo on a CPU, NCCL on a GPU) at each "
        "bucket_cap_mb, in turns over blocks; fit DDP's own cost to a price per bucket and a price per byte "
        "of gradient. gradient_as_bucket_view=false (an override) measures torch's default, which copies "
        "the gradients into the buckets; the engine's default true does not. Writes ddp_cost.json.",
    )
    config_arguments(ddp_cost)
    ddp_cost.add_argument(
        "--buckets",
        type=positive_list,
        default=[25.0, 1.0, 0.01],
        help="bucket_cap_mb values (comma-separated; default 25,1,0.01: one bucket to one tensor each)",
    )
    ddp_cost.add_argument(
        "--widths",
        type=sizes,
        default=[],
        help="model widths to measure (comma-separated; two or more separate the price per byte from the "
        "rest; default: the config's)",
    )
    ddp_cost.add_argument("--blocks", type=number(int, 2), default=20, help="blocks per way, in turns (median)")
    ddp_cost.add_argument("--steps", type=number(int, 1), default=4, help="steps per block")
    ddp_cost.add_argument("--out", default="runs/ddp_cost")
    ddp_cost.set_defaults(handler=_bench_ddp_cost)


def _bench_overlap(args: argparse.Namespace) -> int:
    from dlscale import distributed
    from dlscale.bench.overlap_slowdown import bench_overlap, format_overlap
    from dlscale.jobs.local_ranks import run_local, torchrun_command
    from dlscale.runtime.threads import fair_threads

    if distributed.detect_launcher() == "single":
        if args.nproc < 2:
            raise distributed.DistributedError(
                "bench overlap needs several ranks: pass --nproc N (N >= 2), or run it under torchrun, srun or mpirun"
            )
        forwarded = ["dlscale", "bench", "overlap", args.config, *args.overrides]
        forwarded += ["--blocks", str(args.blocks), "--out", args.out]
        command = torchrun_command(args.nproc, forwarded)
        return run_local(command, "bench overlap", fair_threads(args.nproc), capture=False).returncode
    result = bench_overlap(load_config(args.config, args.overrides), blocks=args.blocks, out_dir=args.out)
    if result is not None:
        print(format_overlap(result))
        print(f"overlap.json in {args.out}/ (dlscale project --slowdown {args.out}/overlap.json)")
    return 0


def add_bench_overlap(bench_commands: Any) -> None:
    overlap = bench_commands.add_parser(
        "overlap",
        help="how much an all-reduce running beside the backward pass slows it: the overlap's slow-down factor",
        description="On every rank, time the backward pass of the config's model alone, an all-reduce of its "
        "gradient's bytes (in 25 MiB buckets) alone, and the backward pass with that all-reduce started "
        "beside it (gloo on CPUs, NCCL on GPUs), in turns over blocks; print the extra backward seconds per "
        "second of all-reduce beside it. Run it under torchrun/srun/mpirun, or with --nproc N for N local "
        "processes. Writes overlap.json.",
    )
    config_arguments(overlap)
    overlap.add_argument(
        "--nproc", type=number(int, 1), default=2, help="local processes when not launched by a launcher"
    )
    overlap.add_argument("--blocks", type=number(int, 1), default=10, help="blocks of the three passes (median)")
    overlap.add_argument("--out", default="runs/overlap")
    overlap.set_defaults(handler=_bench_overlap)
