"""Starting local ranks: the command lines (``torchrun``, ``horovodrun --gloo`` around ``python -m MODULE``) and the
one runner every caller uses (:func:`run_local`, :func:`start_local`).

The benchmarks, ``dlscale kmeans`` runs, a study's workers and re-runs, ``dlscale bench allreduce
--nproc`` and lesson 09 start ranks or processes with these; on a cluster the Slurm scripts'
``srun`` does the same job. The runner gives each process its threads, finds the environment's
own programs (mpirun's helpers), and turns a failure into one :class:`LaunchError` that carries
the processes' own words.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

from dlscale.distributed import free_port
from dlscale.distributed.horovod_backend import INSTALL_HINT, HorovodError
from dlscale.errors import DlscaleError
from dlscale.runtime.threads import per_process_env

#: Where torchrun keeps its per-rank logs (without ``--log-dir``: a ``torchelastic_*`` folder in the system's
#: temporary folder, never removed), relative to the folder the runs are written from.
TORCHRUN_LOGS = "runs/torchrun"


def torchrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under torchrun (a free port each time)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        f"--log-dir={TORCHRUN_LOGS}",
        "-m",
        *module_args,
    ]


def horovodrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under ``horovodrun --gloo``."""
    beside = Path(sys.executable).with_name("horovodrun")
    runner = str(beside) if beside.exists() else shutil.which("horovodrun")
    if runner is None:
        raise HorovodError(f"horovodrun is not installed; {INSTALL_HINT}")
    return [runner, "-np", str(nproc), "--gloo", "-H", f"localhost:{nproc}", sys.executable, "-m", *module_args]


class LaunchError(DlscaleError, RuntimeError):
    """Local ranks, or a run started as a process, that exited with an error; the message holds their own words."""


def _environment(threads: int | None, extra: dict[str, str] | None) -> dict[str, str]:
    """The child's environment: ``threads`` threads each (when given), this environment's programs first on the PATH
    (mpirun's hydra finds its helpers there), and ``extra``."""
    env = per_process_env(threads) if threads else dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **(extra or {})}


def run_local(
    argv: list[str], label: str, threads: int | None = None, env: dict[str, str] | None = None, capture: bool = True
) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end (a launcher of local ranks, or one process) and return how it ended.

    With ``capture`` (the default) the output is kept, and a failure raises :class:`LaunchError` naming ``label``
    with the start of the error output (where a rank's own error usually is) and its end (the launcher's summary).
    Without, the output goes to this process's terminal as it comes, and the caller reads the exit status.
    """
    done = subprocess.run(argv, env=_environment(threads, env), capture_output=capture, text=True)
    if capture and done.returncode != 0:
        err = done.stderr.strip()
        shown = err if len(err) <= 4000 else f"{err[:2500]}\n...\n{err[-1500:]}"
        raise LaunchError(f"{label} failed (exit status {done.returncode}):\n{shown}")
    return done


def start_local(
    argv: list[str],
    log: IO[bytes],
    threads: int | None = None,
    env: dict[str, str] | None = None,
    own_session: bool = False,
) -> subprocess.Popen:
    """Start ``argv`` in the background, its output (both streams) into ``log``; the caller waits for it.

    With ``own_session`` the process is in a process session of its own: a terminal's Ctrl-C or hangup reaches the
    caller only, which decides how it stops (a search's workers are sent SIGTERM, to checkpoint their trials)."""
    return subprocess.Popen(
        argv, env=_environment(threads, env), stdout=log, stderr=subprocess.STDOUT, start_new_session=own_session
    )
