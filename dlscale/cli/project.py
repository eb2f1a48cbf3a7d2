"""``dlscale project``: the scaling model's efficiency on a site, from one GPU's compute and the model's size."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dlscale.cli.bench_costs import add_term_options, step_terms
from dlscale.cli.options import number, number_or
from dlscale.cli.project_layouts import add_layout_options, project_layouts
from dlscale.scaling.sites import SITES


def _project(args: argparse.Namespace) -> int:
    from dlscale.reporting.plots import efficiency_projection
    from dlscale.scaling.overlap import published_layers
    from dlscale.scaling.projection import (
        RESNET50_PARAMETERS,
        Workload,
        assumptions,
        format_projection,
        overlap_from_breakdown_file,
        project_efficiency,
    )
    from dlscale.scaling.sites import SITES, load_machine, machine

    site = load_machine(args.machine) if args.machine else SITES[args.site]
    custom = (args.gpus_per_node, args.inside_gbs, args.between_gbs, args.inside_latency_us, args.between_latency_us)
    if any(value is not None for value in custom):  # the given figures replace the site's (or the file's)
        site = machine(
            f"{site.name}, with figures entered",
            args.gpus_per_node or site.gpus_per_node,
            args.inside_gbs or site.inside.bandwidth / 1e9,
            args.between_gbs or site.between.bandwidth / 1e9,
            site.inside.alpha * 1e6 if args.inside_latency_us is None else args.inside_latency_us,
            site.between.alpha * 1e6 if args.between_latency_us is None else args.between_latency_us,
            f"entered on the command line; the rest from {site.source}",
        )
    if args.layouts:  # (a model that may not fit one GPU: its layouts, not a data-parallel curve)
        return project_layouts(args, site)
    if args.samples_per_s:
        per_sample, source = 1 / args.samples_per_s, f"{args.samples_per_s:g} samples/s measured on one GPU"
    elif args.step_ms:
        per_sample, source = args.step_ms / 1000 / args.batch, f"a step of {args.step_ms:g} ms at batch {args.batch}"
    else:
        per_sample, source = args.ms_per_sample / 1000, "entered on the command line"
    overlap = args.overlap
    layers = published_layers(args.layers) if args.layers else None
    ddp_cost, slowdown = step_terms(args.ddp_cost, args.slowdown)
    if args.breakdown:  # (measured on this site: the exposed share of what the model says the step sends)
        overlap, where = overlap_from_breakdown_file(args.breakdown, site)
        print(f"overlap: {where}")
    workload = Workload(
        args.name or (args.layers if layers else "ResNet-50-sized gradient"),
        sum(layer.parameters for layer in layers) if layers else args.parameters or RESNET50_PARAMETERS,
        per_sample,
        args.batch,
        args.bytes_per_value or 4,
        args.layout,
        overlap,
        source,
        args.backward_share,
        args.bucket_mb or None,
        args.algorithm,
        layers,
        f"torchvision's {args.layers}" if layers else "",
        ddp_cost=ddp_cost,
        slowdown=slowdown[0],
        slowdown_source=slowdown[1],
    )
    rows = project_efficiency(workload, site, baseline=args.baseline)
    print(format_projection(rows))
    print("\nassumptions:\n" + assumptions(workload, site, args.baseline))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    efficiency_projection({workload.name: rows}, assumptions(workload, site, args.baseline)).savefig(
        Path(args.out) / "projection.png", dpi=120
    )
    print(f"projection.png in {args.out}/")
    return 0


def _add_machine_options(parser: Any) -> None:
    """dlscale project's machine: a site, a YAML file, or figures that replace theirs."""
    where = parser.add_argument_group("the machine: a site, a YAML file, or figures that replace theirs")
    where.add_argument("--site", choices=sorted(SITES), default="perlmutter")
    where.add_argument(
        "--machine",
        default=None,
        metavar="YAML",
        help="your cluster: gpus_per_node, inside and between (bandwidth_gbs, latency_us), source",
    )
    where.add_argument("--gpus-per-node", type=number(int, 1), default=None)
    where.add_argument(
        "--inside-gbs",
        type=number(float, 1e-6, 1e6),
        default=None,
        help="GB/s per direction between the GPUs of a node",
    )
    where.add_argument(
        "--between-gbs",
        type=number(float, 1e-6, 1e6),
        default=None,
        help="each GPU's share of the network between nodes, GB/s per direction",
    )
    where.add_argument("--inside-latency-us", type=number(float, 0), default=None)
    where.add_argument("--between-latency-us", type=number(float, 0), default=None)


