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
import warnings
from typing import Any

from dlscale.cli import bench, data, hpo, kmeans, lessons, plan, project, report, train
from dlscale.errors import DlscaleError


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line said in one line (not the usage block, then the error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:  # (a command mistyped: the nearest one, as git says it)
            import difflib

            choices = re.findall(r"'?([\w-]+)'?", wrong[2])
            near = difflib.get_close_matches(wrong[1], choices, n=1)
            message = f"{message.split(':')[0]}: no command {wrong[1]!r}" + (
                f"; did you mean {near[0]!r}?" if near else f" (commands: {', '.join(choices)})"
            )
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``dlscale`` parser: one builder per subcommand."""
    parser = _Parser(
        prog="dlscale",
        description=(
            "Deep learning at scale: train (one engine for lessons, jobs and notebooks), data, benchmarks, "
            "K-Means, reports, node planning, hyperparameter search, and the lessons' exercises and recipes."
        ),
    )
    from dlscale import __version__

    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        train.add_train,
        data.add_data,
        lessons.add_exercises,
        lessons.add_recipes,
        lessons.add_lessons,
        bench.add_bench,
        kmeans.add_kmeans,
        train.add_export,
        report.add_report,
        plan.add_plan,
        project.add_project,
        bench.add_experiment,
        hpo.add_hpo,
        train.add_info,
    ):
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
        print(
            f"dlscale: error: {where}{err.strerror or err}; check the path, that you may write there and that "
            f"the disk has room",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
