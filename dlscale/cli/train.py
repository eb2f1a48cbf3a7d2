"""``dlscale train`` (the engine), ``dlscale export`` (a run's whole model) and ``dlscale info`` (where am I)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from dlscale.cli.options import config_arguments, name_and_overrides
from dlscale.config import SECTION_KEYS, config_names, describe_field, load_config

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


def _train(args: argparse.Namespace) -> int:
    from dlscale.training.loop import train
    from dlscale.training.preemption import PREEMPTED_EXIT_CODE

    config, overrides = name_and_overrides(args.config, args.overrides)
    result = train(load_config(config, overrides))
    return PREEMPTED_EXIT_CODE if result.preempted else 0


def add_train(commands: Any) -> None:
    from dlscale.training.preemption import PREEMPTED_EXIT_CODE

    keys = "\n".join(
        f"{name}:\n"
        + "\n".join(
            textwrap.fill(describe_field(k), 100, initial_indent="  ", subsequent_indent="      ") for k in section_keys
        )
        for name, section_keys in SECTION_KEYS.items()
    )
    train = commands.add_parser(
        "train",
        help="train the model on the synthetic maps (or your shards)",
        description="Train with the one training loop; metrics, plots and checkpoints go to the run directory.",
        epilog=TRAIN_EPILOG.format(names=", ".join(config_names()), keys=keys, preempted=PREEMPTED_EXIT_CODE),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arguments(train, default=None)
    train.set_defaults(handler=_train)


def _export(args: argparse.Namespace) -> int:
    from dlscale.checkpoint.export import export_model

    model, config = export_model(args.run_dir, args.out)
    print(
        f"wrote the whole model of {args.run_dir} ({sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{config['model']}) to {args.out}; load it with torch.load(path, weights_only=True)"
    )
    return 0


def add_export(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="a run's newest checkpoint as one whole model file (also from FSDP/tensor-parallel shards)",
        description="Read the newest checkpoint of RUN_DIR, whatever wrote it (one process, DDP, Horovod, FSDP or "
        "tensor parallelism on any number of ranks), into one model in this process and save "
        "{'model': state_dict, 'config': ...} to OUT for evaluation elsewhere.",
    )
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("out", metavar="OUT", nargs="?", default="model.pt")
    export.set_defaults(handler=_export)


def _info(args: argparse.Namespace) -> int:
    from dlscale.jobs.environment import environment_report, missing_engines, task_line

    if args.require is not None:
        try:
            present, missing = missing_engines(args.require)
        except ValueError as err:
            print(f"dlscale info --require: {err}", file=sys.stderr, flush=True)
            return 2
        if missing:
            print(
                f"dlscale info: the lessons' engines missing here: {'; '.join(missing)} (python {sys.executable})",
                file=sys.stderr,
                flush=True,
            )
            return 1
        print(f"the lessons' engines of {args.require or 'the kit alone'} import: {' '.join(present) or 'none named'}")
        return 0
    print(task_line() if args.task else environment_report(), flush=True)
    return 0


def add_info(commands: Any) -> None:
    info = commands.add_parser("info", help="show hardware, versions, site and launcher (lesson 00)")
    info.add_argument(
        "--task",
        action="store_true",
        help="one line: this task's rank, host, CPUs and binding settings (launch.sh SITE probe)",
    )
    info.add_argument(
        "--require",
        metavar="EXTRAS",
        default=None,
        help="import every engine these extras give the lessons (notebooks,kmeans,...) and fail with one line naming "
        "those missing (the Containerfile's last step)",
    )
    info.set_defaults(handler=_info)
