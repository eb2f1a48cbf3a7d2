"""``dlscale plan``: a sweep turned into an allocation request, and the next size up predicted."""

from __future__ import annotations

import argparse
from typing import Any

from dlscale.cli.options import number
from dlscale.scaling.sites import SITES


def _plan(args: argparse.Namespace) -> int:
    from dlscale.scaling.plan import cost_rows, format_plan, links_for, predict_next, recommend, save_plan

    rows = cost_rows(args.paths, args.target_r2)
    choice = recommend(rows, args.deadline_hours, args.budget_node_hours)
    site, error = links_for(rows, args.allreduce, args.site)
    prediction = predict_next(rows, site, args.overlap, args.noise_scale, error) if site else None
    print(format_plan(rows, choice, prediction))
    if site is None:
        print("(to predict the next size up, pass --allreduce with a dlscale bench allreduce result, or --site)")
    print(f"plan.json and plan.png in {save_plan(rows, choice, prediction, args.out or args.paths[0])}/")
    return 0


def add_plan(commands: Any) -> None:
    plan = commands.add_parser(
        "plan",
        help="a sweep turned into an allocation request: time and node-hours to a target, the next size up",
        description="Read a sweep's run directories (as dlscale report does): each run's wall time to the target R², "
        "node-hours and GPU-hours; recommend the cheapest run that meets the deadline and the budget; "
        "predict the next size up (twice the nodes) from the alpha-beta model and the gradient noise "
        "scale, with a range. Writes plan.json and plan.png (fastest against cheapest).",
    )
    plan.add_argument("paths", nargs="+", metavar="PATH")
    plan.add_argument("--target-r2", type=number(float, high=1), default=0.9)
    plan.add_argument("--deadline-hours", type=number(float, 0, above=True), default=None)
    plan.add_argument("--budget-node-hours", type=number(float, 0, above=True), default=None)
    plan.add_argument(
        "--allreduce",
        default=None,
        metavar="JSON",
        help="allreduce.json of dlscale bench allreduce on this system: fit the model's alpha and beta",
    )
    plan.add_argument(
        "--site", choices=sorted(SITES), default=None, help="use this site's published links instead of a fit"
    )
    plan.add_argument(
        "--overlap", type=number(float, 0, 1), default=0.0, help="share of the communication hidden (the breakdown's)"
    )
    plan.add_argument(
        "--noise-scale",
        type=number(float, 0, above=True),
        default=None,
        help="B_noise (default: what the largest run measured)",
    )
    plan.add_argument("--out", default=None, help="folder for plan.json and plan.png (default: the first PATH)")
    plan.set_defaults(handler=_plan)
