"""A rank of a checked stage that waits for a peer that never comes is bounded in seconds and named (#75): run_stage
bounds gloo's collectives (DLSCALE_CHECK_WAIT_S), so a save or an all-reduce on one rank alone ends in an error the
check traces to its line, not in the stage's own 5-minute wait."""

from __future__ import annotations

import multiprocessing
import os
import time

from dlscale.distributed import free_port

#: A stage whose rank 1 never reaches rank 0's all-reduce (it is busy elsewhere for longer than the bound).
STAGE = """
import datetime, os, time
import torch
import torch.distributed as dist


def main(seconds_away: float = 5.0) -> dict:
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2, timeout=datetime.timedelta(minutes=5))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(seconds_away)
    return {"losses": [], "r2": []}
"""


def _rank(rank: int, port: int, path: str, answers: multiprocessing.Queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["DLSCALE_CHECK_WAIT_S"] = "1"
    from dlscale.lessons.stage_probes import run_stage

    start = time.monotonic()
    result = run_stage(path)
    answers.put((rank, result["error"], time.monotonic() - start))  # (the seconds: for a reader, not asserted)


def test_a_rank_waiting_for_a_collective_its_peer_skipped_stops_within_the_bound(tmp_path):
    path = tmp_path / "stage.py"
    path.write_text(STAGE)
    context = multiprocessing.get_context("spawn")
    answers, port = context.Queue(), free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, str(path), answers)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    found = dict((rank, (error, seconds)) for rank, error, seconds in (answers.get(timeout=120) for _ in ranks))
    for process in ranks:
        process.join(timeout=60)
    error, _ = found[0]
    # timed out at the bound: unbounded, rank 0 would wait out rank 1's 5 s and then read a closed connection
    assert error is not None and "timed out" in error["message"].lower(), error
    assert [frame["text"] for frame in error["frames"]][-1] == "dist.all_reduce(torch.ones(1))"
