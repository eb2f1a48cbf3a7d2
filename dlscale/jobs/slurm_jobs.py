"""Submitting and watching Slurm jobs from Python: what lesson 09 and the tests do with the cluster.

Works with any Slurm (the local cluster of :mod:`dlscale.jobs.local_slurm` or a site's): pass the
environment that points at it. A job that ends in any state but ``COMPLETED`` raises a
:class:`JobFailedError` carrying the end of its output file, so a notebook cell that waits for a job
fails when the job fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable

from dlscale.errors import DlscaleError

#: Job states after which a job will not run again by itself.
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


class JobFailedError(DlscaleError):
    """A Slurm job ended in a state other than COMPLETED; the message ends with its output."""


def _run(argv: list[str], env: dict[str, str] | None) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise DlscaleError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


#: Where a job's output goes unless its options say otherwise: one folder of the runs, not the folder sbatch was
#: called from (a lesson's kernel would leave slurm-*.out files beside the notebooks, in git status).
JOB_OUTPUT = Path("runs") / "slurm" / "%x-%j.out"


def submit(
    script: str | Path, args: Iterable[str] = (), options: Iterable[str] = (), env: dict[str, str] | None = None
) -> str:
    """``sbatch --parsable OPTIONS SCRIPT ARGS``; returns the job id. Without ``--output`` among the options the
    job writes to :data:`JOB_OUTPUT` (made absolute here: a job may change its folder)."""
    options = list(options)
    if not any(option.startswith(("--output", "-o")) for option in options):
        JOB_OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        options.append(f"--output={JOB_OUTPUT.resolve()}")
    return _run(["sbatch", "--parsable", *options, str(script), *args], env).strip().split(";")[0]


def job_info(job: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``scontrol show job`` as a mapping (``JobState``, ``Restarts``, ``ExitCode``, ``StdOut``, ...)."""
    return dict(re.findall(r"(\w+)=(\S*)", _run(["scontrol", "show", "job", job], env)))


def output_tail(info: dict[str, str], lines: int = 25) -> str:
    path = Path(info.get("StdOut", ""))
    if not path.is_file():
        return f"(no output file at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.5, quick: float | None = None
) -> None:
    """Poll ``condition`` until it holds; a TimeoutError saying ``what`` was awaited after ``timeout`` s.

    ``quick``: poll this often at first, then every tenth of the time waited so far, up to every ``poll`` s: a
    short wait ends soon after its condition holds, a long one asks every ``poll`` s.
    """
    started = time.monotonic()
    while not condition():
        waited = time.monotonic() - started
        if waited > timeout:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(poll if quick is None else min(poll, max(quick, waited / 10)))


def wait_for_jobs(
    jobs: Iterable[str],
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
    watch: Callable[[str], None] | None = None,
    poll: float = 2.0,
) -> dict[str, dict[str, str]]:
    """Wait until every job has ended; return each job's final ``scontrol`` fields.

    The jobs are asked about every quarter second at first and every ``poll`` s once they have run for
    ``10 * poll`` s (a short job is seen ending at once, a site's long one asked about gently).
    ``watch`` is called with ``squeue``'s lines for the jobs about every ``poll`` s (e.g. ``print``).
    Raises :class:`JobFailedError` for the first job that did not complete, with its output's end.
    """
    jobs = list(jobs)
    finals: dict[str, dict[str, str]] = {}
    watched = -float("inf")

    def all_ended() -> bool:
        nonlocal watched
        for job in jobs:
            if job not in finals:
                info = job_info(job, env)
                if info.get("JobState") in FINAL_STATES:
                    finals[job] = info
        if watch is not None and len(finals) < len(jobs) and time.monotonic() - watched >= poll:
            watched = time.monotonic()
            queue = _run(
                ["squeue", "-h", "-j", ",".join(j for j in jobs if j not in finals), "-o", "%i %j %T %M %D %C %R"], env
            ).strip()
            if queue:
                watch(queue)
        return len(finals) == len(jobs)

    wait_until(all_ended, timeout, f"jobs {', '.join(jobs)} to end", poll, quick=min(poll, 0.25))
    for job in jobs:
        info = finals[job]
        if info["JobState"] != "COMPLETED":
            raise JobFailedError(
                f"job {job} ({info.get('JobName', '?')}) ended {info['JobState']}, exit code "
                f"{info.get('ExitCode', '?')}; the end of its output:\n{output_tail(info)}"
            )
    return finals


def submit_sweep(
    root: str | Path,
    site: str,
    sizes: Iterable[int],
    per_rank_batch: int,
    args: Iterable[str],
    sweep_dir: str | Path,
    env: dict[str, str] | None = None,
) -> list[str]:
    """``slurm/sweep.sh SITE SIZES PER_RANK_BATCH ARGS`` into ``sweep_dir``; returns the job ids it submitted."""
    out = _run(
        ["bash", str(Path(root) / "slurm/sweep.sh"), site, " ".join(map(str, sizes)), str(per_rank_batch), *args],
        {**(os.environ if env is None else env), "DLSCALE_SWEEP_DIR": str(sweep_dir)},
    )
    return re.findall(r"job (\d+)", out)
