"""``dlscale report``: a sweep's run folders as a table of efficiency and time to a target."""

from __future__ import annotations

import argparse
from typing import Any

from dlscale.cli.options import number


def _report(args: argparse.Namespace) -> int:
    from dlscale.reporting.report import collect, format_report, write_report

    rows = collect(args.paths, target_r2=args.target_r2)
    print(format_report(rows, args.target_r2))
    out = write_report(rows, args.out or args.paths[0])
    print(f"report.csv and report.png in {out}/")
    return 0


def add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="a scaling sweep's run directories as a table and a plot",
        description="Collect run directories (any folder with a summary.json, searched below each PATH) into a "
        "table: nodes, ranks, global batch, samples/s, efficiency relative to the group's smallest "
        "run, final R², and training time to a target R². Writes report.csv and report.png.",
    )
    report.add_argument("paths", nargs="+", metavar="PATH")
    report.add_argument("--target-r2", type=number(float, high=1), default=0.9)
    report.add_argument("--out", default=None, help="folder for report.csv and report.png (default: the first PATH)")
    report.set_defaults(handler=_report)
