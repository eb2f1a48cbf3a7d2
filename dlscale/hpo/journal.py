"""The study's journal file, guarded against a record torn by a crash.

Optuna appends each record to the journal as one line, under a file lock. A worker killed or a disk
filled mid-write leaves the last line cut short. Optuna's reader skips such a line without a word (the
trial it finished shows as running), and the next append joins the torn line, after which every read
of the study fails (``JSONDecodeError``). Here every append, under Optuna's own lock, first cuts a torn
tail off the file, and so does opening a study: the torn bytes go to ``study.journal.torn``, a line
says so, and the study goes on from its last whole record (the heartbeats then fail the trial whose
result was lost, and it runs again). Only the tail is ever cut, so the byte offsets of the records
before it, which Optuna's readers in other workers keep, stay valid.

A database storage (``storage=URL``) needs none of this: its writes are transactions.
Imported only when a study is opened (the package imports without Optuna).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

#: How far back to read at a time, looking for the end of the last whole record.
_CHUNK = 1 << 16


def cut_torn_tail(path: Path) -> int:
    """Cut the bytes after the journal's last newline (a record torn mid-write) into ``<path>.torn``.

    Returns how many bytes were cut (0 for a whole journal). The caller holds the journal's lock.
    """
    if not path.is_file():
        return 0
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        end = size
        while end > 0:  # the last newline, read backwards a chunk at a time
            start = max(0, end - _CHUNK)
            handle.seek(start)
            found = handle.read(end - start).rfind(b"\n")
            if found >= 0:
                end = start + found + 1
                break
            end = start
        if end == size:
            return 0
        handle.seek(end)
        torn = handle.read()
        with open(path.with_name(path.name + ".torn"), "ab") as kept:
            kept.write(torn + b"\n")
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
    print(
        f"dlscale: {path} ended in a record torn mid-write ({len(torn)} bytes, from a crash or a full disk); "
        f"it was cut off and kept in {path.name}.torn, and the study goes on from the last whole record",
        flush=True,
    )
    return len(torn)


class GuardedJournal(JournalFileBackend):
    """Optuna's journal file, with a torn tail cut before each append (and when the study is opened)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._guard = JournalFileSymlinkLock(str(self._path))  # the lock Optuna's own appends take
        super().__init__(str(self._path), lock_obj=self._guard)
        if self._path.is_file():
            with _held(self._guard):
                cut_torn_tail(self._path)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        # Optuna's append, with the tail checked under the same lock: a torn record is never joined.
        with _held(self._guard):
            cut_torn_tail(self._path)
            text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
            with open(self._path, "ab") as handle:
                handle.write(text.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())


@contextmanager
def _held(lock: Any) -> Iterator[None]:
    """Hold an Optuna journal lock for a block, releasing it whatever happens."""
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
