"""The ``dlscale`` command: train, data, exercises, recipes, lessons, bench, kmeans, export, report, plan, project,
experiment, hpo, info (``dlscale --help`` lists them; ``dlscale --version``).

Every subcommand calls the package; nothing here computes. Errors that a user can fix
(a bad key, a missing file, no GPU) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import re
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

from dlscale.config import SECTION_KEYS, config_names, describe_field, load_config
from dlscale.errors import DlscaleError, RangeError, check_range
from dlscale.scaling.sites import SITES

TRAIN_EPILOG = """\
CONFIG is a shipped config ({names}) or a YAML file; without one the defaults apply.
Configs are YAML files listing only what differs from the config they 'inherit'.
Overrides are key=value, typed against the field; an unknown key is an error.

examples:
  dlscale train demo
  dlscale train tiny epochs=2 global_batch_size=128
  dlscale train my.yaml run_dir=runs/trial resume=true

exit status: 0 done, 2 bad config or data, {preempted} stopped on SIGTERM/SIGUSR1 after a checkpoint

keys:
{keys}
"""


def _name_and_overrides(name: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """An optional NAME before KEY=VALUE overrides: `dlscale train epochs=2` names no config, only an override."""
    if name is not None and "=" in name and not Path(name).exists():
        return None, [name, *overrides]
    return name, list(overrides)


def _train(args: argparse.Namespace) -> int:
    from dlscale.training.loop import train
    from dlscale.training.preemption import PREEMPTED_EXIT_CODE

    config, overrides = _name_and_overrides(args.config, args.overrides)
    result = train(load_config(config, overrides))
    return PREEMPTED_EXIT_CODE if result.preempted else 0


def _export(args: argparse.Namespace) -> int:
    import torch

    from dlscale.checkpoint import load_model
    from dlscale.config import load_config

    model = load_model(args.run_dir)
    config = load_config(str(Path(args.run_dir) / "config.yaml")).to_dict()
    folder = Path(args.out).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise DlscaleError(f"{args.out} cannot be written: {folder} is not a folder you can write; create it, "
                           f"or name another OUT")
    torch.save({"model": model.state_dict(), "config": config}, args.out)
    print(f"wrote the whole model of {args.run_dir} ({sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{config['model']}) to {args.out}; load it with torch.load(path, weights_only=True)")
    return 0


def _data_generate(args: argparse.Namespace) -> int:
    from dlscale.data import FieldSpec, generate_dataset

    cfg = load_config(args.config, args.overrides)
    manifest = generate_dataset(args.out, FieldSpec(image_size=cfg.image_size, noise=cfg.noise), cfg.train_samples,
                                cfg.val_samples, cfg.shard_size, seed=cfg.seed, progress=cfg.progress)
    speed = manifest["generation"]
    print(f"wrote {cfg.train_samples} training and {cfg.val_samples} validation maps of "
          f"{cfg.image_size}x{cfg.image_size} to {args.out} in {speed['seconds']:.2f} s "
          f"({speed['samples_per_s']:,.0f} maps/s)")
    return 0


def _data_check(args: argparse.Namespace) -> int:
    from dlscale.data import DataError, ShardDataset, non_finite_values
    from dlscale.data.loader import check_splits

    bad, splits = [], []
    for split in ("train", "val"):
        dataset = ShardDataset(f"{args.data_dir}/{split}")
        splits.append(dataset)
        damaged = [(path, count) for path in (*dataset.x_paths, *dataset.y_paths)
                   if (count := non_finite_values(path))]
        for path, count in damaged:
            print(f"{split}: {path} holds {count:,} NaN or infinite value(s)")
        bad += damaged
        print(f"{split}: {len(dataset)} maps of shape {dataset.input_shape}, {dataset.num_targets} targets, "
              f"{len(dataset.x_paths)} shards: {'NOT ok' if damaged else 'ok'}")
    check_splits(*splits, args.data_dir)
    if bad:
        raise DataError(f"{len(bad)} shard file(s) in {args.data_dir} hold NaN or infinite values (listed above); "
                        f"regenerate or clean them before training, since one such map makes the loss NaN")
    return 0


def _exercises(args: argparse.Namespace) -> int:
    from dlscale.lessons.exercises import generate

    return _generated(generate(args.solutions, args.exercises, check=args.check, lessons=args.notebooks), args.check,
                      "exercise notebook", "exercises")


def _recipes(args: argparse.Namespace) -> int:
    from dlscale.lessons.recipes import write_recipes

    return _generated(write_recipes(Path(args.notebooks), Path(args.recipes), check=args.check), args.check,
                      "recipe file", "recipes")


def _lessons_reset(args: argparse.Namespace) -> int:
    from dlscale.lessons.reset import reset_lesson

    removed = reset_lesson(args.lesson, args.runs)
    for path in removed:
        print(f"removed {path}")
    print(f"lesson {args.lesson} starts over: {len(removed)} run folder(s) or file(s) removed from {args.runs}/ "
          f"(your stage files, my_*.py, kept)" if removed else f"lesson {args.lesson} has no runs in {args.runs}/")
    return 0


def _generated(changed: list[Path], check: bool, kind: str, command: str) -> int:
    """What a generator wrote, or with ``check`` what is out of date (exit status 1 if anything is)."""
    if check:
        for path in changed:
            print(f"{path} is out of date: run `dlscale {command}`", file=sys.stderr)
        return 1 if changed else 0
    print(f"wrote {len(changed)} {kind}(s)" + "".join(f"\n  {p}" for p in changed))
    return 0


def _bench_optim(args: argparse.Namespace) -> int:
    from dlscale.bench.optimizers import bench_optimizers, comparison_lines, format_rows, timm_optimizers

    if timm_optimizers() is None:
        print("timm is not installed: comparing with torch's optimizers only "
              "(pip install --no-deps timm adds timm's Lamb and Lars)")
    rows = bench_optimizers(args.models.split(","), steps=args.steps, rounds=args.rounds, device=args.device)
    print(format_rows(rows))
    print("\n".join(comparison_lines(rows)))
    return 0


def _bench_ladder(args: argparse.Namespace) -> int:
    from dlscale.bench.ladder import bench_ladder, format_ladder

    rows = bench_ladder(load_config(args.config, args.overrides), steps=args.steps, out_dir=args.out,
                        rounds=args.rounds)
    print(format_ladder(rows))
    print(f"ladder.json and ladder.png in {args.out}/")
    return 0


def _bench_parity(args: argparse.Namespace) -> int:
    from dlscale.bench.parity import SINGLE_PROCESS, format_parity, time_stage

    stages = {name[:2]: name for name in SINGLE_PROCESS}
    unknown = [number for number in args.stages.split(",") if number.strip() not in stages]
    if unknown:
        print(f"dlscale bench parity: --stages: no single-process stage {', '.join(unknown)}; the stages are "
              f"{', '.join(stages)}", file=sys.stderr)
        return 2
    rows = [time_stage(stages[number.strip()], rounds=args.rounds, config=args.config, epochs=args.epochs)
            for number in args.stages.split(",")]
    print(format_parity(rows))
    return 0


def _bench_loader(args: argparse.Namespace) -> int:
    from dlscale.bench.loader import bench_loader

    report = bench_loader(load_config(args.config, args.overrides), batches=args.batches)
    print(f"input pipeline alone: {report['samples_per_s']:,.0f} samples/s over {report['batches']} batches of "
          f"{report['batch_size']} (workers {report['num_workers']}, pinned memory {report['pin_memory']})")
    return 0


def _bench_allreduce(args: argparse.Namespace) -> int:
    from dlscale import distributed
    from dlscale.bench.allreduce import ALLREDUCE_SIZES, bench_allreduce, format_allreduce, save_allreduce
    from dlscale.jobs.local_ranks import horovodrun_command, run_local, torchrun_command

    if distributed.detect_launcher() == "single":
        if args.nproc < 2:
            raise distributed.DistributedError("bench allreduce needs several ranks: pass --nproc N (N >= 2), or run "
                                               "it under torchrun, srun, mpirun or horovodrun")
        forwarded = ["dlscale", "bench", "allreduce", "--max-mib", str(args.max_mib), "--out", args.out,
                     "--device", args.device, "--rounds", str(args.rounds)] + (["--horovod"] if args.horovod else [])
        start = horovodrun_command if args.horovod else torchrun_command
        return run_local(start(args.nproc, forwarded), "bench allreduce", capture=False).returncode
    sizes = [s for s in ALLREDUCE_SIZES if s <= args.max_mib * 2 ** 20]
    rows = bench_allreduce(sizes, device=args.device, data_parallel="horovod" if args.horovod else "auto",
                           rounds=args.rounds)
    if distributed.is_main():
        print(format_allreduce(rows))
        print(f"allreduce.json and allreduce.png in {save_allreduce(rows, args.out)}/")
    distributed.shutdown()
    return 0


def _kmeans(args: argparse.Namespace) -> int:
    from dlscale.kmeans.command import run

    run(args)
    return 0


def _report(args: argparse.Namespace) -> int:
    from dlscale.reporting.report import collect, format_report, write_report

    rows = collect(args.paths, target_r2=args.target_r2)
    print(format_report(rows, args.target_r2))
    out = write_report(rows, args.out or args.paths[0])
    print(f"report.csv and report.png in {out}/")
    return 0


def _bench_kmeans(args: argparse.Namespace) -> int:
    from dlscale.bench.kmeans import bench_kmeans, format_kmeans

    rows = bench_kmeans(n=args.n, d=args.d, k=args.k, iterations=args.iters, procs=args.procs,
                        out_dir=args.out, rounds=args.rounds, kinds=tuple(args.kinds.split(",")),
                        photo_k=tuple(args.photo_k))
    print(format_kmeans(rows))
    print(f"kmeans.json and kmeans.png in {args.out}/")
    return 0


def _bench_memory(args: argparse.Namespace) -> int:
    from dlscale.bench.memory import bench_memory, format_memory

    rows = bench_memory(load_config(args.config, args.overrides), steps=args.steps, out_dir=args.out)
    print(format_memory(rows))
    print(f"memory.json in {args.out}/ (per rank: the largest rank's figures; peak = CUDA's allocator peak on a GPU, "
          f"the process's peak resident set on a CPU)")
    return 0


def _bench_scaling(args: argparse.Namespace) -> int:
    from dlscale.bench.scaling import bench_scaling, format_scaling

    rows = bench_scaling(load_config(args.config, args.overrides), procs=args.procs, steps=args.steps, out_dir=args.out)
    print(format_scaling(rows))
    print(f"scaling.json and scaling.png in {args.out}/")
    return 0


def _bench_breakdown(args: argparse.Namespace) -> int:
    from dlscale.bench.breakdown import bench_breakdown, format_breakdown, local_runner, slurm_runner
    from dlscale.runtime.threads import fair_threads

    cfg = load_config(args.config, args.overrides)
    sizes = args.sizes
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not args.slurm and max(sizes) > cpus:  # (local ranks beyond the CPUs measure contention, not scaling)
        raise RangeError(f"--sizes {max(sizes)}: this process has {cpus} CPU(s), so at most {cpus} local ranks; "
                         f"use --slurm SCRIPT for nodes")
    runner = (slurm_runner(cfg, args.slurm, dict(os.environ), args.tasks_per_node) if args.slurm
              else local_runner(cfg, args.threads or fair_threads(max(sizes))))
    result = bench_breakdown(cfg, sizes, runner, steps=args.steps,
                             rounds=args.rounds, buckets=args.buckets,
                             static_graph=args.static_graph, unit="nodes" if args.slurm else "ranks",
                             ranks_per_unit=args.tasks_per_node if args.slurm else 1, out_dir=args.out)
    print(format_breakdown(result))
    print(f"breakdown.json and breakdown.png in {args.out}/")
    return 0


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


def _project(args: argparse.Namespace) -> int:
    from dlscale.reporting.plots import efficiency_projection
    from dlscale.scaling.projection import (
        RESNET50_PARAMETERS,
        Workload,
        assumptions,
        format_projection,
        overlap_from_breakdown_file,
        project,
    )
    from dlscale.scaling.sites import SITES, load_machine, machine

    site = load_machine(args.machine) if args.machine else SITES[args.site]
    custom = (args.gpus_per_node, args.inside_gbs, args.between_gbs, args.inside_latency_us, args.between_latency_us)
    if any(value is not None for value in custom):  # the given figures replace the site's (or the file's)
        site = machine(f"{site.name}, with figures entered", args.gpus_per_node or site.gpus_per_node,
                       args.inside_gbs or site.inside.bandwidth / 1e9, args.between_gbs or site.between.bandwidth / 1e9,
                       site.inside.alpha * 1e6 if args.inside_latency_us is None else args.inside_latency_us,
                       site.between.alpha * 1e6 if args.between_latency_us is None else args.between_latency_us,
                       f"entered on the command line; the rest from {site.source}")
    if args.samples_per_s:
        per_sample, source = 1 / args.samples_per_s, f"{args.samples_per_s:g} samples/s measured on one GPU"
    elif args.step_ms:
        per_sample, source = args.step_ms / 1000 / args.batch, f"a step of {args.step_ms:g} ms at batch {args.batch}"
    else:
        per_sample, source = args.ms_per_sample / 1000, "entered on the command line"
    overlap = args.overlap
    if args.breakdown:  # (measured on this site: the exposed share of what the model says the step sends)
        overlap, where = overlap_from_breakdown_file(args.breakdown, site)
        print(f"overlap: {where}")
    workload = Workload(args.name, args.parameters or RESNET50_PARAMETERS, per_sample, args.batch,
                        args.bytes_per_value, args.layout, overlap, source, args.backward_share,
                        args.bucket_mb or None, args.algorithm)
    rows = project(workload, site, baseline=args.baseline)
    print(format_projection(rows))
    print("\nassumptions:\n" + assumptions(workload, site, args.baseline))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    efficiency_projection({workload.name: rows}, assumptions(workload, site, args.baseline)).savefig(
        Path(args.out) / "projection.png", dpi=120)
    print(f"projection.png in {args.out}/")
    return 0


def _experiment_large_batch(args: argparse.Namespace) -> int:
    from dlscale.bench.large_batch import format_table, large_batch_sweep

    rows = large_batch_sweep(args.out, size=args.size, recipes=args.recipes.split(",") if args.recipes else None)
    print(format_table(rows))
    print(f"table and figure in {args.out}/ (table.md, table.csv, sweep.png)")
    return 0


def _info(args: argparse.Namespace) -> int:
    from dlscale.jobs.environment import report, task_line

    print(task_line() if args.task else report(), flush=True)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line said in one line (not the usage block, then the error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:  # (a command mistyped: the nearest one, as git says it)
            import difflib

            choices = re.findall(r"'?([\w-]+)'?", wrong[2])
            near = difflib.get_close_matches(wrong[1], choices, n=1)
            message = f"{message.split(':')[0]}: no command {wrong[1]!r}" + (f"; did you mean {near[0]!r}?" if near
                                                                            else f" (commands: {', '.join(choices)})")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, low: float | None = None, high: float | None = None, above: bool = False) -> Any:
    """An argparse type: a number of ``kind`` in its range, else argparse's one line naming the argument
    ("argument --batch: must be at least 1, not -64")."""
    def parse(text: str) -> float:
        try:
            value = _whole(text) if kind is int and _WHOLE_IN_FLOAT.fullmatch(text.strip()) else kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{'a whole number' if kind is int else 'a number'} is needed, "
                                             f"not {text!r}") from None
        try:
            return check_range("it", value, low, high, above=above)
        except RangeError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("it ")) from None
    return parse


#: A whole number written as a float (25.6e6, 1e9): taken as an int where it is whole.
_WHOLE_IN_FLOAT = re.compile(r"[+-]?\d+(\.\d*)?[eE][+]?\d+")


def _whole(text: str) -> int:
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


def _sizes(text: str) -> list[int]:
    """``--sizes 1,2,4``: whole numbers of ranks or nodes, each at least 1."""
    return [_number(int, 1)(part) for part in text.split(",")]


def _counts_or_none(text: str) -> list[int]:
    """``--procs 1,2`` (process counts, each at least 1), or ``''`` for none."""
    return _sizes(text) if text.strip() else []


def _positive_list(text: str) -> list[float]:
    """``--buckets 1,25``: numbers above 0 (an empty entry is skipped)."""
    return [_number(float, above=True, low=0)(part) for part in text.split(",") if part.strip()]


#: A measured stretch needs steps after the 5 that warm up (and the profiled window's own).
MIN_MEASURED_STEPS = 10


def _config_arguments(parser: argparse.ArgumentParser, default: str | None = "demo") -> None:
    """The ``[CONFIG] [key=value ...]`` arguments that every training-based command takes."""
    parser.add_argument("config", nargs="?", default=default,
                        help="config name or YAML path" + (f" (default {default})" if default else ""))
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def _add_train(commands: Any) -> None:
    from dlscale.training.preemption import PREEMPTED_EXIT_CODE

    keys = "\n".join(f"{name}:\n" + "\n".join(textwrap.fill(describe_field(k), 100, initial_indent="  ",
                                                              subsequent_indent="      ") for k in section_keys)
                     for name, section_keys in SECTION_KEYS.items())
    train = commands.add_parser(
        "train", help="train the model on the synthetic maps (or your shards)",
        description="Train with the one training loop; metrics, plots and checkpoints go to the run directory.",
        epilog=TRAIN_EPILOG.format(names=", ".join(config_names()), keys=keys, preempted=PREEMPTED_EXIT_CODE),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_arguments(train, default=None)
    train.set_defaults(handler=_train)


def _add_data(commands: Any) -> None:
    data = commands.add_parser("data", help="generate or check a data folder")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    generate = data_commands.add_parser(
        "generate", help="write the synthetic mini-CosmoFlow maps as shards",
        description="Generate the synthetic maps into OUT. Sizes come from the config and its overrides "
                    "(image_size, train_samples, val_samples, shard_size, noise, seed).",
        epilog="example: dlscale data generate --out data/big image_size=64 train_samples=65536")
    generate.add_argument("--out", required=True, help="folder to create")
    generate.add_argument("--config", default=None, help="config name or YAML path for the sizes")
    generate.add_argument("overrides", nargs="*", metavar="key=value")
    generate.set_defaults(handler=_data_generate)
    check = data_commands.add_parser("check", help="open every shard of a data folder and report damaged, "
                                                   "mismatched and non-finite (NaN, inf) ones")
    check.add_argument("data_dir")
    check.set_defaults(handler=_data_check)


def _add_exercises(commands: Any) -> None:
    exercises = commands.add_parser("exercises", help="generate exercises/ from solutions/",
                                    description="Replace each '# BEGIN SOLUTION ... # END SOLUTION' fence in "
                                                "solutions/*.ipynb by a stub and write exercises/.")
    exercises.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    exercises.add_argument("--solutions", default="solutions")
    exercises.add_argument("--notebooks", default="notebooks", help="the lessons whose attendee cells it fills")
    exercises.add_argument("--exercises", default="exercises")
    exercises.set_defaults(handler=_exercises)


def _add_recipes(commands: Any) -> None:
    recipes = commands.add_parser("recipes", help="write recipes/ from the lessons' recipe cells",
                                  description="Write each notebook cell tagged 'recipe' (first line "
                                              "'# recipes/NAME.py') to recipes/NAME.py, as a script.")
    recipes.add_argument("--check", action="store_true", help="only report recipe files that are out of date")
    recipes.add_argument("--notebooks", default="notebooks")
    recipes.add_argument("--recipes", default="recipes")
    recipes.set_defaults(handler=_recipes)


def _add_lessons(commands: Any) -> None:
    lessons = commands.add_parser("lessons", help="the lessons' runs: start one over",
                                  description="Act on a lesson's runs (the folders runs/lessonNN and runs/lessonNN_*).")
    actions = lessons.add_subparsers(dest="lessons_command", required=True, metavar="ACTION")
    reset = actions.add_parser("reset", help="remove one lesson's runs, so that it starts over; nothing else",
                               description="Remove runs/lessonNN and runs/lessonNN_* (the attendee's stage files "
                                           "my_*.py are kept); no other folder is touched.")
    reset.add_argument("lesson", help="the lesson's two digits, e.g. 05")
    reset.add_argument("--runs", default="runs", help="the runs folder (default: runs)")
    reset.set_defaults(handler=_lessons_reset)


def _add_bench_optim(bench_commands: Any) -> None:
    optim = bench_commands.add_parser("optim", help="optimizer step time: LAMB, LARS, AdamW, SGD (and timm's)",
                                      description="Time optimizer.step() of each optimizer in turns, on the lesson "
                                                  "model and a ~25 M parameter model, and print ratios to AdamW.")
    optim.add_argument("--models", default="lesson,25M", help="comma-separated: lesson, 25M")
    optim.add_argument("--steps", type=_number(int, 1), default=10, help="steps per timed round")
    optim.add_argument("--rounds", type=_number(int, 1), default=5, help="rounds (the median is reported)")
    optim.add_argument("--device", default="cpu", help="cpu or cuda")
    optim.set_defaults(handler=_bench_optim)


def _add_bench_ladder(bench_commands: Any) -> None:
    ladder = bench_commands.add_parser(
        "ladder", help="the optimization ladder: each rung adds one speed-up, all measured in one run",
        description="fp32 baseline -> loader workers and pinned memory -> channels_last -> mixed precision -> "
                    "fused optimizer -> torch.compile -> CUDA graphs (GPU only); prints samples/s and speedups, "
                    "writes ladder.json and ladder.png.")
    _config_arguments(ladder)
    ladder.add_argument("--steps", type=_number(int, MIN_MEASURED_STEPS), default=60, help="training steps per rung")
    ladder.add_argument("--rounds", type=_number(int, 1), default=1, help="train every rung this many times, in turns (median)")
    ladder.add_argument("--out", default="runs/ladder")
    ladder.set_defaults(handler=_bench_ladder)


def _add_bench_loader(bench_commands: Any) -> None:
    loader = bench_commands.add_parser("loader", help="samples/s of the input pipeline alone (no model)")
    _config_arguments(loader)
    loader.add_argument("--batches", type=_number(int, 1), default=50)
    loader.set_defaults(handler=_bench_loader)


def _add_bench_allreduce(bench_commands: Any) -> None:
    allreduce = bench_commands.add_parser(
        "allreduce", help="all-reduce time and bus bandwidth, 4 KiB to 256 MiB",
        description="Time the all-reduce over message sizes on the active backend (torch.distributed with gloo "
                    "on CPUs and NCCL on GPUs, or Horovod with --horovod) and report the algorithm and bus "
                    "bandwidth (bus = 2(n-1)/n x bytes/time, as nccl-tests). Run it under torchrun/srun/mpirun/"
                    "horovodrun, or with --nproc N for N local processes.")
    allreduce.add_argument("--nproc", type=_number(int, 1), default=2, help="local processes when not launched by a launcher")
    allreduce.add_argument("--max-mib", type=_number(float, 0, above=True), default=256, help="largest message in MiB")
    allreduce.add_argument("--device", default="auto")
    allreduce.add_argument("--horovod", action="store_true",
                           help="time Horovod's all-reduce (local ranks start under horovodrun --gloo)")
    allreduce.add_argument("--rounds", type=_number(int, 1), default=1, help="the sizes take turns this many times (median)")
    allreduce.add_argument("--out", default="runs/allreduce")
    allreduce.set_defaults(handler=_bench_allreduce)


def _add_bench_scaling(bench_commands: Any) -> None:
    scaling = bench_commands.add_parser(
        "scaling", help="weak and strong scaling of the training over local processes",
        description="Train at each process count under torchrun: strong scaling keeps the global batch, weak "
                    "scaling keeps the per-rank batch. Prints throughput, speedup and efficiency.")
    _config_arguments(scaling)
    scaling.add_argument("--procs", type=_sizes, default=[1, 2], help="comma-separated process counts (default 1,2)")
    scaling.add_argument("--steps", type=_number(int, MIN_MEASURED_STEPS), default=60)
    scaling.add_argument("--out", default="runs/scaling")
    scaling.set_defaults(handler=_bench_scaling)


def _add_bench_breakdown(bench_commands: Any) -> None:
    breakdown = bench_commands.add_parser(
        "breakdown", help="where the scaling efficiency goes: exposed I/O, exposed communication, the rest",
        description="At each size train the same step (weak scaling) as it runs, with the data already in memory, "
                    "with every rank alone (no communication) and with other DDP bucket sizes, in turns over rounds; "
                    "split the lost efficiency into exposed I/O, exposed communication and the rest. Local ranks "
                    "under torchrun, or nodes through a Slurm script with --slurm. Writes breakdown.json and "
                    "breakdown.png.")
    _config_arguments(breakdown)
    breakdown.add_argument("--sizes", type=_sizes, default=[1, 2], help="comma-separated ranks (or nodes with --slurm)")
    breakdown.add_argument("--steps", type=_number(int, MIN_MEASURED_STEPS), default=150, help="steps per run (the first 5 are not timed)")
    breakdown.add_argument("--rounds", type=_number(int, 1), default=2, help="every way runs once per round, in turns (median)")
    breakdown.add_argument("--buckets", type=_positive_list, default=[1.0],
                           help="other bucket_cap_mb values to try (comma-separated; default 1)")
    breakdown.add_argument("--static-graph", action="store_true", help="also set static_graph in the bucket runs")
    breakdown.add_argument("--threads", type=_number(int, 0), default=0, help="torch threads per rank (0 = the CPUs shared)")
    breakdown.add_argument("--slurm", default=None, metavar="SCRIPT",
                           help="submit each run as a job of SIZE nodes with this script (slurm/SITE/train.sbatch)")
    breakdown.add_argument("--tasks-per-node", type=_number(int, 1), default=1, help="with --slurm: ranks per node")
    breakdown.add_argument("--out", default="runs/breakdown")
    breakdown.set_defaults(handler=_bench_breakdown)


def _add_bench_memory(bench_commands: Any) -> None:
    memory = bench_commands.add_parser(
        "memory", help="bytes each rank holds under DDP, FSDP and tensor parallelism, and the step time",
        description="Train a few steps of the same model as 1 process, DDP and FSDP on 2 and 4 ranks, FSDP with "
                    "activation checkpointing, and FSDP x tensor parallel 2x2 (local processes under torchrun). "
                    "Prints per rank the parameter, gradient and optimizer-state bytes counted from the tensors it "
                    "holds, the peak memory and the step time, with the ratios to DDP on as many ranks.")
    _config_arguments(memory, default="vit")
    memory.add_argument("--steps", type=_number(int, MIN_MEASURED_STEPS), default=10, help="steps per layout (the first 5 are not timed)")
    memory.add_argument("--out", default="runs/memory")
    memory.set_defaults(handler=_bench_memory)


def _add_bench_kmeans(bench_commands: Any) -> None:
    kmeans_bench = bench_commands.add_parser(
        "kmeans", help="K-Means: dlscale-torch, daal4py and scikit-learn side by side, and 1-vs-2-process scaling",
        description="Fit the same data from the same initial centres with each engine, on blobs, on noise and on a "
                    "photo's colours, for the first iterations and to convergence, and print iterations, inertia, "
                    "seconds and the ratios to scikit-learn; then strong and weak scaling of the distributed "
                    "backends over local processes (torchrun, mpirun) on the first kind.")
    kmeans_bench.add_argument("--kinds", default="blobs,noise,china,flower,mixture",
                              help="kinds of data: blobs, noise (no clusters), china and flower (a photo's colours), "
                                   "mixture (128 features, 40 overlapping clusters)")
    kmeans_bench.add_argument("--n", type=_number(int, 1), default=1_000_000, help="samples of blobs (noise: 0.4 n)")
    kmeans_bench.add_argument("--d", type=_number(int, 1), default=32, help="features of blobs and noise")
    kmeans_bench.add_argument("--k", type=_number(int, 1), default=64, help="clusters of blobs and noise")
    kmeans_bench.add_argument("--photo-k", type=_sizes, default=[16, 64],
                              help="clusters (colours) of the photos (default 16,64)")
    kmeans_bench.add_argument("--iters", type=_number(int, 1), default=8, help="Lloyd iterations of the first phase")
    kmeans_bench.add_argument("--procs", type=_counts_or_none, default=[1, 2],
                              help="process counts for the scaling runs ('' = none; default 1,2)")
    kmeans_bench.add_argument("--rounds", type=_number(int, 1), default=3, help="fits per engine; the median is reported")
    kmeans_bench.add_argument("--out", default="runs/bench_kmeans")
    kmeans_bench.set_defaults(handler=_bench_kmeans)


def _add_bench_parity(bench_commands: Any) -> None:
    parity = bench_commands.add_parser(
        "parity", help="the engine against the plain recipe: each stage and its engine twin, timed in turns",
        description="Run each single-process stage of recipes/ and its engine twin (dlscale.train with the same "
                    "settings) in turns, in one process on the same data, and print the time of each and their ratio "
                    "(the engine's cost over the plain loop), with the largest loss difference (0: the same steps).")
    parity.add_argument("--stages", default="01,02,03,04", help="comma-separated stage numbers (01, 02, 03, 04)")
    parity.add_argument("--config", default="demo", help="the data set both train on (default demo, the README's run)")
    parity.add_argument("--epochs", type=_number(int, 1), default=3)
    parity.add_argument("--rounds", type=_number(int, 1), default=3, help="timed runs of each, in turns (the median "
                                                                       "is reported)")
    parity.set_defaults(handler=_bench_parity)


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for add in (_add_bench_optim, _add_bench_ladder, _add_bench_loader, _add_bench_allreduce, _add_bench_scaling,
                _add_bench_breakdown, _add_bench_memory, _add_bench_kmeans, _add_bench_parity):
        add(bench_commands)


def _add_kmeans(commands: Any) -> None:
    kmeans = commands.add_parser(
        "kmeans", help="distributed K-Means on .npy/.csv files or an image (colour quantization)",
        description="Cluster each rank's data with dlscale.kmeans.KMeans and write centers.npy, the labels, "
                    "summary.json and, for an image, the quantized picture. Runs alone or under torchrun, "
                    "mpirun -n N or srun; backend auto uses daal4py under MPI on CPUs and torch otherwise.")
    source = kmeans.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs=1, default=[], help="a .npy/.csv file split by rank, or a pattern such as "
                                                            "data_{rank}.npy with one file per rank")
    source.add_argument("--image", help="'sample' (scikit-learn's photo) or an image file: quantize its colours")
    kmeans.add_argument("--k", type=_number(int, 1), default=8, help="clusters (colours for an image)")
    kmeans.add_argument("--sample-weight", default=None, help="a .npy file of one weight per sample, split by rank "
                                                             "like --input, or a pattern with {rank}")
    kmeans.add_argument("--backend", choices=("auto", "torch", "daal4py"), default="auto")
    kmeans.add_argument("--init", default="k-means++", help="k-means++, k-means||, random, or a .npy file of centres")
    kmeans.add_argument("--max-iter", type=_number(int, 1), default=300)
    kmeans.add_argument("--tol", type=_number(float, 0), default=1e-4)
    kmeans.add_argument("--seed", type=int, default=0)
    kmeans.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    kmeans.add_argument("--chunk-size", type=_number(int, 1), default=None, help="rows scored at a time (default from memory)")
    kmeans.add_argument("--out", default="runs/kmeans")
    kmeans.set_defaults(handler=_kmeans)


def _add_export(commands: Any) -> None:
    export = commands.add_parser(
        "export", help="a run's newest checkpoint as one whole model file (also from FSDP/tensor-parallel shards)",
        description="Read the newest checkpoint of RUN_DIR, whatever wrote it (one process, DDP, Horovod, FSDP or "
                    "tensor parallelism on any number of ranks), into one model in this process and save "
                    "{'model': state_dict, 'config': ...} to OUT for evaluation elsewhere.")
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("out", metavar="OUT", nargs="?", default="model.pt")
    export.set_defaults(handler=_export)


def _add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="a scaling sweep's run directories as a table and a plot",
        description="Collect run directories (any folder with a summary.json, searched below each PATH) into a "
                    "table: nodes, ranks, global batch, samples/s, efficiency relative to the group's smallest "
                    "run, final R², and training time to a target R². Writes report.csv and report.png.")
    report.add_argument("paths", nargs="+", metavar="PATH")
    report.add_argument("--target-r2", type=_number(float, high=1), default=0.9)
    report.add_argument("--out", default=None, help="folder for report.csv and report.png (default: the first PATH)")
    report.set_defaults(handler=_report)


def _add_plan(commands: Any) -> None:
    plan = commands.add_parser(
        "plan", help="a sweep turned into an allocation request: time and node-hours to a target, the next size up",
        description="Read a sweep's run directories (as dlscale report does): each run's wall time to the target R², "
                    "node-hours and GPU-hours; recommend the cheapest run that meets the deadline and the budget; "
                    "predict the next size up (twice the nodes) from the alpha-beta model and the gradient noise "
                    "scale, with a range. Writes plan.json and plan.png (fastest against cheapest).")
    plan.add_argument("paths", nargs="+", metavar="PATH")
    plan.add_argument("--target-r2", type=_number(float, high=1), default=0.9)
    plan.add_argument("--deadline-hours", type=_number(float, 0, above=True), default=None)
    plan.add_argument("--budget-node-hours", type=_number(float, 0, above=True), default=None)
    plan.add_argument("--allreduce", default=None, metavar="JSON",
                      help="allreduce.json of dlscale bench allreduce on this system: fit the model's alpha and beta")
    plan.add_argument("--site", choices=sorted(SITES), default=None,
                      help="use this site's published links instead of a fit")
    plan.add_argument("--overlap", type=_number(float, 0, 1), default=0.0, help="share of the communication hidden (the breakdown's)")
    plan.add_argument("--noise-scale", type=_number(float, 0, above=True), default=None, help="B_noise (default: what the largest run measured)")
    plan.add_argument("--out", default=None, help="folder for plan.json and plan.png (default: the first PATH)")
    plan.set_defaults(handler=_plan)


def _add_project(commands: Any) -> None:
    from dlscale.scaling.collectives import ALGORITHMS
    from dlscale.scaling.projection import BASELINES

    project = commands.add_parser(
        "project", help="predicted step time and efficiency of a model from 1 to 1,024 nodes of a site or your cluster",
        description="The alpha-beta model of the layout's collectives (bucket by bucket, the cheapest algorithm "
                    "between nodes) on a site's published links or your own machine's, plus one GPU's measured "
                    "compute, with the share of communication hidden behind the backward pass (dlscale bench "
                    "breakdown measures it; it never hides more than the backward pass). Prints the table and the "
                    "assumptions; writes projection.png.")
    where = project.add_argument_group("the machine: a site, a YAML file, or figures that replace theirs")
    where.add_argument("--site", choices=sorted(SITES), default="perlmutter")
    where.add_argument("--machine", default=None, metavar="YAML",
                       help="your cluster: gpus_per_node, inside and between (bandwidth_gbs, latency_us), source")
    where.add_argument("--gpus-per-node", type=_number(int, 1), default=None)
    where.add_argument("--inside-gbs", type=_number(float, 1e-6, 1e6), default=None,
                       help="GB/s per direction between the GPUs of a node")
    where.add_argument("--between-gbs", type=_number(float, 1e-6, 1e6), default=None,
                       help="each GPU's share of the network between nodes, GB/s per direction")
    where.add_argument("--inside-latency-us", type=_number(float, 0), default=None)
    where.add_argument("--between-latency-us", type=_number(float, 0), default=None)
    compute = project.add_argument_group("one GPU's compute, measured (one of these)")
    given = compute.add_mutually_exclusive_group(required=True)
    given.add_argument("--samples-per-s", type=_number(float, 0, above=True), default=None,
                       help="one GPU's training throughput (a published figure, or dlscale train's)")
    given.add_argument("--step-ms", type=_number(float, 0, above=True), default=None,
                       help="one GPU's step time at --batch, in ms")
    given.add_argument("--ms-per-sample", type=_number(float, 0, above=True), default=None,
                       help="one GPU's compute per sample, in ms")
    project.add_argument("--name", default="ResNet-50-sized gradient")
    project.add_argument("--parameters", type=_number(int, 1, 10**14), default=None,
                         help="parameter count, 1 to 1e14 (default: ResNet-50's 25.6 M)")
    project.add_argument("--batch", type=_number(int, 1), default=64, help="batch per GPU")
    project.add_argument("--bytes-per-value", type=_number(int, 1, 8), default=4, help="4 for fp32 gradients, 2 for bf16")
    project.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp")
    hidden = project.add_mutually_exclusive_group()
    hidden.add_argument("--overlap", type=_number(float, 0, 1), default=0.0,
                        help="share of the communication hidden behind the backward pass (0 to 1)")
    hidden.add_argument("--breakdown", default=None, metavar="JSON",
                        help="breakdown.json of dlscale bench breakdown on this machine: the overlap it measured")
    project.add_argument("--backward-share", type=_number(float, 0, 1), default=2 / 3,
                         help="the backward pass's share of the compute: the most an overlap can hide (default 2/3)")
    project.add_argument("--bucket-mb", type=_number(float, 0), default=25.0,
                         help="DDP's bucket_cap_mb: one latency per bucket (0: the gradient as one message)")
    project.add_argument("--algorithm", choices=ALGORITHMS, default="auto",
                         help="all-reduce between nodes (auto: the cheapest for each bucket, as NCCL chooses)")
    project.add_argument("--baseline", choices=BASELINES, default="gpu",
                         help="efficiency against one GPU or one node")
    project.add_argument("--out", default="runs/projection")
    project.set_defaults(handler=_project)


def _add_experiment(commands: Any) -> None:
    experiment = commands.add_parser("experiment", help="multi-run experiments (lesson 07's large-batch sweep)")
    experiment_commands = experiment.add_subparsers(dest="experiment_command", required=True, metavar="EXPERIMENT")
    sweep = experiment_commands.add_parser(
        "large-batch", help="batch-size sweep: LR scaling rules, warmup, LARS and LAMB",
        description="Train a baseline batch B0, then 8x, 32x and 128x B0 with each recipe for the same number "
                    "of epochs; write a table and a plot. --size ci takes a few minutes on 2 CPU cores; "
                    "--size full is meant for one GPU.")
    sweep.add_argument("--size", choices=("ci", "full"), default="ci")
    sweep.add_argument("--out", default="runs/large_batch", help="folder for the runs, table and figure")
    sweep.add_argument("--recipes", default=None, help="comma-separated subset of the recipes")
    sweep.set_defaults(handler=_experiment_large_batch)


def _hpo_start(args: argparse.Namespace) -> int:
    from dlscale.hpo.local_search import search

    args.space, args.overrides = _name_and_overrides(args.space, args.overrides)
    # (only the options given: an existing study keeps its own, and a different one given is refused by name)
    given = {key: getattr(args, key) for key in ("sampler", "pruner", "seed", "storage", "grace_s", "ranks_per_node",
                                                 "threads") if getattr(args, key) is not None}
    settings = search(args.dir, args.space, args.trials, args.workers, args.overrides, **given)
    if args.workers:
        return _hpo_show(args)
    print(f"study {settings.name!r} ready in {args.dir} ({settings.trials} trials); start workers with "
          f"`dlscale hpo worker --dir {args.dir}` (slurm/*/hpo.sbatch runs them as a job array)")
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


def _add_hpo(commands: Any) -> None:
    hpo = commands.add_parser("hpo", help="hyperparameter search with Optuna: pruned trials, workers, Slurm arrays",
                              description="A study lives in a folder (--dir): study.json, the journal of its trials, "
                                          "and each trial's run directory under trials/. See lesson 12.")
    sub = hpo.add_subparsers(dest="hpo_command", required=True, metavar="ACTION")
    start = sub.add_parser("start", help="create a study (or resume the one in --dir) and run workers on it",
                           description="SPACE is a shipped search space or a YAML file; without it the study in "
                                       "--dir resumes (its trials kept; --trials may raise the count).")
    start.add_argument("space", nargs="?", default=None, metavar="SPACE")
    start.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="for every trial, e.g. device=cuda")
    start.add_argument("--dir", default="runs/hpo", help="the study's folder")
    start.add_argument("--trials", type=_number(int, 1), default=None, help="trials to finish, complete or pruned (default 12)")
    start.add_argument("--workers", type=_number(int, 0), default=2, help="worker processes here (0: only create the study)")
    start.add_argument("--sampler", choices=("tpe", "random", "grid"), default=None, help="default tpe")
    start.add_argument("--pruner", choices=("hyperband", "halving", "median", "none"), default=None,
                       help="default hyperband")
    start.add_argument("--seed", type=int, default=None, help="default 0")
    start.add_argument("--storage", default=None, help="an RDB URL (default: the journal file in --dir)")
    start.add_argument("--grace-s", type=_number(float, 0, above=True), default=None,
                       help="a running trial silent this long is failed and retried (its worker died; default 20)")
    start.add_argument("--ranks-per-node", type=_number(int, 1), default=None, help="ranks (GPUs) per node, for node-hours: "
                       "a trial costs its seconds x its ranks / this (default 1)")
    start.add_argument("--threads", type=_number(int, 0), default=None,
                       help="torch threads per trial (default: what each worker was given), kept in each config")
    start.set_defaults(handler=_hpo_start)
    worker = sub.add_parser("worker", help="one worker: ask, train, tell until the study has its trials")
    worker.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    worker.add_argument("--dir", required=True)
    worker.add_argument("--max-trials", type=_number(int, 1), default=None)
    worker.add_argument("--verbose", action="store_true", help="print each trial's training, not only its result")
    worker.set_defaults(handler=_hpo_worker)
    show = sub.add_parser("show", help="the trials, the best one, and Optuna's plots as PNGs")
    show.add_argument("--dir", required=True)
    show.add_argument("--rerun", action="store_true", help="train the best trial again and compare")
    show.set_defaults(handler=_hpo_show)


def _add_info(commands: Any) -> None:
    info = commands.add_parser("info", help="show hardware, versions, site and launcher (lesson 00)")
    info.add_argument("--task", action="store_true",
                      help="one line: this task's rank, host, CPUs and binding settings (launch.sh SITE probe)")
    info.set_defaults(handler=_info)


def build_parser() -> argparse.ArgumentParser:
    """The ``dlscale`` parser: one builder per subcommand."""
    parser = _Parser(
        prog="dlscale",
        description="Deep learning at scale: train (one engine for lessons, jobs and notebooks), data, benchmarks, K-Means, reports, node planning, hyperparameter search, and the lessons' exercises and recipes.")
    from dlscale import __version__

    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train, _add_data, _add_exercises, _add_recipes, _add_lessons, _add_bench, _add_kmeans, _add_export, _add_report,
                _add_plan, _add_project, _add_experiment, _add_hpo, _add_info):
        add(commands)
    return parser


def _leave_now(code: int) -> None:
    """Exit at once, without finalizing the interpreter. After a peer died, gloo's worker threads may still be freeing
    the failed collective's buffers, which takes the GIL; a thread the finalizing interpreter ends mid-destructor
    aborts the rank (SIGABRT after the one-line error, the exit code lost: seen once in CI). Nothing is left to write:
    each metrics row is flushed as it is written, and checkpoints are written whole."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides taken wherever they stand: after the options too
    (``dlscale hpo start SPACE --workers 2 device=cpu``), which argparse alone calls unrecognized."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        if hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in rest):
            args.overrides = [*args.overrides, *rest]
        elif hasattr(args, "overrides") and rest[0].startswith("--"):  # (--epochs 2 for epochs=2)
            key = rest[0].lstrip("-").split("=", 1)[0].replace("-", "_")
            value = rest[0].split("=", 1)[1] if "=" in rest[0] else (rest[1] if len(rest) > 1 else "VALUE")
            parser.error(f"unrecognized arguments: {' '.join(rest)}; a setting is key=value, as {key}={value}")
        else:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    """A warning as the command prints it: one line, not the warnings module's two (the line, then the source)."""
    return f"dlscale: warning: {' '.join(str(message).split())}\n"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    warnings.formatwarning = _one_line_warning
    # A rank killed inside C++ (SIGABRT, SIGSEGV in gloo, NCCL or a kernel) then prints where
    # its Python code was, which is often all a batch job's log keeps of the failure.
    faulthandler.enable()
    try:
        return args.handler(args)
    except DlscaleError as err:
        print(f"dlscale: error: {err}", file=sys.stderr)
        distributed = sys.modules.get("dlscale.distributed")  # (loaded by any command that can meet a dead peer)
        if distributed is not None and isinstance(err, distributed.PeerFailedError):
            _leave_now(2)
        return 2
    except KeyboardInterrupt:
        print("dlscale: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # (a file or folder the command was pointed at: missing, unwritable, full)
        where = f"{err.filename}: " if err.filename else ""
        print(f"dlscale: error: {where}{err.strerror or err}; check the path, that you may write there and that "
              f"the disk has room", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
