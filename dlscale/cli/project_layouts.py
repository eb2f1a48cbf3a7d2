"""``dlscale project --layouts MODEL``: the layouts of a model that may not fit one GPU, priced on a site, the cheapest
chosen (:mod:`dlscale.scaling.layouts`); the options it takes beside ``dlscale project``'s machine."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from dlscale.cli.options import number
from dlscale.errors import RangeError

#: dlscale project's options that describe a data-parallel projection, not a model's layouts: refused with --layouts.
PROJECTION_ONLY = ("parameters", "layers", "breakdown", "name")


def add_layout_options(parser: Any) -> None:
    """The options of ``--layouts``: the GPUs, the GPU, the batch and the pipeline's schedule."""
    from dlscale.scaling.layouts import GPUS
    from dlscale.scaling.pipeline_cost import SCHEDULES

    group = parser.add_argument_group(
        "with --layouts: a model that may not fit one GPU, as DP, FSDP, TP×DP or PP×TP×DP on --gpus GPUs"
    )
    group.add_argument("--gpus", type=number(int, 1, 10**6), default=256, help="GPUs in all (default 256)")
    group.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        default=None,
        help="the GPU (default: the site's: Perlmutter's A100 40 GB, Frontier's MI250X GCD; else an A100 80 GB)",
    )
    group.add_argument(
        "--gpu-memory-gb", type=number(float, 0, 1e5, above=True), default=None, help="replaces the GPU's memory"
    )
    group.add_argument(
        "--peak-tflops", type=number(float, 0, 1e6, above=True), default=None, help="replaces the GPU's 16-bit peak"
    )
    group.add_argument(
        "--utilization",
        type=number(float, 0, 1, above=True),
        default=None,
        help="the share of the peak the model's compute reaches on one GPU (default 0.45: Megatron-LM's A100s reached "
        "0.44-0.52 end to end)",
    )
    group.add_argument(
        "--global-batch", type=number(int, 1, 10**9), default=1536, help="samples per step, all GPUs (default 1536)"
    )
    group.add_argument("--micro-batch", type=number(int, 1, 10**6), default=1, help="samples per micro-batch")
    group.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="the pipeline's schedule")
    group.add_argument(
        "--virtual-stages",
        type=number(int, 1, 64),
        default=None,
        help="stages per rank (interleaved-1f1b; default 2 with it, else 1)",
    )


def project_layouts(args: argparse.Namespace, site: Any) -> int:
    """Print the layouts' table, the cheapest and the assumptions, for ``args.layouts`` on ``site``."""
    from dlscale.scaling.layouts import GPUS, SITE_GPUS, Training, choose_layout, format_layouts, layout_assumptions
    from dlscale.scaling.model_size import PRESETS

    given = [f"--{name.replace('_', '-')}" for name in PROJECTION_ONLY if getattr(args, name, None) is not None]
    if given:
        raise RangeError(
            f"--layouts takes its model from the preset {args.layouts}; {given[0]} describes a data-parallel "
            "projection (leave it out, or leave out --layouts)"
        )
    schedule, virtual = args.schedule, args.virtual_stages or (2 if args.schedule == "interleaved-1f1b" else 1)
    if (schedule == "interleaved-1f1b") != (virtual > 1):
        raise RangeError(
            f"--virtual-stages {virtual} with --schedule {schedule}: interleaved-1f1b holds 2 or more stages per "
            "rank, gpipe and 1f1b one"
        )
    gpu = GPUS[args.gpu or SITE_GPUS.get(site.name.split(",")[0], "a100-80gb")]  # (a site with figures entered too)
    entered = {
        key: value
        for key, value in (
            ("memory_gb", args.gpu_memory_gb),
            ("peak_tflops", args.peak_tflops),
            ("utilization", args.utilization),
        )
        if value is not None
    }
    if entered:  # (the figures given replace the sheet's)
        gpu = dataclasses.replace(gpu, **entered, source=f"{gpu.source}; {', '.join(entered)} entered")
    training = Training(
        args.global_batch,
        args.micro_batch,
        schedule,
        virtual,
        gradient_bytes=args.bytes_per_value or 2,
        bucket_mb=args.bucket_mb or None,
        algorithm=args.algorithm,
    )
    model = PRESETS[args.layouts]
    rows, choice = choose_layout(model, gpu, site, args.gpus, training)
    print(format_layouts(rows, choice, gpu))
    print("\nassumptions:\n" + layout_assumptions(model, gpu, site, args.gpus, training))
    return 0
