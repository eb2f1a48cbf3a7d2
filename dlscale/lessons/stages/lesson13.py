"""Stage 13, the pipeline (lesson 13): this rank's stages of the model, each stage's sends, the schedule, and a
step through the pipeline.

Every probe reads what the watch saw on one rank (:func:`~dlscale.lessons.stage_probes.watch`): the modules handed to
``PipelineStage`` (which of the ViT's layers each holds, by their names), the stage numbers and the group, the
schedule made, and each step's call. A pipeline of one stage sends nothing, so the stage's gaps show on two ranks
or more (the lesson's engines; tests/integration/test_recipes.py tries its variants there).
"""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, steps_of

#: The schedule each ``--schedule`` names, as torch.distributed.pipelining calls its class.
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B"}


def _layout(seen: dict[str, Any], args: dict[str, Any]) -> tuple[int, int, list[int]]:
    """(stages in the pipeline, stages per rank, this rank's stage numbers), from its place among the ranks: the
    tp ranks of a stage consecutive, each rank ``r`` of the pipeline holding stages ``r, r + pp, ...``."""
    group = seen["process_group"] or {}
    world = int(group.get("world_size") or 1)
    rank = group.get("launcher_rank")
    rank = int(group.get("rank") or 0) if rank is None else int(rank)
    tp = int(args.get("tp", 1) or 1)
    pp = max(1, world // tp)
    virtual = int(args.get("stages_per_rank", 1) or 1) if args.get("schedule") == "interleaved-1f1b" else 1
    return pp, virtual, [rank // tp + round_ * pp for round_ in range(virtual)]


def rank_stages(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """This rank holds its stages (one, or ``stages_per_rank`` round-robin), each a run of consecutive blocks as even as they
    divide, the first stage with the embedding and the last with the head."""
    made = seen["pipeline_stages"]
    if not made:
        return None  # (no PipelineStage at all: 13.b names it)
    pp, virtual, ids = _layout(seen, args)
    total, depth = pp * virtual, int(args.get("depth", 4))
    if len(made) < virtual and result.get("error"):
        return None  # (a PipelineStage refused its numbers: its error names 13.b)
    if len(made) != virtual:
        return (
            f"this rank holds {len(made)} stage(s): in a pipeline of {pp} rank(s) each holds "
            f"{'one' if virtual == 1 else f'{virtual}, round-robin (rank r: stages r, r + {pp}, ...)'}"
        )
    low, high = depth // total, -(-depth // total)
    for place, stage in zip(ids, made):
        blocks = stage["blocks"]
        if not blocks or blocks != list(range(blocks[0], blocks[-1] + 1)) or not low <= len(blocks) <= high:
            return (
                f"stage {place} of {total} holds blocks {blocks}: each stage a run of consecutive blocks, "
                f"{low}{'' if low == high else f' or {high}'} of the {depth}"
            )
        if not place * low <= blocks[0] <= place * high:
            return f"stage {place} of {total} holds blocks {blocks}: the stages hold the blocks in order"
        if stage["embeds"] != (place == 0) or stage["head"] != (place == total - 1):
            return (
                f"stage {place} of {total} holds {'the' if stage['embeds'] else 'no'} embedding and "
                f"{'the' if stage['head'] else 'no'} head: the first stage embeds the maps, the last ends in the head"
            )
    return None


def stage_sends(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Each of this rank's stages knows its number, the pipeline's length and the pipeline's ranks (its group)."""
    made = seen["pipeline_stages"]
    pp, virtual, ids = _layout(seen, args)
    if not made:  # (where PipelineStage refused its arguments, its error says why)
        return None if result.get("error") else "no PipelineStage was built on this rank: nothing sends to the next"
    for want, stage in zip(ids, made):
        if stage["index"] != want or stage["stages"] != pp * virtual:
            return (
                f"a stage of this rank was numbered {stage['index']} of {stage['stages']}: it is stage {want} "
                f"of {pp * virtual} (its place in the pipeline, not among all ranks)"
            )
        if stage["group_size"] not in (None, pp):
            return (
                f"the stages send among {stage['group_size']} ranks: the pipeline's group holds its {pp} stage "
                f"rank(s) (the others split a stage's matrices)"
            )
    return None


def schedule_made(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The schedule ``--schedule`` names, cutting each batch into ``--microbatches``, with the loss to compute."""
    made = seen["pipeline_schedules"]
    if not made:
        return "no pipeline schedule was made"
    kind, want = made[-1], SCHEDULE_CLASSES.get(args.get("schedule", "1f1b"))
    if kind["kind"] != want:
        return f"schedule={args.get('schedule', '1f1b')!r} ran {kind['kind']}: the schedule the argument names"
    if kind["microbatches"] != args.get("microbatches", 4):
        return (
            f"the schedule cut each batch into {kind['microbatches']} micro-batch(es), asked for "
            f"{args.get('microbatches', 4)}"
        )
    if not kind["loss_fn"]:
        return "the schedule was given no loss: the last stage computes each micro-batch's loss and its gradient"
    return None


def pipeline_step(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Each step: the first stage fed the maps, the last the targets; the loss every rank logs is the mean of the last
    stage's micro-batches' losses (kept in a list the step is given, or computed again from its output)."""
    steps = seen["pipeline_steps"]
    if len(steps) < steps_of(result):
        return f"the schedule stepped {len(steps)} time(s) in {steps_of(result)} logged steps: once per batch"
    for step in steps:
        if step["firsts"] and not step["inputs"]:
            return "the first stage was handed no maps: it feeds the batch into the pipeline"
        if step["lasts"] and not step["target"]:
            return "the last stage was handed no targets: it compares each micro-batch's output with them"
    logged = result.get("losses") or []
    kept = [step["loss"] for step in steps if step.get("loss") is not None]
    if kept and logged and len(kept) >= len(logged):
        worst = max(abs(a - b) for a, b in zip(logged, kept))
        if worst > 1e-5 * max(1.0, max(abs(b) for b in kept)):
            return (
                f"the last stage's micro-batches averaged {kept[0]:.4f} at the first step, but {logged[0]:.4f} was "
                f"logged: every rank logs the last stage's loss (the other stages compute none)"
            )
    return None


_STAGES_LINE = "parts = [model.pipeline_stage(runs[i].tolist(), first=i == 0, last=i == total - 1) for i in ids]"
_SEND_LINE = "stages = [PipelineStage(part, i, total, device, group=group) for part, i in zip(parts, ids)]"
_KIND_LINE = 'kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]'
_RUNNER_LINE = "runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)"
_STEP_LINE = "runner.step(*([x] if ends[0] else []), target=y if ends[1] else None, losses=losses)"
_BROADCAST_LINE = "dist.broadcast(loss, src=last_rank, group=group)"

STAGE = Stage(
    lesson="13",
    file="13_pipeline.py",
    runs_on="ranks",
    check_ranks=2,
    judged_before_errors=("13.a", "13.b"),  # (a step on a wrong stage fails in the step's line)
    twin={"warmup_steps": 0, "decay": "none", "model": "vit", "pipeline_parallel": "every other rank"},
    # every switch the stage takes: the other schedules (interleaved on two stages per rank), tensor parallelism
    switches=({"schedule": "gpipe"}, {"schedule": "interleaved-1f1b", "stages_per_rank": 2}, {"tp": 2}),
    switch_samples=32,  # (one step each: the tensor-parallel run steps slowly on a CPU, its DTensors per operator)
    by_numbers=((), ("13.a", "13.b", "13.c", "13.d")),
    gaps=(
        Gap(
            id="13.a",
            title="this rank's stages",
            first="ids = [place + round_ * pp",
            last="parts = [model.pipeline_stage(",
            asks="`parts`: this rank's stages of `model` (one; `stages_per_rank` with interleaved-1f1b, placed round-robin: "
            "rank r holds stages r, r + pp, ...), each a run of consecutive blocks, as even as they divide; the "
            "first stage also embeds the maps, the last also ends in the head",
            question="A pipeline of pp × stages_per_rank stages: which stages does this rank hold, which blocks does each "
            "hold, and which stage embeds the maps and which makes the predictions?",
            api="model.pipeline_stage(blocks, first=..., last=...); torch.arange(depth).tensor_split(total)",
            probe=rank_stages,
            mistakes=(
                Variant(
                    "every rank the whole model",
                    (
                        (
                            _STAGES_LINE,
                            "parts = [model.pipeline_stage(range(depth), first=True, last=True) for i in ids]",
                        ),
                    ),
                ),
                Variant(
                    "the embedding and head on every stage",
                    (
                        (
                            _STAGES_LINE,
                            "parts = [model.pipeline_stage(runs[i].tolist(), first=True, last=True) for i in ids]",
                        ),
                    ),
                ),
                Variant(
                    "a rank's stages side by side, not round-robin",
                    (("ids = [place + round_ * pp", "ids = [place * per_rank + round_"),),
                    settings={"schedule": "interleaved-1f1b", "stages_per_rank": 2},
                ),
            ),
            alternatives=(
                Variant(
                    "the stages by a range", (("ids = [place + round_ * pp", "ids = list(range(place, total, pp))  #"),)
                ),
                Variant(
                    "the blocks cut by hand",
                    (
                        (
                            "runs = torch.arange(depth).tensor_split(total)",
                            "runs = [torch.arange(i * depth // total, (i + 1) * depth // total) for i in range(total)]",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="13.b",
            title="each stage's sends",
            first="stages = [PipelineStage(",
            last="stages = [PipelineStage(",
            asks="`stages`: each of this rank's parts as a stage of the pipeline that sends its activations to the next "
            "stage and its input gradient to the one before: its number among the `total` stages, on this rank's "
            "device, among the pipeline's ranks (`group`)",
            question="To send to the next stage, what must each stage know: its number, how many stages there are, "
            "and which ranks form the pipeline?",
            api="PipelineStage(module, stage_index, num_stages, device, group=...)",
            probe=stage_sends,
            mistakes=(
                Variant(
                    "every rank the first stage",
                    ((_SEND_LINE, _SEND_LINE.replace("part, i, total", "part, 0, total")),),
                ),
                Variant(
                    "the stage count as the ranks'",
                    ((_SEND_LINE, _SEND_LINE.replace("part, i, total", "part, i, world_size")),),
                    settings={"schedule": "interleaved-1f1b", "stages_per_rank": 2},
                ),
                Variant(
                    "the whole world as the group",
                    ((_SEND_LINE, _SEND_LINE.replace(", group=group)", ")")),),
                    settings={"tp": 2},
                ),
            ),
            alternatives=(
                Variant(
                    "a loop",
                    (
                        (
                            _SEND_LINE,
                            "stages = []\nfor part, i in zip(parts, ids):\n"
                            "    stages.append(PipelineStage(part, i, total, device, group=group))",
                        ),
                    ),
                ),
                Variant(
                    "keywords",
                    (
                        (
                            _SEND_LINE,
                            "stages = [PipelineStage(part, stage_index=i, num_stages=total, device=device, "
                            "group=mesh['pp'].get_group()) for part, i in zip(parts, ids)]",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="13.c",
            title="the schedule",
            first='if schedule == "interleaved-1f1b":  # each',
            last="runner = kind(stages[0]",
            asks="`runner`: the schedule `schedule` names (interleaved-1f1b runs all of this rank's stages, the others "
            "its one), cutting each batch into `microbatches`, with `loss_fn` computed on the last stage",
            question="Which schedule orders the micro-batches' forwards and backwards, how many micro-batches does it "
            "cut a batch into, and who computes the loss?",
            api="ScheduleGPipe / Schedule1F1B(stage, n_microbatches=..., loss_fn=...); "
            "ScheduleInterleaved1F1B(stages, ...)",
            probe=schedule_made,
            mistakes=(
                Variant("always GPipe", ((_KIND_LINE, "kind = ScheduleGPipe"),)),
                Variant(
                    "one micro-batch", ((_RUNNER_LINE, "runner = kind(stages[0], n_microbatches=1, loss_fn=loss_fn)"),)
                ),
                Variant("no loss", ((_RUNNER_LINE, "runner = kind(stages[0], n_microbatches=microbatches)"),)),
            ),
            alternatives=(
                Variant(
                    "the count by position",
                    ((_RUNNER_LINE, "runner = kind(stages[0], microbatches, loss_fn=loss_fn)"),),
                ),
                Variant(
                    "a choice by condition",
                    ((_KIND_LINE, 'kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B'),),
                ),
            ),
        ),
        Gap(
            id="13.d",
            title="a step through the pipeline",
            first="losses = []",
            last="dist.broadcast(loss, src=last_rank",
            asks="one step of the batch through the pipeline: the first stage feeds the maps, the last compares with "
            "the targets and keeps each micro-batch's loss; `loss`, the batch's mean loss, the same on every rank",
            question="In one step, which stage needs the maps, which the targets, where do the micro-batches' losses "
            "end up, and how does every rank learn the loss it logs?",
            api="runner.step(x, target=y, losses=losses) on the stages that need them; dist.broadcast(...)",
            probe=pipeline_step,
            mistakes=(
                Variant("no losses kept", ((_STEP_LINE, _STEP_LINE.replace(", losses=losses)", ")")),)),
                Variant("the loss not shared", ((_BROADCAST_LINE, "pass"),)),
                Variant(
                    "the maps to the last stage",
                    ((_STEP_LINE, _STEP_LINE.replace("if ends[0]", "if ends[1]")),),
                ),
                # (a line outside the gaps: the broadcast of ours fails on it, and the verdict names that line)
                Variant(
                    "the last stage's rank counted among all the ranks",
                    (("last_rank = dist.get_global_rank(group, pp - 1)", "last_rank = world_size - 1"),),
                    names="outside",
                ),
            ),
            alternatives=(
                Variant(
                    "everything to every stage",
                    ((_STEP_LINE, "runner.step(x, target=y, losses=losses)"),),
                ),
                Variant(
                    "the mean by hand",
                    (
                        (
                            "loss = torch.stack(losses).mean().detach() if losses",
                            "loss = (sum(losses) / len(losses)).detach() if losses",
                        ),
                    ),
                ),
            ),
        ),
    ),
)
