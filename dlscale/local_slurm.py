"""A one-node Slurm cluster on this machine, for a laptop, a workstation, CI and lesson 09.

``LocalSlurm`` writes a minimal ``slurm.conf`` into a folder of its own, starts ``munged``,
``slurmctld`` and ``slurmd`` in the foreground as child processes, waits until the node is
idle, and stops exactly the processes it started (by PID). Clients find it through
``SLURM_CONF``, which :meth:`LocalSlurm.environ` sets::

    with LocalSlurm() as cluster:
        subprocess.run(["sbatch", "--wait", "slurm/local/train.sbatch", "tiny"], env=cluster.environ())

It needs Debian's (or your distribution's) ``slurmctld slurmd slurm-client munge`` packages
(``make slurm-packages`` installs them as root) and runs the daemons as the current user:
root in a container or CI, where it was checked; a non-root user can run them too, as
``SlurmUser`` is set to that user. Tasks are bound to their CPUs (``task/affinity``), as the
sites bind them, so a job shows what ``--cpus-per-task`` really gives each task
(``bash slurm/launch.sh local probe`` prints it).
"""

from __future__ import annotations

import atexit
import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .distributed import free_port
from .errors import DlscaleError

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
_CONF = """\
ClusterName=dlscale
SlurmctldHost={host}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
MinJobAge=600
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(DlscaleError):
    """Slurm is missing here, or the local cluster did not come up; the message says why."""


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [name for name in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol")
            if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))



class LocalSlurm:
    """Start, use and stop a one-node Slurm cluster in ``root`` (a new temporary folder by default)."""

    def __init__(self, root: str | Path | None = None, cpus: int | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="dlscale-slurm-"))
        self.cpus = cpus or os.cpu_count() or 1
        self.host = socket.gethostname().split(".")[0]
        self.processes: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` pointing at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> LocalSlurm:
        missing = missing_programs()
        if missing:
            raise SlurmError(f"{', '.join(missing)} not found: install Debian's {' '.join(PACKAGES)} packages "
                             f"(make slurm-packages, as root)")
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        self.conf.write_text(_CONF.format(host=self.host, user=getpass.getuser(), root=self.root, cpus=self.cpus,
                                          memory=max(1, memory_mib - 1024), ctld_port=free_port(),
                                          slurmd_port=free_port()))
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        env = self.environ()
        atexit.register(self.stop)  # a notebook kernel or script that ends without stop() leaves no daemons behind
        self._spawn([_program("munged"), "--foreground", "--force", f"--socket={self.root}/munge.socket",
                     f"--key-file={key}", f"--pid-file={self.root}/munged.pid", f"--log-file={self.root}/munged.log",
                     f"--seed-file={self.root}/munged.seed"], env)
        self._wait_for(lambda: (self.root / "munge.socket").exists(), timeout, "munged")
        self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], env)
        self._spawn([_program("slurmd"), "-D", "-f", str(self.conf)], env)
        self._wait_for(self._node_ready, timeout, "slurmd")
        return self

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.root / f"{Path(argv[0]).name}.out", "w")  # noqa: SIM115 - kept open for the daemon's life
        self.processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def _node_ready(self) -> bool:
        done = subprocess.run([_program("sinfo"), "-h", "-o", "%t"], env=self.environ(), capture_output=True,
                              text=True)
        return done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc")

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log")) +
                         sorted(self.root.glob("*.out")) if p.stat().st_size)
        self.stop()
        raise SlurmError(f"the local Slurm cluster did not come up ({what} not ready within {timeout:.0f} s); "
                         f"logs:\n{logs}")

    def stop(self) -> None:
        """Stop the daemons this object started, newest first, by PID."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
