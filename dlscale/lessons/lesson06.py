"""Lesson 06, Horovod: its question and exercise checks (06.1, 06.2)."""

from __future__ import annotations

import inspect
import io
import os
import textwrap
import tokenize
from collections.abc import Callable
from typing import Any

import torch

from dlscale.lessons.lesson_tools import Question, passed, regression_problem, require_filled_in

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "HOROVOD_SAME",
    "allreduce_gloo_then_horovod",
    "check_fp16_compression",
    "check_horovod_loop",
    "stage_then_twin",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _horovod_same(difference: float) -> str:
    return "a" if difference < 1e-4 else "b"


HOROVOD_SAME = Question(
    "Horovod averages the gradients through the optimizer, DDP through the model; after the same "
    "steps on 2 ranks, Horovod's weights against one process's differ by...",
    {"a": "rounding only (below 1e-4)", "b": "more: Horovod trains another model"},
    _horovod_same,
)

# -- the exercises' checks -----------------------------------------------------------------------------------


def _one_process_loop(steps: int, lr: float) -> torch.nn.Module:
    """06.1's loop in one process on all the data, from rank 0's starting model."""
    x, y = regression_problem()
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model


#: The loops 06.1's check passed in this process, by their code (their tokens, comments aside): the same loop checked
#: again (the solution notebook run after the lesson in its kernel, or the cell run twice) passes without starting the
#: ranks again.
_PASSED_LOOPS: set[tuple[tuple[int, str], ...]] = set()


def _loop_key(function: Callable) -> tuple[tuple[int, str], ...] | None:
    """The function's tokens without its comments and blank lines (None without a source to read)."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return tuple((t.type, t.string) for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL))
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return None


def check_horovod_loop(train_with_horovod: Callable[[int, float], dict]) -> None:
    """06.1: the loop on 2 Horovod ranks takes the steps one process takes on all the data.

    A loop whose source and code this check already passed in this process passes again without starting the ranks
    (it says so): the ranks' start is most of the check's time, and the same code trains the same steps."""
    from dlscale.distributed.horovod_backend import run

    require_filled_in(train_with_horovod)
    key = _loop_key(train_with_horovod)
    if key is not None and key in _PASSED_LOOPS:
        print("(this same loop passed this check above, on 2 Horovod ranks: they are not started again for it)")
        passed("06.1")
        return
    steps, lr = 10, 0.1
    results = run(train_with_horovod, 2, steps, lr)
    n = len(regression_problem()[0])
    assert [r["samples"] for r in results] == [n // 2, n // 2], (
        f"ranks trained on {[r['samples'] for r in results]} samples; each should keep its own half: "
        f"x[hvd.rank()::hvd.size()]"
    )
    spread = float((results[0]["weight"] - results[1]["weight"]).abs().max())
    assert spread < 1e-6, (
        f"the two ranks ended with different weights (by {spread:.2g}): broadcast rank 0's parameters "
        f"(hvd.broadcast_parameters) and wrap the optimizer in hvd.DistributedOptimizer so gradients are averaged"
    )
    reference = _one_process_loop(steps, lr)
    gap = float((results[0]["weight"] - reference.weight.detach()).abs().max())
    assert gap < 1e-5, (
        f"the ranks agree, but differ from one process on all the data by {gap:.2g}: the averaged gradient of the "
        f"two halves is the whole batch's gradient, so start from rank 0's model and average with op=hvd.Average"
    )
    if key is not None:
        _PASSED_LOOPS.add(key)
    passed("06.1")


def check_fp16_compression(compress_report: Callable[[torch.Tensor], dict]) -> None:
    """06.2: bytes sent and the largest relative error when a gradient travels through Compression.fp16."""
    generator = torch.Generator().manual_seed(6)
    grad = torch.randn(10_000, generator=generator) * torch.logspace(-4, 0, 10_000)
    report = compress_report(grad)
    assert report["bytes_sent"] == grad.numel() * 2, (
        f"bytes_sent {report['bytes_sent']}: an fp16 value takes 2 bytes (the fp32 gradient takes 4)"
    )
    rounded = grad.half().float()
    expected = float(((rounded - grad).abs() / grad.abs()).max())
    assert abs(report["max_relative_error"] - expected) <= 1e-3 * expected, (
        f"max_relative_error {report['max_relative_error']:.3g}, expected {expected:.3g}: compress, decompress, "
        f"then max(|back - grad| / |grad|)"
    )
    passed("06.2")


# -- what the ranks run: two measurements for one start of the ranks ----------------------------------------------


def stage_then_twin(
    stage_file: str, twin_stage: str, settings: dict[str, Any], checkpoint: str, twin_name: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """On each of Horovod's ranks: the attendee's stage (:func:`~dlscale.lessons.stage_probes.run_stage`, with
    ``settings`` and ``checkpoint``), then ``dlscale.train`` with the same settings on the same ranks
    (:func:`~dlscale.lessons.parity.engine_twin`), the reference :func:`~dlscale.lessons.stage_check.check_stage`
    compares it with. Horovod stays up between the two runs, so one start of the ranks serves both (each start costs
    every rank seconds of imports). After a stage that stopped there is no reference to take: the check names the gap
    from the stage's own run, and the twin is None."""
    from dlscale.lessons.parity import engine_twin
    from dlscale.lessons.stage_probes import run_stage

    mine = run_stage(stage_file, checkpoint=checkpoint, **settings)
    if mine["error"]:
        return mine, None
    return mine, engine_twin(twin_stage, name=twin_name, **settings)


def allreduce_gloo_then_horovod(
    sizes: list[int], port: int, device: str = "auto", master: str = "127.0.0.1"
) -> tuple[list[dict], list[dict]]:
    """On each of Horovod's ranks: lesson 05's all-reduce benchmark (:func:`~dlscale.bench.allreduce.bench_allreduce`)
    through torch.distributed (gloo on CPUs, NCCL on GPUs), then the same sizes through Horovod, in the same processes:
    one start of the ranks for both libraries. The ranks form torch's group first, as torchrun's variables describe
    it (``master``:``port``, a port the caller found free), and leave it before Horovod starts."""
    from dlscale import distributed
    from dlscale.bench.allreduce import bench_allreduce

    as_torchrun = {
        "DLSCALE_LAUNCHER": "torchrun",
        "RANK": os.environ["HOROVOD_RANK"],
        "WORLD_SIZE": os.environ["HOROVOD_SIZE"],
        "LOCAL_RANK": os.environ.get("HOROVOD_LOCAL_RANK", "0"),
        "LOCAL_WORLD_SIZE": os.environ.get("HOROVOD_LOCAL_SIZE", os.environ["HOROVOD_SIZE"]),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
    }
    saved = {name: os.environ.get(name) for name in as_torchrun}
    os.environ.update(as_torchrun)
    try:
        through_torch = bench_allreduce(sizes, device, data_parallel="ddp")
        distributed.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return through_torch, bench_allreduce(sizes, device, data_parallel="horovod")
