"""Stage 05, data parallel (lesson 05): the ranks' validation sums, joining the job, each rank's share, the
averaged gradients, and a new order every epoch."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, device_kind, epochs_of, steps_of


def validation_sums(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The validation's sums are added over the ranks: an all-reduce while no gradient is recorded (validation)."""
    if not seen["validation_all_reduces"]:
        return (
            "nothing was added over the ranks during validation: each rank computed the R² of its own share "
            "only (and a mean of the ranks' R² is not the R² of the whole set)"
        )
    if seen["validation_largest_reduce"] <= 1:
        return (
            "during validation the ranks added single numbers only (each rank's R²?): R² is a ratio of sums, so "
            "each target's sums are added over the ranks first, and the ratio taken after"
        )
    return None


def joined(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The process joined a group with the device's backend and a 5-minute timeout."""
    group, want = seen["process_group"], "nccl" if device_kind(args) == "cuda" else "gloo"
    if group is None:
        return "the process never joined a process group"
    if group["rank"] is not None and group["launcher_rank"] is not None and group["rank"] != group["launcher_rank"]:
        return (
            f"this process joined as rank {group['rank']}, but its launcher made it rank {group['launcher_rank']} "
            f"of the job (RANK): the number on its node (LOCAL_RANK) is another one on more than one node, and the "
            f"check runs each rank as on a node of its own"
        )
    if group["backend"] not in (want, "None") and want not in group["backend"]:
        return f"the group's backend is {group['backend']} on {device_kind(args)}: {want} there"
    if group["timeout_s"] != 300:
        return f"the group's timeout is {group['timeout_s']} s: 5 minutes (300 s), so that a missing peer ends the job"
    return None


_WHY = {
    "num_replicas": "the ranks would not split the set between them",
    "rank": "this rank would read another rank's share",
    "seed": "the order would not come from `seed`",
    "drop_last": "without it one rank can have a step more than another, and wait for its peers forever",
    "shuffle": "without shuffling every epoch reads the set in the same order",
}


def shares(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The training sampler: one share per rank of the job, shuffled from ``seed``, the remainder left out."""
    if not seen["samplers"]:
        return "no DistributedSampler was made: every rank would read the whole data set"
    sampler = seen["samplers"][0]
    want = {
        "num_replicas": sampler["job_size"],  # (None outside a process group: nothing to compare with)
        "rank": sampler["job_rank"],
        "seed": args.get("seed", 0),
        "drop_last": True,
        "shuffle": True,
    }
    wrong = [key for key in want if want[key] is not None and sampler[key] != want[key]]
    if wrong:
        key = wrong[0]
        return f"the sampler has {key}={sampler[key]}, want {want[key]}: {_WHY[key]}"
    return None


def wrapped(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not seen["ddp"]:
        return "the model was never wrapped for data parallelism: its gradients are not averaged over the ranks"
    if seen["ddp_calls"] < steps_of(result):
        return (
            f"the data-parallel model ran {seen['ddp_calls']} time(s) in {steps_of(result)} steps: the loop must call "
            f"the wrapped model, whose backward pass averages the gradients (the model inside it averages nothing)"
        )
    return None


def new_order_each_epoch(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The training sampler read the set in a new order every epoch: each iteration at a new epoch."""
    epochs = [epoch for index, epoch, shuffled in seen["sampler_iterations"] if shuffled]
    if epochs_of(result) > 1 and len(set(epochs)) < len(epochs):
        return (
            f"in {epochs_of(result)} epochs the sampler read the set at the epochs {epochs}: told the same epoch "
            f"(or told it after the loop began to read), every epoch repeats the first one's order"
        )
    return None


STAGE = Stage(
    lesson="05",
    file="05_ddp.py",
    runs_on="ranks",
    twin={"warmup_steps": 0, "decay": "none", "norm": "group", "channels_last": True},  # (a constant LR; NHWC)
    by_numbers=(("05.a",), ("05.b", "05.c", "05.d", "05.e")),
    switches=({"epochs": 2, "seed": 1},),  # (two epochs show the order; a seed other than the default, its use)
    gaps=(
        Gap(
            id="05.a",
            title="the ranks' validation sums",
            first="dist.all_reduce(sums)",
            last="dist.all_reduce(sums)",
            asks="every rank's `sums` added together, in place, so that every rank computes the R² of the whole "
            "validation set",
            question="Each rank saw a different part of the validation set: what must every rank know of the "
            "others' sums before it divides, and which collective gives it that?",
            api="dist.all_reduce(tensor) (a sum by default)",
            probe=validation_sums,
            mistakes=(
                Variant("no all-reduce", (("dist.all_reduce(sums)", "pass"),)),
                Variant("a barrier instead", (("dist.all_reduce(sums)", "dist.barrier()"),)),
                Variant(
                    "divided by the ranks, not added",
                    (("dist.all_reduce(sums)", "sums = sums / dist.get_world_size()"),),
                ),
            ),
            alternatives=(
                Variant(
                    "each row on its own", (("dist.all_reduce(sums)", "for row in sums:\n    dist.all_reduce(row)"),)
                ),
                Variant(
                    "the sum spelled out", (("dist.all_reduce(sums)", "dist.all_reduce(sums, op=dist.ReduceOp.SUM)"),)
                ),
            ),
        ),
        Gap(
            id="05.b",
            title="joining the job",
            first="dist.init_process_group(",
            last="timedelta(minutes=5)",
            asks="this process joins the job's others: the backend for this device (GPU or CPU), as rank `rank` of "
            "`world_size`, and a peer that has not come (or dies) within 5 minutes ends the job with an error",
            question="Before any collective, every process must join one group: what does each tell it (who it "
            "is, how many there are, which library talks between them, how long to wait)?",
            api='dist.init_process_group("nccl" or "gloo", rank=..., world_size=..., '
            "timeout=datetime.timedelta(minutes=5))",
            probe=joined,
            mistakes=(
                Variant(
                    "never joined",
                    (
                        (
                            'dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,',
                            "pass",
                        ),
                        (
                            'timeout=datetime.timedelta(minutes=5), device_id=device if device.type == "cuda" else None)',
                            "",
                        ),
                    ),
                ),
                Variant("nccl on a CPU", (('"nccl" if device.type == "cuda" else "gloo"', '"nccl"'),)),
                Variant("no timeout", (("timeout=datetime.timedelta(minutes=5), ", ""),)),
            ),
            alternatives=(
                Variant(
                    "backend= by keyword",
                    (
                        (
                            '("nccl" if device.type == "cuda" else "gloo"',
                            '(backend="nccl" if device.type == "cuda" else "gloo"',
                        ),
                    ),
                ),
                Variant(
                    "the timeout in seconds", (("datetime.timedelta(minutes=5)", "datetime.timedelta(seconds=300)"),)
                ),
            ),
        ),
        Gap(
            id="05.c",
            title="each rank's share",
            first="sampler = DistributedSampler(",
            last="sampler = DistributedSampler(",
            asks="`sampler`: each rank a different share of the training set, shuffled from `seed`, and every rank "
            "the same number of samples (the remainder left out)",
            question="How does each rank know which samples are its own, in what order, and what if the set does "
            "not split evenly?",
            api="DistributedSampler(train_set, num_replicas=..., rank=..., seed=..., drop_last=True)",
            probe=shares,
            mistakes=(
                Variant("without drop_last", ((", drop_last=True)", ")"),)),
                Variant("the seed left out", ((", seed=seed", ""),), {"seed": 1}),
                Variant("a fixed number of ranks", (("num_replicas=world_size", "num_replicas=2"),)),
            ),
            alternatives=(
                Variant(
                    "the ranks from the process group",
                    (
                        (
                            "sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)",
                            "sampler = DistributedSampler(train_set, seed=seed, drop_last=True)",
                        ),
                    ),
                ),
                Variant(
                    "keywords in another order",
                    (
                        (
                            "sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)",
                            "sampler = DistributedSampler(dataset=train_set, drop_last=True, shuffle=True, seed=seed, rank=rank, num_replicas=world_size)",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="05.d",
            title="the averaged gradients",
            first="ddp_model = DistributedDataParallel(",
            last="ddp_model = DistributedDataParallel(",
            asks="`ddp_model`: the model, whose gradients are averaged over the ranks while the backward pass runs "
            "(on a GPU, it is told which device this rank uses)",
            question="Each rank computes gradients of its own batch: what makes them the average over all ranks, "
            "during the backward pass rather than after it?",
            api="DistributedDataParallel(model, device_ids=[device.index] or None)",
            probe=wrapped,
            mistakes=(
                Variant(
                    "never wrapped",
                    (
                        (
                            'ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)',
                            "ddp_model = model",
                        ),
                    ),
                ),
                Variant(
                    "device_ids on a CPU",
                    (('device_ids=[device.index] if device.type == "cuda" else None', "device_ids=[local_rank]"),),
                ),
                Variant(
                    "the wrapper thrown away",
                    (
                        (
                            'ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)',
                            "DistributedDataParallel(model)\nddp_model = model",
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "a short name",
                    (
                        (
                            'ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)',
                            "from torch.nn.parallel import DistributedDataParallel as DDP\nddp_model = DDP(model)",
                        ),
                    ),
                ),
                Variant(
                    "device_ids by an if",
                    (
                        (
                            'ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)',
                            'ddp_model = DistributedDataParallel(model) if device.type == "cpu" else DistributedDataParallel(model, device_ids=[device.index])',
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="05.e",
            title="a new order every epoch",
            first="sampler.set_epoch(epoch)",
            last="sampler.set_epoch(epoch)",
            asks="a new order every epoch, the same one on every rank",
            question="The sampler's shuffle is seeded: what must change between epochs for the order to change, "
            "the same way on every rank, and when must the sampler hear of it?",
            api="sampler.set_epoch(epoch)",
            probe=new_order_each_epoch,
            mistakes=(
                Variant("never told", (("sampler.set_epoch(epoch)", "pass"),)),
                Variant("told epoch 0 every time", (("sampler.set_epoch(epoch)", "sampler.set_epoch(0)"),)),
                Variant("told the seed", (("sampler.set_epoch(epoch)", "sampler.set_epoch(seed)"),)),
            ),
            alternatives=(
                Variant("by keyword", (("sampler.set_epoch(epoch)", "sampler.set_epoch(epoch=epoch)"),)),
                Variant(
                    "only where the sampler has it",
                    (("sampler.set_epoch(epoch)", 'if hasattr(sampler, "set_epoch"):\n    sampler.set_epoch(epoch)'),),
                ),
            ),
        ),
    ),
)
