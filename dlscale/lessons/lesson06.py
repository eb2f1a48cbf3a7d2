"""Lesson 06, Horovod: its question and exercise checks (06.1, 06.2)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.lessons.lesson_tools import Question, passed, regression_problem, require_filled_in

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "HOROVOD_SAME",
    "check_fp16_compression",
    "check_horovod_loop",
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


def check_horovod_loop(train_with_horovod: Callable[[int, float], dict]) -> None:
    """06.1: the loop on 2 Horovod ranks takes the steps one process takes on all the data."""
    from dlscale.distributed.horovod_backend import run

    require_filled_in(train_with_horovod)
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
