"""Stage 10, sharded and model parallel (lesson 10): the meta-device build, the tensor-parallel split, the FSDP
units, each rank's shards, and the DCP checkpoint."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, epochs_of

_SPLIT = {
    "attention.wq": "ColwiseParallel",
    "attention.wk": "ColwiseParallel",
    "attention.wv": "ColwiseParallel",
    "attention.wo": "RowwiseParallel",
    "mlp.w1": "ColwiseParallel",
    "mlp.w2": "RowwiseParallel",
}


def meta_build(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not seen["vit_on_meta"]:
        return "no ViTRegressor was built"
    if not seen["vit_on_meta"][0]:
        return (
            "the transformer was built with real memory: on the meta device it takes none until each rank "
            "allocates its own shards (a model larger than one GPU could not be built at all)"
        )
    return None


def tensor_parallel(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """With ``tp > 1`` each block's matrices are split: q, k, v and the MLP's first by columns, the rest by rows."""
    if args.get("tp", 1) <= 1:
        return None
    if not seen["tp_splits"]:
        return f"tp={args['tp']}, but no block was split over the tensor-parallel ranks"
    wrong = {name: style for name, style in seen["tp_splits"][0].items() if _SPLIT.get(name) != style}
    missing = sorted(set(_SPLIT) - set(seen["tp_splits"][0]))
    if wrong or missing:
        return (
            f"the split plan has {wrong or 'no wrong entry'}, missing {missing or 'none'}: the query, key, "
            f"value and the MLP's first layer by columns, the attention's output and the MLP's second by rows"
        )
    return None


def fsdp_units(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    units = [unit["module"] for unit in seen["fsdp_units"]]
    if not units or units[-1] != "ViTRegressor":
        return (
            f"the units sharded were {units or 'none'}: each block, then the whole model last (its embedding, "
            f"norm and head are the root's)"
        )
    if len(units) < args.get("depth", 2) + 1:
        return f"{len(units) - 1} block(s) sharded as units, in a model of depth {args.get('depth', 2)}"
    if args.get("precision") == "bf16" and seen["fsdp_units"][-1]["output_dtype"] != "torch.float32":
        return "under bf16 the whole model's output stays bf16: give the root output_dtype=torch.float32"
    return None


def allocated(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not seen["to_empty"] or not seen["init_weights"]:
        return (
            f"memory given {seen['to_empty']} time(s), weights initialised {seen['init_weights']} time(s): "
            f"each rank's shards need both, after sharding"
        )
    return None


def dcp_saved(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    epochs = epochs_of(result)
    if len(seen["dcp_saves"]) < epochs:
        return (
            f"this rank took part in {len(seen['dcp_saves'])} sharded save(s) in {epochs} epoch(s): every rank "
            f"saves its own shards, once at the end of each epoch"
        )
    if any("epoch-" not in folder for folder in seen["dcp_saves"]):
        return f"the checkpoints went to {seen['dcp_saves']}: a folder epoch-N inside checkpoint each"
    missing = [kind for kind in ("weights", "optimizer", "number") if kind not in (seen["dcp_saved"] or [[]])[-1]]
    if missing:
        return (
            f"the sharded checkpoint holds no {' and no '.join(missing)}: a resume needs the model's weights, the "
            f"optimizer's state and the epoch to go on from"
        )
    return None


STAGE = Stage(
    lesson="10",
    file="10_fsdp_tp.py",
    runs_on="ranks",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "model": "vit",
        "data_parallel": "fsdp",
    },  # (a constant LR; the ViT, sharded)
    by_numbers=((), ("10.a", "10.b", "10.c", "10.d")),
    gaps=(
        Gap(
            id="10.a",
            title="the meta-device build",
            first='with torch.device("meta"):',
            last="model = ViTRegressor(",
            asks="`model`: lesson 10's transformer for these maps, with its shapes but no memory and no values yet",
            question="A model larger than one device cannot be built whole first: where can it be built with "
            "shapes only, no memory?",
            api='with torch.device("meta"): ViTRegressor(image_size=..., width=..., depth=..., heads=...)',
            probe=meta_build,
            mistakes=(
                Variant("built with real memory", (('with torch.device("meta"):', "if True:"),)),
                Variant("built on the training device", (('with torch.device("meta"):', "with device:"),)),
                Variant("built on the CPU, then moved", (('with torch.device("meta"):', 'with torch.device("cpu"):'),)),
            ),
            alternatives=(
                Variant(
                    "the device named first",
                    (('with torch.device("meta"):', 'meta = torch.device("meta")\nwith meta:'),),
                ),
                Variant("the device by keyword", (('with torch.device("meta"):', 'with torch.device(type="meta"):'),)),
            ),
        ),
        Gap(
            id="10.b",
            title="the tensor-parallel split",
            first="if tp > 1:",
            last="parallelize_module(block",
            asks='with tp > 1, each block\'s matrices split over the tensor-parallel ranks (mesh["tp"]): the query, '
            "key and value projections and the MLP's first layer by their outputs, the attention's output and "
            "the MLP's second layer by their inputs",
            question="Two matrices in a row can be split so that only one all-reduce joins them: which is split by "
            "its outputs (columns), which by its inputs (rows), in the attention and in the MLP?",
            api='parallelize_module(block, mesh["tp"], {"attention.wq": ColwiseParallel(), ..., '
            '"mlp.w2": RowwiseParallel()})',
            probe=tensor_parallel,
        ),
        Gap(
            id="10.c",
            title="the FSDP units",
            first="for block in model.blocks:",
            last="if bf16 else MixedPrecisionPolicy())",
            asks='each block sharded over the data-parallel ranks (mesh["dp"]) as a unit of its own, then the whole '
            "model; under bf16 the parameters and compute in bf16, the gradients reduced in fp32 and the output "
            "in fp32",
            question="FSDP gathers one unit's parameters at a time: which parts of the model should be units, in "
            "which order, and in which precision is each part kept, computed and reduced?",
            api="fully_shard(module, mesh=..., mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32))",
            probe=fsdp_units,
            mistakes=(
                Variant(
                    "never sharded",
                    (
                        ('fully_shard(block, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16))', "pass"),
                        (
                            'fully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32)',
                            "pass",
                        ),
                        ("if bf16 else MixedPrecisionPolicy())", ""),
                    ),
                ),
                Variant(
                    "the blocks alone",
                    (
                        (
                            'fully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32)',
                            "pass",
                        ),
                        ("if bf16 else MixedPrecisionPolicy())", ""),
                    ),
                ),
                Variant(
                    "the whole model alone",
                    (('fully_shard(block, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16))', "pass"),),
                ),
            ),
            alternatives=(
                Variant(
                    "the blocks in a comprehension",
                    (
                        ('fully_shard(block, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16))', "pass"),
                        (
                            'fully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32)',
                            '[fully_shard(b, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16)) for b in model.blocks]\nfully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32)',
                        ),
                    ),
                ),
                Variant(
                    "keywords in another order",
                    (
                        (
                            'fully_shard(block, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16))',
                            'fully_shard(block, mp_policy=MixedPrecisionPolicy(**bf16), mesh=mesh["dp"])',
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="10.d",
            title="this rank's shards",
            first="model.to_empty(",
            last="model.init_weights(seed)",
            asks="this rank's shards get memory on the device, then their values from the seed",
            question="The model was built on the meta device and sharded: what gives each rank's shards memory, and "
            "what then gives them values?",
            api="model.to_empty(device=device); model.init_weights(seed)",
            probe=allocated,
            mistakes=(
                Variant(
                    "no memory, no values",
                    (("model.to_empty(device=device)", "pass"), ("model.init_weights(seed)", "pass")),
                ),
                Variant(
                    "values before memory",
                    (
                        ("model.init_weights(seed)", "model.to_empty(device=device)"),
                        ("model.to_empty(device=device)", "model.init_weights(seed)"),
                    ),
                ),
                Variant("memory without values", (("model.init_weights(seed)", "pass"),)),
            ),
            alternatives=(
                Variant(
                    "the device as text", (("model.to_empty(device=device)", "model.to_empty(device=str(device))"),)
                ),
                Variant(
                    "the model it returns kept",
                    (("model.to_empty(device=device)", "model = model.to_empty(device=device)"),),
                ),
            ),
        ),
        Gap(
            id="10.e",
            title="the DCP checkpoint",
            first="dcp.save(",
            last="checkpoint_id=os.path.join(",
            asks="a sharded checkpoint of the model, the optimizer and the next epoch's number, in a folder of its "
            "own per epoch (`epoch-N` in `checkpoint`), every rank writing its own shards",
            question="Each rank holds only its shards: who writes the checkpoint, into which folder, and what must "
            "it hold to resume?",
            api='dcp.save({...}, checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}")), with '
            "get_state_dict(model, optimizer)",
            probe=dcp_saved,
            mistakes=(
                Variant(
                    "never saved",
                    (
                        ('dcp.save({"model": model_state, "optimizer": optimizer_state, "epoch": epoch + 1},', "pass"),
                        ('checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}"))', ""),
                    ),
                ),
                Variant(
                    "every epoch into one folder",
                    (('checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}"))', "checkpoint_id=checkpoint)"),),
                ),
                Variant(
                    "the optimizer left out",
                    (
                        (
                            'dcp.save({"model": model_state, "optimizer": optimizer_state, "epoch": epoch + 1},',
                            'dcp.save({"model": model_state, "epoch": epoch + 1},',
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "the folder by an f-string",
                    (
                        (
                            'checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}"))',
                            'checkpoint_id=f"{checkpoint}/epoch-{epoch + 1}")',
                        ),
                    ),
                ),
                Variant(
                    "a writer for the folder",
                    (
                        (
                            'checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}"))',
                            'storage_writer=dcp.FileSystemWriter(os.path.join(checkpoint, f"epoch-{epoch + 1}")))',
                        ),
                    ),
                ),
            ),
        ),
    ),
)
