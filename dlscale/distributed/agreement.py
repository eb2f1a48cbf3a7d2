"""Ranks agree on one yes or no without a process group: between the groups a stage makes and destroys itself.

A lesson runs an attendee's stage on every rank, then again at its other settings. Whether the ranks go on must be
the same on all of them: a rank that goes on alone waits in the next run's ``init_process_group`` for peers that
never come (the stage's own timeout, minutes, once a setting). :func:`every_rank_says_yes` asks through a small
TCP store of its own, on a port the launcher set aside, and answers no when a peer does not answer in time.
"""

from __future__ import annotations

import datetime
import os
import time

from dlscale.distributed.process_group import tcp_store

#: How long a rank waits for its peers' answers: a peer may still be inside a run that failed elsewhere, waiting out
#: the stage's own collective timeout (our recipes': 5 minutes)
AGREE_TIMEOUT_S = 360.0


def every_rank_says_yes(yes: bool, port: int, timeout_s: float = AGREE_TIMEOUT_S) -> bool:
    """Whether every rank of this job (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``) said yes: the same answer on all
    of them, unless one stops answering midway (then no). Rank 0 holds the store on ``port``."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = tcp_store(os.environ.get("MASTER_ADDR", "127.0.0.1"), port, size, rank == 0, timeout)
        store.set(f"yes/{rank}", "1" if yes else "0")
        keys = [f"yes/{peer}" for peer in range(size)]
        store.wait(keys)
        answer = all(store.get(key) == b"1" for key in keys)
        store.add("read", 1)
        if rank == 0:  # the store lives in this process: keep it until every rank has read
            deadline = time.monotonic() + timeout_s
            while store.add("read", 0) < size and time.monotonic() < deadline:
                time.sleep(0.01)
        return answer
    except RuntimeError:  # (DistStoreError is one) a peer that is gone, or never answered in time
        return False
