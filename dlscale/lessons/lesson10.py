"""Lesson 10, sharded and model parallel: its question, reading, conclusion and exercise checks (10.1-10.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dlscale.lessons.lesson_tools import Question, Reading, as_number, on_two_engines, passed

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "FSDP_MEMORY",
    "SHARD_SHARE",
    "check_fsdp_sharding",
    "check_mlp_forward",
    "check_shard_mlp",
    "memory_conclusion",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _fsdp_memory(rows: list[dict[str, Any]]) -> str | None:
    row = next((r for r in rows if r["layout"].startswith("FSDP") and r["processes"] == 2), None)
    if row is None:
        return None
    return "a" if row["held_vs_ddp"] >= 0.75 else "b" if row["held_vs_ddp"] >= 0.375 else "c"


FSDP_MEMORY = Question(
    "on 2 ranks, what FSDP holds per rank (parameters, gradients, optimizer state), against DDP, is...",
    {"a": "about the same", "b": "about half", "c": "about a quarter"},
    _fsdp_memory,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _shard_share(shares: dict[str, float]) -> tuple[Callable[[Any], bool], str]:
    percent = [100 * share for share in shares.values()]
    shows = (
        f"the ranks' files hold {', '.join(f'{p:.0f}%' for p in percent)} of the bytes of the checkpoint's "
        f"{len(percent)} shard files"
    )
    return (lambda answer: (n := as_number(answer)) is not None and all(abs(n - p) <= 10 for p in percent)), shows


SHARD_SHARE = Reading(
    "what share of the checkpoint's bytes did each of your FSDP ranks write, in percent?",
    "a number, within 10 of each rank's",
    _shard_share,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def memory_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """The memory table (``bench_memory``): what each sharded layout holds and costs against DDP on as many ranks."""
    lines = []
    for row in rows:
        if row["layout"].startswith(("1 process", "DDP")):
            continue
        lines.append(
            f"{row['layout']}: each rank holds {row['held_vs_ddp']:.2f}x the parameters, gradients and "
            f"optimizer state of DDP on {row['processes']} ranks (1/{row['processes']} would be "
            f"{1 / row['processes']:.2f}), and a step takes {row['step_vs_ddp']:.2f}x as long"
        )
    return lines


# -- 10.1 and 10.2: tensor parallelism by hand ---------------------------------------------------------------


#: The shards of rank 0 of 2 in the column-then-row split of :func:`mlp_weights`'s MLP: w1, b1, w2, b2.
_MLP_SHARDS = [(16, 8), (16,), (8, 16), (8,)]


def mlp_weights(width: int = 8, hidden: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    """10.1 and 10.2's MLP ``y = w2 · gelu(w1 · x + b1) + b2`` and an input batch, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"w1": (hidden, width), "b1": (hidden,), "w2": (width, hidden), "b2": (width,), "x": (5, width)}
    return {name: torch.randn(*shape, generator=generator, dtype=torch.float64) for name, shape in shapes.items()}


