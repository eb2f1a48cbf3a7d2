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
from typing import Any

from dlscale.distributed.process_group import tcp_store

#: How long a rank waits for its peers' answers (and rank 0, for them to read): ranks that ran to their end reach the
#: question within moments of each other; a rank whose run failed answers no and asks nothing, so a peer still
#: inside its run (waiting out the stage's collective timeout) answers later, and alone
AGREE_TIMEOUT_S = 120.0

#: How often a rank looks at its peers' answers
POLL_S = 0.01


def every_rank_says_yes(yes: bool, port: int, timeout_s: float = AGREE_TIMEOUT_S) -> bool:
    """Whether every rank of this job (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``) said yes: the same answer on all
    of them, unless one stops answering midway (then no). A no is known as soon as one rank says it; a rank that
    does not answer within ``timeout_s`` counts as a no. Rank 0 holds the store on ``port``."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + timeout_s
    try:
        store = tcp_store(
            os.environ.get("MASTER_ADDR", "127.0.0.1"), port, size, rank == 0, datetime.timedelta(seconds=timeout_s)
        )
        store.set(f"yes/{rank}", "1" if yes else "0")
        answer = _answer(store, size, deadline) if yes else False
        store.add("read", 1)
        if rank == 0:  # the store lives in this process: keep it until every rank has read (or the time is up)
            while store.add("read", 0) < size and time.monotonic() < deadline:
                time.sleep(POLL_S)
        return answer
    except RuntimeError:  # (DistStoreError is one) a store that is gone, or a peer never reached
        return False


def _answer(store: Any, size: int, deadline: float) -> bool:
    """True once every rank said yes; False at the first no, or at ``deadline``."""
    keys = [f"yes/{peer}" for peer in range(size)]
    while time.monotonic() < deadline:
        said = [store.get(key) for key in keys if store.check([key])]
        if b"0" in said:
            return False
        if len(said) == size:
            return True
        time.sleep(POLL_S)
    return False
