"""Graceful stop on a signal: finish the current step, checkpoint, exit with a known status.

Slurm sends SIGTERM when a job is cancelled or preempted, and a job script can ask for
SIGUSR1 some minutes before the time limit (``--signal=B:USR1@300``). Either signal
sets a flag that the training loop checks at each step boundary; the loop then writes
a checkpoint and stops, and the CLI exits with :data:`PREEMPTED_EXIT_CODE` so the job
script knows to requeue rather than report a failure. Rank 0 also leaves :data:`STOPPED_MARKER` in
the run folder: under ``srun --kill-on-bad-exit=1`` the job step's status can be that of a rank
srun killed after the first one exited 75, so the job script reads the marker as well.

A signal may also arrive as a file: where the tasks cannot receive it (podman-hpc's ``--mpi`` mode wraps each task
in a process that does not forward it), the job scripts ask Slurm to signal the batch shell
(``--signal=B:USR1@…``), and ``slurm/launch.sh`` turns the signal into :data:`STOP_FILE` in the run folder. Rank 0
looks for it at most every :data:`STOP_FILE_EVERY_S` seconds (one ``stat`` on a shared file system, not one per
step) and stops as the signal would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

#: Exit status of a run that stopped on a signal after checkpointing (EX_TEMPFAIL: "try again").
PREEMPTED_EXIT_CODE = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: The file a run stopped on a signal leaves in its folder, after its checkpoint (slurm/launch.sh reads it).
STOPPED_MARKER = "stopped-on-signal"
#: The file slurm/launch.sh writes in the run folder when the batch shell receives the stop signal.
STOP_FILE = "stop-requested"
#: How often rank 0 looks for :data:`STOP_FILE` (Slurm's warning comes minutes before the limit).
STOP_FILE_EVERY_S = 5.0
#: At most this much of a stop file is read: its first word may name the signal; the rest is not the kit's.
STOP_FILE_READ_BYTES = 64
_SIGNAL_NAMES = frozenset(sig.name for sig in signal.Signals)


def _signal_named(stop_file: Path) -> str:
    """The signal a stop file names (launch.sh writes "SIGUSR1" or "SIGTERM"), else "SIGUSR1": a stop file is a stop
    request whatever it holds, so at most :data:`STOP_FILE_READ_BYTES` are read, and never decoded strictly."""
    try:
        fd = os.open(stop_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (never waits on a FIFO put there)
        try:
            head = os.read(fd, STOP_FILE_READ_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return "SIGUSR1"  # (gone already, or unreadable: still a request)
    words = head.decode("ascii", errors="replace").split()
    return words[0] if words and words[0] in _SIGNAL_NAMES else "SIGUSR1"


def mark_stopped(run_dir: Path, reason: str, step: int) -> None:
    """Say in ``run_dir`` that the run checkpointed at ``step`` and stopped on a signal (the job may requeue)."""
    (Path(run_dir) / STOPPED_MARKER).write_text(f"{reason}; checkpointed at step {step}\n")


class StopFlag:
    """Context manager: while active, SIGTERM/SIGUSR1 set :attr:`requested` instead of killing."""

    def __init__(self, stop_file: Path | None = None, clock=time.monotonic) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self.reason = "a stop signal received"
        self._previous: dict[int, object] = {}
        self.stop_file, self._clock = stop_file, clock
        self._looked = clock()

    def poll(self) -> bool:
        """Look for the stop file (at most every :data:`STOP_FILE_EVERY_S` s); True once a stop is requested.
        Found, it is removed (the job script made it) and counts as the signal the batch shell received."""
        if self.requested or self.stop_file is None or self._clock() - self._looked < STOP_FILE_EVERY_S:
            return self.requested
        self._looked = self._clock()
        if self.stop_file.is_file():
            said = _signal_named(self.stop_file)
            self.stop_file.unlink(missing_ok=True)
            self.requested, self.signal_name = True, said
            self.reason = f"{said} received by the job script ({self.stop_file.name})"
        return self.requested

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        self.reason = f"{self.signal_name} received"

    def request(self, reason: str) -> None:
        """Stop as a signal would, for a reason of the caller's (a search pruning its trial)."""
        self.requested = True
        self.reason = reason

    def __enter__(self) -> "StopFlag":
        # Handlers can only be installed from the main thread (not, say, an ipyparallel engine's worker).
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