def mlp_reference(w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The MLP in one process, unsharded."""
    return torch.nn.functional.gelu(w["x"] @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]


def _tensor_parallel_on_rank(shard_mlp: Callable | None, mlp_forward: Callable | None) -> dict[str, Any]:
    """Run on one engine: a 1-D mesh over the job, the learner's sharding or forward, the result on this rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from dlscale import distributed

    distributed.init("cpu")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        w = mlp_weights()
        if shard_mlp is not None:  # 10.1: the learner's placements, then the column-then-row forward
            shards = shard_mlp(w["w1"], w["b1"], w["w2"], w["b2"], mesh)
            if not all(isinstance(t, DTensor) for t in shards):
                return {"error": "return four DTensors (distribute_tensor(tensor, mesh, [placement]))"}
            w1, b1, w2, b2 = (t.to_local() for t in shards)
            shapes = [tuple(t.shape) for t in (w1, b1, w2, b2)]
            if shapes != _MLP_SHARDS:  # (the forward would fail on the shapes; the check explains them)
                return {"shapes": shapes}
            partial = torch.nn.functional.gelu(w["x"] @ w1.T + b1) @ w2.T
            dist.all_reduce(partial)
            return {"y": partial + b2, "shapes": shapes}
        # 10.2: the check's own (right) shards, the learner's forward and collective
        w1 = distribute_tensor(w["w1"], mesh, [Shard(0)]).to_local()
        b1 = distribute_tensor(w["b1"], mesh, [Shard(0)]).to_local()
        w2 = distribute_tensor(w["w2"], mesh, [Shard(1)]).to_local()
        b2 = distribute_tensor(w["b2"], mesh, [Replicate()]).to_local()
        return {"y": mlp_forward(w["x"], w1, b1, w2, b2)}
    finally:
        distributed.shutdown(drain=False)


def check_shard_mlp(shard_mlp: Callable) -> None:
    """10.1: placements that make the column-then-row MLP on 2 real ranks equal the unsharded one."""
    answers = on_two_engines(_tensor_parallel_on_rank, shard_mlp, None)
    if "error" in answers[0]:
        raise AssertionError(answers[0]["error"])
    expected = mlp_reference(mlp_weights())
    shapes = answers[0]["shapes"]
    assert shapes == _MLP_SHARDS, (
        f"rank 0 holds shards of shapes {shapes}; column-wise w1 keeps whole rows (Shard(0): 16 of its 32 rows) "
        f"and its bias with them (Shard(0)); row-wise w2 keeps the matching input columns (Shard(1)); b2 is added "
        f"once after the sum, so every rank keeps all of it (Replicate())"
    )
    for rank, answer in enumerate(answers):
        difference = float((answer["y"] - expected).abs().max())
        assert difference < 1e-9, f"rank {rank}'s output differs from the unsharded MLP by {difference:.2e}"
    passed("10.1")


def check_mlp_forward(mlp_forward: Callable) -> None:
    """10.2: the forward pass on this rank's shards, with the one collective it needs, on 2 real ranks."""
    answers = on_two_engines(_tensor_parallel_on_rank, None, mlp_forward)
    expected = mlp_reference(mlp_weights())
    for rank, answer in enumerate(answers):
        y = answer["y"]
        assert tuple(y.shape) == tuple(expected.shape), (
            f"rank {rank} returned shape {tuple(y.shape)}, expected {tuple(expected.shape)}"
        )
        difference = float((y - expected).abs().max())
        assert difference < 1e-9, (
            f"rank {rank}'s output differs from the unsharded MLP by {difference:.2e}: each rank's w2 shard gives a "
            f"partial sum; all-reduce (SUM) it before adding b2, and add b2 only once"
        )
    passed("10.2")


# -- 10.3: FSDP2 on the transformer's blocks -----------------------------------------------------------------


def _small_vit() -> nn.Module:
    from dlscale.models import ViTRegressor

    torch.manual_seed(0)
    return ViTRegressor(image_size=8, patch_size=4, width=16, depth=2, heads=2)


def _vit_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(10)
    return [(torch.randn(8, 1, 8, 8, generator=generator), torch.randn(8, 3, generator=generator)) for _ in range(3)]


def _train_vit(model: nn.Module, rank: int = 0, ranks: int = 1) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _vit_batches():
        share = slice(rank * len(x) // ranks, (rank + 1) * len(x) // ranks)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[share]), y[share])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _fsdp_on_rank(shard: Callable) -> dict[str, Any]:
    """Run on an engine: the learner's sharding of the small ViT, which units it made, and its training losses."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from dlscale import distributed

    distributed.init("cpu")
    finished = False
    try:
        model = _small_vit()
        shard(model, init_device_mesh("cpu", (dist.get_world_size(),)))
        units = {"blocks": [isinstance(b, FSDPModule) for b in model.blocks], "root": isinstance(model, FSDPModule)}
        local = _train_vit(model, int(os.environ["RANK"]), dist.get_world_size())
        mean = torch.tensor(local)
        dist.all_reduce(mean)
        finished = True
        return {**units, "losses": (mean / dist.get_world_size()).tolist()}
    finally:
        distributed.shutdown(drain=finished)  # (after a failure a peer may be stuck: no barrier then)


def check_fsdp_sharding(shard: Callable[[nn.Module, Any], None]) -> None:
    """10.3: fully_shard on each block, then on the root, over the mesh: 2 ranks train as one process does."""
    try:
        ranks = on_two_engines(_fsdp_on_rank, shard)
    except Exception as err:  # (FSDP2 refuses a root sharded before its blocks)
        if "NotImplementedError" in type(err).__name__:
            raise
        raise AssertionError(
            f"sharding failed on the ranks ({str(err)[:300]}): call fully_shard(block, mesh=mesh) "
            f"for each block first, then fully_shard(model, mesh=mesh)"
        ) from None
    result = ranks[0]
    assert all(result["blocks"]), (
        "the blocks are not FSDP units: with only the root sharded, every parameter is gathered at once and the "
        "memory saving is lost. Call fully_shard(block, mesh=mesh) on each of model.blocks"
    )
    assert result["root"], (
        "the root is not sharded: the patch embedding, the norm and the head stay whole on every "
        "rank, and their gradients are never averaged. Call fully_shard(model, mesh=mesh) last"
    )
    expected = _train_vit(_small_vit())
    assert all(abs(a - b) < 1e-5 for a, b in zip(result["losses"], expected)), (
        f"the sharded ranks' losses {result['losses']} differ from one process's {expected}"
    )
    passed("10.3")
