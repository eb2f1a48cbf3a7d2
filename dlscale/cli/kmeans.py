"""``dlscale kmeans``: colour quantization and distributed K-Means."""

from __future__ import annotations

import argparse
from typing import Any

from dlscale.cli.options import number


def _kmeans(args: argparse.Namespace) -> int:
    from dlscale.kmeans.command import run

    run(args)
    return 0


def add_kmeans(commands: Any) -> None:
    kmeans = commands.add_parser(
        "kmeans",
        help="distributed K-Means on .npy/.csv files or an image (colour quantization)",
        description="Cluster each rank's data with dlscale.kmeans.KMeans and write centers.npy, the labels, "
        "summary.json and, for an image, the quantized picture. Runs alone or under torchrun, "
        "mpirun -n N or srun; backend auto uses daal4py under MPI on CPUs and torch otherwise.",
    )
    source = kmeans.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        action="append",
        default=[],
        help="a .npy/.csv file split by rank, or a pattern such as data_{rank}.npy with one file per rank; given "
        "again, the same ranks fit each in turn in one launch, each one's outputs in OUT/0, OUT/1, ...",
    )
    source.add_argument("--image", help="'sample' (scikit-learn's photo) or an image file: quantize its colours")
    kmeans.add_argument("--k", type=number(int, 1), default=8, help="clusters (colours for an image)")
    kmeans.add_argument(
        "--sample-weight",
        default=None,
        help="a .npy file of one weight per sample, split by rank like --input, or a pattern with {rank}",
    )
    kmeans.add_argument("--backend", choices=("auto", "torch", "daal4py"), default="auto")
    kmeans.add_argument("--init", default="k-means++", help="k-means++, k-means||, random, or a .npy file of centres")
    kmeans.add_argument("--max-iter", type=number(int, 1), default=300)
    kmeans.add_argument("--tol", type=number(float, 0), default=1e-4)
    kmeans.add_argument("--seed", type=int, default=0)
    kmeans.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    kmeans.add_argument(
        "--chunk-size", type=number(int, 1), default=None, help="rows scored at a time (default from memory)"
    )
    kmeans.add_argument(
        "--warm-up",
        action="store_true",
        help="first fit each rank's first rows once, untimed: no first-call cost (numba's loading, the first "
        "collectives) in the timings, as dlscale bench kmeans's scaling runs",
    )
    kmeans.add_argument("--out", default="runs/kmeans")
    kmeans.set_defaults(handler=_kmeans)
