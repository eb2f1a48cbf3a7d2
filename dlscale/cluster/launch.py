"""Command lines that start local ranks: ``torchrun`` and ``horovodrun --gloo`` around ``python -m MODULE``.

The benchmarks, ``dlscale kmeans`` runs and lesson 09 start ranks with these; on a cluster
the Slurm scripts' ``srun`` does the same job.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from dlscale.distributed import free_port
from dlscale.distributed.horovod_backend import INSTALL_HINT, HorovodError

#: Where torchrun keeps its per-rank logs (without ``--log-dir``: a ``torchelastic_*`` folder in the system's
#: temporary folder, never removed), relative to the folder the runs are written from.
TORCHRUN_LOGS = "runs/torchrun"


def torchrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under torchrun (a free port each time)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={free_port()}",
            f"--log-dir={TORCHRUN_LOGS}", "-m", *module_args]


def horovodrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under ``horovodrun --gloo``."""
    beside = Path(sys.executable).with_name("horovodrun")
    runner = str(beside) if beside.exists() else shutil.which("horovodrun")
    if runner is None:
        raise HorovodError(f"horovodrun is not installed; {INSTALL_HINT}")
    return [runner, "-np", str(nproc), "--gloo", "-H", f"localhost:{nproc}", sys.executable, "-m", *module_args]
