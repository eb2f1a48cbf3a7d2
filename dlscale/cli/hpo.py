"""``dlscale hpo start|worker|show``: Optuna searches, their workers and their results."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dlscale.cli.options import name_and_overrides, number


def _hpo_start(args: argparse.Namespace) -> int:
    from dlscale.hpo.local_search import SearchStopped, run_search

    args.space, args.overrides = name_and_overrides(args.space, args.overrides)
    # (only the options given: an existing study keeps its own, and a different one given is refused by name)
    given = {
        key: getattr(args, key)
        for key in ("sampler", "pruner", "seed", "storage", "grace_s", "ranks_per_node", "threads")
        if getattr(args, key) is not None
    }
    try:
        settings = run_search(args.dir, args.space, args.trials, args.workers, args.overrides, **given)
    except SearchStopped as stopped:  # (asked for, not an error: the status says which signal, as a shell's does)
        print(f"dlscale: {stopped}", file=sys.stderr)
        return 128 + stopped.signum
    if args.workers:
        return _hpo_show(args)
    print(
        f"study {settings.name!r} ready in {args.dir} ({settings.trials} trials); start workers with "
        f"`dlscale hpo worker --dir {args.dir}` (slurm/*/hpo.sbatch runs them as a job array)"
    )
    return 0


def _hpo_worker(args: argparse.Namespace) -> int:
    from dlscale.hpo.worker import run_worker

    ran = run_worker(args.dir, args.overrides, max_trials=args.max_trials, quiet=not args.verbose)
    print(f"worker done: trials {', '.join(map(str, ran)) or 'none'}")
    return 0


def _hpo_show(args: argparse.Namespace) -> int:
    from dlscale.hpo.results import best_trial, format_trials, save_optuna_plots, trial_rows
    from dlscale.hpo.study import read_settings

    metric = read_settings(args.dir).search_space.metric
    print(format_trials(trial_rows(args.dir), metric))
    best = best_trial(args.dir)
    print(f"best: trial {best['trial']}, {metric} {best['value']:.4f}, {best['params']} ({best['run_dir']})")
    written = save_optuna_plots(args.dir)
    print(f"plots: {', '.join(p.name for p in written)} in {args.dir}/")
    if getattr(args, "rerun", False):
        from dlscale.hpo.local_search import rerun_best

        stored, again = rerun_best(args.dir)
        print(f"re-run of trial {best['trial']}: {metric} {again:.6f} (the study's: {stored:.6f})")
    return 0


def add_hpo(commands: Any) -> None:
    hpo = commands.add_parser(
        "hpo",
        help="hyperparameter search with Optuna: pruned trials, workers, Slurm arrays",
        description="A study lives in a folder (--dir): study.json, the journal of its trials, "
        "and each trial's run directory under trials/. See lesson 12.",
    )
    sub = hpo.add_subparsers(dest="hpo_command", required=True, metavar="ACTION")
    start = sub.add_parser(
        "start",
        help="create a study (or resume the one in --dir) and run workers on it",
        description="SPACE is a shipped search space or a YAML file; without it the study in "
        "--dir resumes (its trials kept; --trials may raise the count).",
    )
    start.add_argument("space", nargs="?", default=None, metavar="SPACE")
    start.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="for every trial, e.g. device=cuda")
    start.add_argument("--dir", default="runs/hpo", help="the study's folder")
    start.add_argument(
        "--trials", type=number(int, 1), default=None, help="trials to finish, complete or pruned (default 12)"
    )
    start.add_argument(
        "--workers", type=number(int, 0), default=2, help="worker processes here (0: only create the study)"
    )
    start.add_argument("--sampler", choices=("tpe", "random", "grid"), default=None, help="default tpe")
    start.add_argument(
        "--pruner", choices=("hyperband", "halving", "median", "none"), default=None, help="default hyperband"
    )
    start.add_argument("--seed", type=int, default=None, help="default 0")
    start.add_argument("--storage", default=None, help="an RDB URL (default: the journal file in --dir)")
    start.add_argument(
        "--grace-s",
        type=number(float, 0, above=True),
        default=None,
        help="a running trial silent this long is failed and retried (its worker died; default 20)",
    )
    start.add_argument(
        "--ranks-per-node",
        type=number(int, 1),
        default=None,
        help="ranks (GPUs) per node, for node-hours: a trial costs its seconds x its ranks / this (default 1)",
    )
    start.add_argument(
        "--threads",
        type=number(int, 0),
        default=None,
        help="torch threads per trial (default: what each worker was given), kept in each config",
    )
    start.set_defaults(handler=_hpo_start)
    worker = sub.add_parser("worker", help="one worker: ask, train, tell until the study has its trials")
    worker.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    worker.add_argument("--dir", required=True)
    worker.add_argument("--max-trials", type=number(int, 1), default=None)
    worker.add_argument("--verbose", action="store_true", help="print each trial's training, not only its result")
    worker.set_defaults(handler=_hpo_worker)
    show = sub.add_parser("show", help="the trials, the best one, and Optuna's plots as PNGs")
    show.add_argument("--dir", required=True)
    show.add_argument("--rerun", action="store_true", help="train the best trial again and compare")
    show.set_defaults(handler=_hpo_show)
