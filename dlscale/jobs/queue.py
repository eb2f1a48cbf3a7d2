"""Where a lesson submits its jobs: the site's own Slurm queue when there is one, else a cluster on this machine.

On a login node or a JupyterHub server of a site the kit has scripts for (``DLSCALE_SITE``, or
detected: Perlmutter, Frontier), with ``sbatch`` on the path, :func:`open_queue` sends jobs to
the real queue through ``slurm/SITE/``, charged as the instructor's settings say: Slurm's own
input variables (``SBATCH_ACCOUNT``, ``SBATCH_RESERVATION``, ``SBATCH_QOS``, ``SBATCH_PARTITION``),
set in the kernel's environment or in a file of ``NAME=value`` lines that ``DLSCALE_WORKSHOP_ENV``
names. Elsewhere it starts a one-node cluster here (:class:`~dlscale.jobs.local_slurm.LocalSlurm`)
when Slurm's programs are installed, or says that there is none.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import DlscaleError
from dlscale.jobs.environment import detect_site

#: Sites with scripts in slurm/, by the name :func:`detect_site` gives them.
SITE_SCRIPTS = {"NERSC Perlmutter": "perlmutter", "OLCF Frontier": "frontier"}
#: The instructor's settings: variables sbatch reads itself, so every script submitted gets them.
SETTINGS = ("SBATCH_ACCOUNT", "SBATCH_RESERVATION", "SBATCH_QOS", "SBATCH_PARTITION")
#: What a job that is not one of the site's scripts (``sbatch --wrap``) must ask for there.
WRAP_OPTIONS = {"perlmutter": ["--constraint=gpu"], "frontier": [], "local": []}


@dataclass
class Queue:
    """A place to submit: ``kind`` is "site" (the real queue), "local" (a cluster here) or "none"."""

    kind: str
    site: str  # the folder of slurm/ whose scripts it runs
    env: dict[str, str] | None = None  # the environment sbatch and squeue need
    cluster: Any = None  # the LocalSlurm to stop, for "local"
    settings: dict[str, str] = field(default_factory=dict)

    def script(self, root: str | Path, name: str = "train.sbatch") -> Path:
        return Path(root) / "slurm" / self.site / name

    @property
    def wrap_options(self) -> list[str]:
        return WRAP_OPTIONS.get(self.site, [])

    def probe(self, tasks: int = 2, timeout: float = 300) -> str:
        """What each of ``tasks`` tasks of a job with one CPU each is given (``launch.sh SITE probe``): its output."""
        import subprocess

        from dlscale.jobs.slurm_jobs import JOB_OUTPUT, wait_for_jobs

        wrap = f"--wrap=bash {self.env['DLSCALE_ROOT']}/slurm/launch.sh {self.site} probe"
        output = JOB_OUTPUT.parent.resolve() / "probe-%j.out"  # (the runs' folder, not beside the notebook)
        output.parent.mkdir(parents=True, exist_ok=True)
        job = (
            subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    f"--ntasks={tasks}",
                    "--cpus-per-task=1",
                    f"--output={output}",
                    *self.wrap_options,
                    wrap,
                ],
                env=self.env,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .split(";")[0]
        )
        wait_for_jobs([job], self.env, timeout=timeout, poll=0.5)
        return Path(str(output).replace("%j", job)).read_text()

    def describe(self) -> str:
        if self.kind == "site":
            charged = ", ".join(f"{k}={v}" for k, v in self.settings.items()) or "your default account"
            return f"submitting to {self.site}'s own queue with slurm/{self.site}/ ({charged})"
        if self.kind == "local":
            return "submitting to a one-node Slurm cluster on this machine (slurm/local/)"
        return "no Slurm here (make slurm-packages, or open this lesson on a site's login node)"

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def read_settings(path: str | Path) -> dict[str, str]:
    """The ``NAME=value`` lines of an instructor's settings file (blank lines and ``#`` comments skipped)."""
    settings = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or name.strip() not in SETTINGS:
            raise DlscaleError(
                f"{path}, line {number}: expected one of {', '.join(SETTINGS)} as NAME=value, got {line!r}"
            )
        settings[name.strip()] = value.strip().strip('"')
    return settings


def job_environ(root: str | Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) for submitting the kit's scripts: ``DLSCALE_ROOT`` names the
    repository, and this environment's ``bin`` leads the path, so the jobs run this python and dlscale."""
    environ = dict(os.environ if environ is None else environ)
    bin_dir = os.path.dirname(sys.executable)
    return {**environ, "DLSCALE_ROOT": str(root), "PATH": f"{bin_dir}:{environ.get('PATH', '')}"}


def site_of(environ: dict[str, str]) -> str | None:
    """The slurm/ folder of the site this runs at: ``DLSCALE_SITE``, or the detected site if the kit has scripts."""
    return environ.get("DLSCALE_SITE") or SITE_SCRIPTS.get(detect_site(environ))


def open_queue(root: str | Path, environ: dict[str, str] | None = None, start_local: bool = True) -> Queue:
    """The queue a lesson submits to (see the module's docstring); a local cluster is started if it is the one."""
    from dlscale.jobs.local_slurm import LocalSlurm, missing_programs

    environ = job_environ(root, environ)
    if environ.get("DLSCALE_WORKSHOP_ENV"):
        environ.update(read_settings(environ["DLSCALE_WORKSHOP_ENV"]))
    site = site_of(environ)
    if site and site != "local" and shutil.which("sbatch", path=environ["PATH"]):
        return Queue("site", site, environ, settings={k: environ[k] for k in SETTINGS if environ.get(k)})
    if missing_programs():
        return Queue("none", "local")
    if not start_local:
        return Queue("local", "local")
    cluster = LocalSlurm().start()
    return Queue("local", "local", cluster.environ(environ), cluster)
