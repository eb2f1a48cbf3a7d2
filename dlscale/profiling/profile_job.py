"""The profile job's entry point: ``python -m dlscale.profiling.profile_job --output PATH ARGS...``.

``slurm/launch.sh profile`` starts this on every task, in the job's own environment (inside the
container, in container mode), and it becomes ``nsys profile ... PYTHON -m dlscale.train ARGS``
with PYTHON the interpreter running it. The batch script on the host then needs neither the kit
nor the container's Python path: the line that trains is built where it runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from dlscale.profiling.nsys import nsys_command


def command(argv: list[str]) -> list[str]:
    """The ``nsys profile`` line for ``argv`` (``--output PATH`` then the training's arguments)."""
    parser = argparse.ArgumentParser(prog="python -m dlscale.profiling.profile_job")
    parser.add_argument("--output", required=True, help="nsys's report, e.g. runs/job/nsys/rank_%%q{SLURM_PROCID}")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="what dlscale.train takes: a config, key=value")
    args = parser.parse_args(argv)
    return nsys_command(
        args.train_args, output=args.output, python=sys.executable, cuda_graphs="cuda_graphs=true" in args.train_args
    )


def main(argv: list[str] | None = None) -> None:
    line = command(sys.argv[1:] if argv is None else argv)
    if shutil.which(line[0]) is None:
        sys.exit(
            f"dlscale: nsys (Nsight Systems) is not on the PATH of this task ({sys.executable}): load the "
            f"site's module (module load nsight-systems on some sites) or use an image that has it"
        )
    os.execvp(line[0], line)


if __name__ == "__main__":
    main()