def add_project(commands: Any) -> None:
    from dlscale.scaling.collectives import ALGORITHMS
    from dlscale.scaling.model_size import PRESETS
    from dlscale.scaling.overlap import PUBLISHED_MODELS
    from dlscale.scaling.projection import BASELINES

    project = commands.add_parser(
        "project",
        help="predicted step time and efficiency of a model from 1 to 1,024 nodes of a site or your cluster",
        description="The alpha-beta model of the layout's collectives (bucket by bucket: on an NCCL site, the "
        "algorithm and protocol NCCL's own cost model picks; elsewhere the cheapest algorithm) "
        "on a site's published links or your own machine's, plus one GPU's measured "
        "compute, with the share of communication hidden behind the backward pass (dlscale bench "
        "breakdown measures it; by default it is estimated from DDP's bucket schedule; it never hides more than "
        "the backward pass). Two terms sit beside the communication in each step: DDP's own cost (a price per "
        "bucket and per byte of gradient: --ddp-cost, measured by dlscale bench ddp-cost) and the slow-down of "
        "the backward pass by the communication it hides (--slowdown, measured by dlscale bench overlap). "
        "Prints the table and the assumptions; writes projection.png. With --layouts MODEL instead: a model that may "
        "not fit one GPU laid out as DP, FSDP, TP×DP and PP×TP×DP on --gpus GPUs, each priced (a pipeline's bubble "
        "and the activations sent between its stages included) and the cheapest that fits chosen.",
    )
    _add_machine_options(project)
    compute = project.add_argument_group(
        "one GPU's compute, measured (one of these), or --layouts: a model that may not fit one GPU"
    )
    given = compute.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--samples-per-s",
        type=number(float, 0, above=True),
        default=None,
        help="one GPU's training throughput (a published figure, or dlscale train's)",
    )
    given.add_argument(
        "--step-ms", type=number(float, 0, above=True), default=None, help="one GPU's step time at --batch, in ms"
    )
    given.add_argument(
        "--ms-per-sample", type=number(float, 0, above=True), default=None, help="one GPU's compute per sample, in ms"
    )
    given.add_argument(
        "--layouts",
        choices=sorted(PRESETS),
        default=None,
        metavar="MODEL",
        help=f"a GPT-3-shaped model ({', '.join(sorted(PRESETS))}): price DP, FSDP, TP×DP and PP×TP×DP on --gpus "
        "GPUs of the site and print the table and the cheapest, instead of the projection",
    )
    project.add_argument("--name", default=None, help="the model's name in the table and the plot")
    model = project.add_mutually_exclusive_group()
    model.add_argument(
        "--parameters",
        type=number(int, 1, 10**14),
        default=None,
        help="parameter count, 1 to 1e14 (default: ResNet-50's 25.6 M)",
    )
    model.add_argument(
        "--layers",
        choices=PUBLISHED_MODELS,
        default=None,
        help="a model's layer table (its parameters, and the bucket schedule --overlap auto estimates from)",
    )
    project.add_argument("--batch", type=number(int, 1), default=64, help="batch per GPU")
    project.add_argument(
        "--bytes-per-value",
        type=number(int, 1, 8),
        default=None,
        help="4 for fp32 gradients (the default), 2 for bf16 (the default with --layouts)",
    )
    project.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp")
    hidden = project.add_mutually_exclusive_group()
    hidden.add_argument(
        "--overlap",
        type=number_or("auto", float, 0, 1),
        default="auto",
        help="share of the communication hidden behind the backward pass, 0 to 1; auto (the default): estimated "
        "at each size from DDP's bucket schedule, the gradient made at an even rate through the backward pass",
    )
    hidden.add_argument(
        "--breakdown",
        default=None,
        metavar="JSON",
        help="breakdown.json of dlscale bench breakdown on this machine: the overlap it measured",
    )
    project.add_argument(
        "--backward-share",
        type=number(float, 0, 1),
        default=2 / 3,
        help="the backward pass's share of the compute: the most an overlap can hide (default 2/3)",
    )
    project.add_argument(
        "--bucket-mb",
        type=number(float, 0),
        default=25.0,
        help="DDP's bucket_cap_mb: one latency per bucket (0: the gradient as one message)",
    )
    project.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="auto",
        help="all-reduce between nodes (auto: for each bucket, NCCL's own choice of ring or tree and LL, LL128 or "
        "Simple on an NCCL site, else the cheapest of ring and tree)",
    )
    add_term_options(project)
    project.add_argument("--baseline", choices=BASELINES, default="gpu", help="efficiency against one GPU or one node")
    project.add_argument("--out", default="runs/projection")
    add_layout_options(project)
    project.set_defaults(handler=_project)
