"""A Slurm cluster on this machine, of one node or several, for a laptop, a workstation, CI and lesson 09.

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
(``bash slurm/launch.sh local probe`` prints it); on several nodes, which share the machine's
cores, they are not (``task/none``: every node would bind its first task to the same core).

With ``nodes=N`` (N > 1, root and util-linux's ``unshare`` needed) each node is a slurmd in its own
UTS and mount namespace: its own hostname (``node1``, ``node2``...), its own loopback address
(127.0.0.11, 127.0.0.12...; Linux routes all of 127.0.0.0/8 to ``lo``) and slurmd port, an
``/etc/hosts`` seen only inside the cluster that maps the names to those addresses, and its own
node-local folder, bound in its namespace at the one path ``DLSCALE_NODE_LOCAL`` names. Tasks of a
job inherit their node's namespaces, so a job sees several hosts, as on a real cluster; the
machine's own hostname, ``/etc/hosts`` and network are never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dlscale.distributed import free_port
from dlscale.errors import DlscaleError

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
_CONF = """\
ClusterName=dlscale
SlurmctldHost={controller}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={sockets}/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin={task_plugin}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A cluster of one or two nodes can look at its queue every second (Slurm's defaults: 60 s, backfill 30 s):
# a requeued job whose StartTime passes otherwise starts only at the next look (lesson 09's preemption: 33 s, not 14)
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
JobRequeue=1
FirstJobId={first_job_id}
SlurmdTimeout={slurmd_timeout}
MessageTimeout={message_timeout}
MinJobAge=600
SlurmctldPort={ctld_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={sockets}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
{node_lines}
PartitionName=local Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(DlscaleError):
    """Slurm is missing here, or the local cluster did not come up; the message says why."""


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [
        name
        for name in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol")
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists()
    ]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def multi_node_unavailable() -> str | None:
    """Why several nodes cannot run here (None when they can): they need root and ``unshare``."""
    if os.geteuid() != 0:
        return "several nodes need root (each slurmd runs in its own UTS and mount namespace)"
    if shutil.which("unshare") is None:
        return "several nodes need util-linux's unshare"
    return None


#: Job ids each local cluster may use before the next cluster's begin (Slurm's ids stop at 67,043,328).
JOB_IDS_PER_CLUSTER = 10_000


def first_job_id(counter: Path | None = None) -> int:
    """The first job id of a new local cluster: a block of its own on this machine.

    Each cluster starts with fresh state, so its jobs would be numbered 1, 2... again, and a job of
    a second cluster would take the run directory and output file (``runs/NAME-ID``,
    ``slurm-NAME-ID.out``) of an earlier cluster's job with the same id. A counter in the machine's
    temporary folder hands each cluster the next block.
    """
    import fcntl

    counter = counter or _private_folder() / "slurm-clusters"
    try:  # (never through a link: a file another user planted is refused, not followed)
        fd = os.open(counter, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise SlurmError(
            f"{counter} cannot be opened ({err.strerror}): it counts the local clusters' job ids; "
            f"remove it if it is a link or another user's file"
        ) from None
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise SlurmError(f"{counter} belongs to another user: remove it (it counts the local clusters' job ids)")
    with open(fd, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # (two clusters starting at once get two blocks)
        handle.seek(0)
        text = handle.read().strip()
        started = int(text) if text.isdigit() else 0
        handle.seek(0)
        handle.truncate()
        handle.write(f"{started + 1}\n")
    return 1 + (started % (67_000_000 // JOB_IDS_PER_CLUSTER)) * JOB_IDS_PER_CLUSTER


def _private_folder() -> Path:
    """A folder only this user writes (``$XDG_CACHE_HOME/dlscale`` or ``~/.cache/dlscale``), unlike the shared
    temporary folder, where another local user can plant a file or a link under a name the kit will open."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlscale"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def _address(index: int) -> str:
    """Node ``index``'s loopback address (127.0.0.11 for node1): on ``lo`` already, nothing to configure."""
    return f"127.0.0.{10 + index}"


class LocalSlurm:
    """Start, use and stop a Slurm cluster of ``nodes`` nodes in ``root`` (a new temporary folder by default).

    ``cpus`` is what each node declares (default: this machine's CPUs, so several nodes share them)."""

    def __init__(self, root: str | Path | None = None, cpus: int | None = None, nodes: int = 1):
        self.root = Path(root or tempfile.mkdtemp(prefix="dlscale-slurm-"))
        self._own_root = root is None  # a temporary root it made goes at stop(); a folder it was given stays
        self.cpus = cpus or os.cpu_count() or 1
        self.host = socket.gethostname().split(".")[0]
        self.nodes = nodes
        # How long a silent slurmd may be before its node is DOWN and its jobs end (Slurm's default is 300 s).
        self.slurmd_timeout = 30
        # How long a message between the daemons may take (Slurm's default, 10 s). A dead node's pings each take this
        # long to fail, and the controller declares it DOWN only after two of them: a test that kills a node lowers it.
        self.message_timeout = 10
        self.processes: list[subprocess.Popen] = []
        self.sockets: Path | None = None  # a short folder of its own (start): munge's and slurmstepd's sockets

    @property
    def node_names(self) -> list[str]:
        """The nodes' hostnames: this machine's name for one node, ``node1``... for several."""
        return [self.host] if self.nodes == 1 else [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def node_local(self) -> Path:
        """The node-local folder: one path, a different folder behind it on each node."""
        return self.root / "node-local"

    def node_folder(self, name: str) -> Path:
        """What node ``name`` sees at :attr:`node_local` (on the machine itself; for tests)."""
        return self.node_local if self.nodes == 1 else self.root / "nodes" / name

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` pointing at this cluster and
        ``DLSCALE_NODE_LOCAL`` at its node-local folder (jobs inherit both)."""
        return {
            **(os.environ if base is None else base),
            "SLURM_CONF": str(self.conf),
            "DLSCALE_NODE_LOCAL": str(self.node_local),
        }

    def start(self, timeout: float = 60.0) -> LocalSlurm:
        missing = missing_programs()
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not found: install Debian's {' '.join(PACKAGES)} packages "
                f"(make slurm-packages, as root)"
            )
        if self.nodes > 1 and multi_node_unavailable():
            raise SlurmError(f"{multi_node_unavailable()}; the one-node cluster (nodes=1) works without")
        for folder in ("state", "node-local", *(f"nodes/{name}" for name in self.node_names if self.nodes > 1)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        # munged's socket and slurmstepd's (spool/NODE/NODE_JOBID.STEPID) in a short folder: a Unix socket's
        # path must stay under 108 bytes, which a root deep in a test's or a user's folders would pass.
        self.sockets = Path(tempfile.mkdtemp(prefix="dlscale-slurm-"))
        for name in self.node_names:
            (self.sockets / "spool" / name).mkdir(parents=True)
        memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        memory = max(1, (memory_mib - 1024) // self.nodes)
        if self.nodes == 1:
            # (the daemons reach one another on the loopback; see docs/architecture.md for where they listen)
            controller = f"{self.host}(127.0.0.1)"
            lines = [
                f"NodeName={self.host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={self.cpus} "
                f"RealMemory={memory} State=UNKNOWN"
            ]
        else:
            controller = f"{self.host}(127.0.0.1)"  # the controller stays on the machine itself
            lines = [
                f"NodeName={name} NodeAddr={_address(i)} Port={free_port()} CPUs={self.cpus} "
                f"RealMemory={memory} State=UNKNOWN"
                for i, name in enumerate(self.node_names, 1)
            ]
            (self.root / "hosts").write_text(
                f"127.0.0.1 localhost {self.host}\n"
                + "".join(f"{_address(i)} {name}\n" for i, name in enumerate(self.node_names, 1))
            )
        self.conf.write_text(
            _CONF.format(
                controller=controller,
                # Several nodes share this machine's cores, and task/affinity would confine each node's first task to
                # the same one, CPU 0 (each node allocates its CPUs from the first): the two ranks of a job of one task
                # per node took turns on one core while the other idled. Unbound, the machine spreads them (each still
                # runs the threads of its --cpus-per-task: launch.sh sets OMP_NUM_THREADS).
                task_plugin="task/affinity" if self.nodes == 1 else "task/none",
                user=getpass.getuser(),
                root=self.root,
                slurmd_timeout=self.slurmd_timeout,
                message_timeout=self.message_timeout,
                first_job_id=first_job_id(),
                sockets=self.sockets,
                ctld_port=free_port(),
                node_lines="\n".join(lines),
                node_names=",".join(self.node_names),
            )
        )
        key = self._new_munge_key()
        env = self.environ()
        atexit.register(self.stop)  # a notebook kernel or script that ends without stop() leaves no daemons behind
        self._spawn(
            [
                _program("munged"),
                "--foreground",
                "--force",
                f"--socket={self.sockets}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={self.root}/munged.pid",
                f"--log-file={self.root}/munged.log",
                f"--seed-file={self.root}/munged.seed",
            ],
            env,
        )
        self._wait_for(lambda: (self.sockets / "munge.socket").exists(), timeout, "munged")
        self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], env)
        slurmd = [_program("slurmd"), "-D", "-f", str(self.conf)]
        if self.nodes == 1:
            self._spawn(slurmd, env, "slurmd")
        for name in self.node_names if self.nodes > 1 else ():
            # unshare execs the shell, which execs slurmd: the PID we keep is the daemon's own.
            setup = (
                f"hostname {name} && mount --bind {self.root / 'hosts'} /etc/hosts && "
                f"mount --bind {self.node_folder(name)} {self.node_local} && exec {shlex.join(slurmd)}"
            )
            self._spawn(
                ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", setup],
                env,
                f"slurmd-{name}",
            )
        self._wait_for(self._node_ready, timeout, "slurmd")
        return self

    def _new_munge_key(self) -> Path:
        """The cluster's munge key, new at each start (a root given again: a new key, created private, never readable
        by others)."""
        key = self.root / "munge.key"
        key.unlink(missing_ok=True)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as handle:
            handle.write(os.urandom(1024))
        return key

    def _spawn(self, argv: list[str], env: dict[str, str], name: str | None = None) -> None:
        log = open(self.root / f"{name or Path(argv[0]).name}.out", "w")  # noqa: SIM115 - open for the daemon's life
        self.processes.append(
            subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def _node_ready(self) -> bool:
        done = subprocess.run(
            [_program("sinfo"), "-h", "-N", "-o", "%t"], env=self.environ(), capture_output=True, text=True
        )
        states = done.stdout.split()
        return done.returncode == 0 and len(states) == self.nodes and set(states) <= {"idle", "mix", "alloc"}

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-1500:]}"
            for p in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out"))
            if p.stat().st_size
        )
        self.stop()
        raise SlurmError(
            f"the local Slurm cluster did not come up ({what} not ready within {timeout:.0f} s); logs:\n{logs}"
        )

    def kill_node(self, name: str) -> int:
        """Kill every process of node ``name`` at once (its slurmd, step daemons and tasks), as a node that
        loses power; return how many. Only for a cluster of several nodes, whose nodes have namespaces."""
        if self.nodes == 1:
            raise SlurmError("kill_node needs a cluster of several nodes (nodes > 1)")
        daemon = next(p for p in self.processes if f"hostname {name} " in " ".join(map(str, p.args)))
        namespace = os.readlink(f"/proc/{daemon.pid}/ns/uts")
        victims = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and os.readlink(entry / "ns/uts") == namespace:
                    victims.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        daemon.wait()
        return len(victims)

    def stop(self) -> None:
        """Stop the daemons this object started, newest first, by PID; remove the temporary folders it made."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None
        if self._own_root:  # (the jobs' outputs are in the folders they were submitted from, not here)
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def stop_on_error(cluster: LocalSlurm | None) -> Iterator[LocalSlurm | None]:
    """Stop ``cluster`` (if there is one) when the body raises, then raise again.

    A lesson starts its cluster in one cell and stops it cells later: a cell that fails in
    between would leave munged, slurmctld and the slurmd daemons running until the kernel
    exits. Each cell that uses the cluster runs its body in this block instead.
    """
    try:
        yield cluster
    except BaseException:
        if cluster is not None:
            cluster.stop()
        raise
