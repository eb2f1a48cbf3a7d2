"""Stage 06, Horovod (lesson 06): joining Horovod, its optimizer, and rank 0's weights."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant


def horovod_joined(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not seen["hvd_init"]:
        return "Horovod was never initialised in this process"
    if seen["hvd_asked_before_init"]:
        return (
            f"Horovod was asked for hvd.{seen['hvd_asked_before_init'][0]}() before hvd.init(): in a fresh process "
            "that call fails (here a Horovod an earlier run left up answered)"
        )
    return None


def horovod_optimizer(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Horovod's optimizer, averaging by name, once every ``accumulate`` backward passes."""
    if not seen["hvd_optimizers"]:
        return "the optimizer is not Horovod's: its gradients are not averaged over the ranks"
    made = seen["hvd_optimizers"][-1]
    if not made["averaged"]:
        return f"Horovod's optimizer takes op={made['op']}: the ranks' gradients are averaged (hvd.Average)"
    if made["backward_passes_per_step"] != args.get("accumulate", 1):
        return (
            f"Horovod's optimizer averages every {made['backward_passes_per_step']} backward pass(es), with "
            f"accumulate={args.get('accumulate', 1)}"
        )
    return None


def broadcast(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not seen["broadcasts"]:
        return (
            "rank 0's weights were never broadcast: each rank starts from its own initialisation (here the "
            "ranks happen to be seeded alike; in your own code they are not)"
        )
    return None


STAGE = Stage(
    lesson="06",
    file="06_horovod.py",
    runs_on="ranks",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "norm": "group",
        "channels_last": False,
        "data_parallel": "horovod",
    },  # (Horovod reduces contiguous tensors only: the default layout)
    by_numbers=((), ("06.b", "06.c")),
    gaps=(
        Gap(
            id="06.a",
            title="joining Horovod",
            first="hvd.init()",
            last="rank, world_size, local_rank = hvd.rank()",
            asks="this process joins Horovod's job; then `rank`, `world_size` and `local_rank` (its rank on the node) "
            "from Horovod",
            question="Horovod, like torch.distributed, must start before any collective: which call starts it, and "
            "which three numbers does each process then ask it for?",
            api="hvd.init(); hvd.rank(), hvd.size(), hvd.local_rank()",
            probe=horovod_joined,
            mistakes=(
                Variant("never joined", (("hvd.init()", "pass"),)),
                Variant(
                    "joined after asking",
                    (
                        ("hvd.init()", "pass"),
                        (
                            "rank, world_size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()",
                            "rank, world_size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()\nhvd.init()",
                        ),
                    ),
                ),
                Variant("the call forgotten", (("hvd.init()", "hvd.init"),)),
            ),
            alternatives=(
                Variant(
                    "one line each",
                    (
                        (
                            "rank, world_size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()",
                            "rank = hvd.rank()\nworld_size = hvd.size()\nlocal_rank = hvd.local_rank()",
                        ),
                    ),
                ),
                Variant("joined, then checked", (("hvd.init()", "hvd.init()\nassert hvd.is_initialized()"),)),
            ),
        ),
        Gap(
            id="06.b",
            title="Horovod's optimizer",
            first="optimizer = hvd.DistributedOptimizer(",
            last="op=hvd.Average, backward_passes_per_step",
            asks="`optimizer`: the earlier stages' optimizer over `groups` at `lr`, wrapped so that Horovod averages "
            "each gradient over the ranks (by name), once every `accumulate` backward passes",
            question="Where does Horovod average the gradients, if not in the model? How does it match each "
            "gradient across ranks, and how often should it average with accumulation?",
            api="hvd.DistributedOptimizer(torch.optim.AdamW(groups, lr=lr), named_parameters=..., op=hvd.Average, "
            "backward_passes_per_step=...)",
            probe=horovod_optimizer,
            mistakes=(
                Variant(
                    "a plain AdamW",
                    (
                        (
                            "optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(groups, lr=lr), named_parameters=model.named_parameters(),",
                            "optimizer = torch.optim.AdamW(groups, lr=lr)",
                        ),
                        ("op=hvd.Average, backward_passes_per_step=accumulate)", ""),
                    ),
                ),
                Variant("summed, not averaged", (("op=hvd.Average", "op=hvd.Sum"),)),
                Variant(
                    "averaged every backward pass",
                    (("backward_passes_per_step=accumulate", "backward_passes_per_step=1"),),
                    {"accumulate": 2},
                ),
            ),
            alternatives=(
                Variant("the average left as the default", (("op=hvd.Average, ", ""),)),
                Variant(
                    "the inner optimizer named first",
                    (
                        (
                            "optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(groups, lr=lr), named_parameters=model.named_parameters(),",
                            "base = torch.optim.AdamW(groups, lr=lr)\noptimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="06.c",
            title="rank 0's weights",
            first="hvd.broadcast_parameters(",
            last="hvd.broadcast_parameters(",
            asks="every rank starts from the same weights: rank 0's",
            question="Each process initialised its own model: what makes every rank start from the same weights?",
            api="hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
            probe=broadcast,
            mistakes=(
                Variant("never broadcast", (("hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "pass"),)),
                Variant(
                    "the optimizer's state only",
                    (
                        (
                            "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
                            "hvd.broadcast_optimizer_state(optimizer, root_rank=0)",
                        ),
                    ),
                ),
                Variant("from a rank that is not there", (("root_rank=0)", "root_rank=world_size)"),)),
            ),
            alternatives=(
                Variant(
                    "the named parameters",
                    (
                        (
                            "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
                            "hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)",
                        ),
                    ),
                ),
                Variant(
                    "by keyword",
                    (
                        (
                            "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
                            "hvd.broadcast_parameters(params=model.state_dict(), root_rank=0)",
                        ),
                    ),
                ),
            ),
        ),
    ),
)
