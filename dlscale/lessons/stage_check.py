"""The stage check: the attendee's stage, gap by gap, then step by step against ``dlscale.train``.

:func:`check_stage` reads what :func:`~dlscale.lessons.stage_probes.run_stage` returned. First, how the stage
stopped if it did (a TODO left, a name a gap should have made, a process group never joined); then each gap's
probe (:data:`PROBES`), which looks at what the stage called, not at its losses, so a gap that leaves the losses
alone (the loader's workers, ``torch.compile``, the profiler's ranges, ``set_epoch`` in a one-epoch run, Horovod's
broadcast when the ranks start alike) is still seen; then the losses and R² against the engine's twin. Each
message starts with the gap's label, ``TODO 05.c``, and says what was seen. No probe depends on timing.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from typing import Any

import torch

from dlscale.lessons.gaps import GAPS, Gap, answer_lines, find_gap, gap_ids
from dlscale.runtime.devices import device_for_ranks

#: How far the attendee's losses may lie from the engine's, relative to the loss. On a CPU both run the same
#: kernels in the same order: what differs is rounding (well below 1e-5). On a GPU, cuDNN may choose other
#: convolution algorithms in each process, some not deterministic, and TF32 may be on: a few parts in 1e3
#: per step, which grow over the steps, so 3% there. A mistake in a stage moves the loss by far more.
STAGE_TOLERANCE = {"cpu": 1e-4, "cuda": 3e-2}

Probe = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], "str | None"]


def _steps(result: dict[str, Any]) -> int:
    return len(result.get("losses") or [])


def _device(arguments: dict[str, Any]) -> str:
    """The kind of device the stage ran on: its ``device`` argument, resolved as the stages' ``pick_device`` does
    (``auto``, the default: a GPU per rank where this node's ranks do not outnumber its GPUs, else the CPU)."""
    spec = arguments.get("device") or "auto"
    if spec == "auto":
        ranks_on_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", "1")))
        return "cuda" if torch.cuda.is_available() and device_for_ranks(ranks_on_node) == "auto" else "cpu"
    return torch.device(spec).type


# -- the probes: (what was seen, arguments, the stage's result) -> what is wrong, or None ---------------------


def _one_step_each(seen: dict, args: dict, result: dict) -> str | None:
    steps = seen["optimizer_steps"]
    if seen["zero_grads"] < steps:
        return (
            f"the gradients were cleared {seen['zero_grads']} time(s) in {steps} steps: each step's backward "
            f"adds to what the last step left, so clear them before every backward pass"
        )
    if steps != _steps(result):
        return f"the optimizer stepped {steps} times in {_steps(result)} logged steps: once per batch"
    return None


def _train_loader(seen: dict) -> dict | None:
    training = [loader for loader in seen["loaders"] if loader["drop_last"]]
    return training[-1] if training else (seen["loaders"][-1] if seen["loaders"] else None)


def _loader_settings(seen: dict, args: dict, result: dict) -> str | None:
    loader = _train_loader(seen)
    if loader is None:
        return "no DataLoader was made"
    want = {"num_workers": args.get("workers", 0), "pin_memory": _device(args) == "cuda"}
    got = {key: loader[key] for key in want}
    if got != want:
        return (
            f"the training loader ran with {got}, but this run asked for workers={args.get('workers')} on "
            f"{_device(args)}: want {want} (pinned memory helps a copy to a GPU only)"
        )
    return None


def _non_blocking_copies(seen: dict, args: dict, result: dict) -> str | None:
    needed = 2 * _steps(result)
    if seen["non_blocking_copies"] < needed:
        return (
            f"{seen['non_blocking_copies']} non-blocking copies to the device in {_steps(result)} steps (and "
            f"{seen['copies']} copies in all): each batch's inputs and targets go with non_blocking=True, "
            f"so that the host does not wait for the copy"
        )
    return None


_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": None}


def _precision_choice(seen: dict, args: dict, result: dict) -> str | None:
    precision, steps = args.get("precision", "fp32"), _steps(result)
    enabled = [dtype for _, dtype, on in seen["autocast"] if on]
    want = _DTYPES.get(precision)
    if want is None and enabled:
        return f"precision=fp32, but autocast ran in {enabled[0]}: fp32 runs with autocast disabled"
    if want is not None and not enabled:
        return (
            f"precision={precision}, but no forward pass ran under autocast "
            f"({len(seen['autocast'])} autocast block(s), none enabled)"
        )
    if want is not None and any(dtype != want for dtype in enabled):
        return f"precision={precision} wants {want}, but autocast ran in {sorted(set(enabled))}"
    if steps and seen["scaler_enabled"] and any(on != (precision == "fp16") for on in seen["scaler_enabled"]):
        state = "on" if seen["scaler_enabled"][0] else "off"
        return (
            f"the loss scaler was {state} with precision={precision}: it acts for fp16 only (fp16 gradients "
            f"underflow; bf16 keeps fp32's range)"
        )
    return None


def _scaled_step(seen: dict, args: dict, result: dict) -> str | None:
    order, steps = seen["order"], _steps(result)
    if args.get("precision", "fp32") != "fp32" and len([a for a in seen["autocast"] if a[2]]) < steps:
        return f"{len([a for a in seen['autocast'] if a[2]])} forward passes under autocast in {steps} steps"
    step = order[: order.index("update") + 1] if "update" in order else order
    calls = [name for name in step if name in ("scale", "unscale", "clip", "scaler step", "update")]
    want = ["scale", "unscale", "clip", "scaler step", "update"]
    if calls == want:
        return None
    if "clip" in calls and "unscale" in calls and calls.index("clip") < calls.index("unscale"):
        return (
            "the gradients were clipped before they were unscaled: the clip compared the scaled gradients "
            "(thousands of times too large under fp16) with `clip`"
        )
    missing = [name for name in want if name not in calls]
    return (
        f"the first step called {calls or 'none of'} of the scaler and the clip, without {missing}: scale the "
        f"loss, backward, unscale, clip, then step and update through the scaler"
    )


def _compiled(seen: dict, args: dict, result: dict) -> str | None:
    wanted = bool(args.get("compile", False))
    if wanted and not seen["compiled"]:
        return "compile=True, but nothing was compiled: the loop must call the compiled module"
    if not wanted and seen["compiled"]:
        return "compile=False, but the model was compiled: the switch must turn compilation off"
    return None


_PHASES = ("forward", "backward", "optimizer step")


def _named_phases(seen: dict, args: dict, result: dict) -> str | None:
    steps = _steps(result)
    short = {name: seen["ranges"].get(name, 0) for name in _PHASES if seen["ranges"].get(name, 0) < steps}
    if short:
        return (
            f"in {steps} steps the profiler saw the ranges {short} times: each step's forward, backward and "
            f"optimizer step inside a range of that name (other names: {sorted(set(seen['ranges']) - set(_PHASES))})"
        )
    if seen["window_steps"] != steps:
        return (
            f"the profiling window heard of {seen['window_steps']} steps in {steps}: it must be told at the end "
            f"of every step, or it records the wrong ones"
        )
    return None


def _validation_sums(seen: dict, args: dict, result: dict) -> str | None:
    if not any(dtype == "torch.float64" and shape and shape[0] == 4 for shape, dtype in seen["all_reduced"]):
        return (
            "the validation sums were never added over the ranks: each rank computed the R² of its own share "
            "only (and a mean of the ranks' R² is not the R² of the whole set)"
        )
    return None


def _joined(seen: dict, args: dict, result: dict) -> str | None:
    group, want = seen["process_group"], "nccl" if _device(args) == "cuda" else "gloo"
    if group is None:
        return "the process never joined a process group"
    if group["backend"] != want:
        return f"the group's backend is {group['backend']} on {_device(args)}: {want} there"
    if group["timeout_s"] != 300:
        return f"the group's timeout is {group['timeout_s']} s: 5 minutes (300 s), so that a missing peer ends the job"
    return None


def _sampler(seen: dict, args: dict, result: dict) -> str | None:
    if not seen["samplers"]:
        return "no DistributedSampler was made: every rank would read the whole data set"
    sampler, group = seen["samplers"][0], seen["process_group"] or {}
    want = {
        "num_replicas": group.get("world_size", sampler["num_replicas"]),
        "rank": group.get("rank", sampler["rank"]),
        "seed": args.get("seed", 0),
        "drop_last": True,
        "shuffle": True,
    }
    wrong = {key: sampler[key] for key in want if want[key] is not None and sampler[key] != want[key]}
    if wrong:
        return (
            f"the sampler has {wrong}, want { ({key: want[key] for key in wrong}) }: drop_last gives every rank the "
            f"same number of steps (a rank with one more would wait for its peers forever)"
        )
    return None


def _ddp(seen: dict, args: dict, result: dict) -> str | None:
    if not seen["ddp"]:
        return "the model was never wrapped for data parallelism: its gradients are not averaged over the ranks"
    return None


def _epochs_ordered(seen: dict, args: dict, result: dict) -> str | None:
    epochs = len(result.get("r2") or [])
    if len(seen["set_epochs"]) < epochs or len(set(seen["set_epochs"])) < len(seen["set_epochs"]):
        return (
            f"the sampler was told the epochs {seen['set_epochs']} in {epochs} epoch(s): without a new epoch "
            f"each time, every epoch repeats the first one's order"
        )
    return None


def _horovod_joined(seen: dict, args: dict, result: dict) -> str | None:
    return None if seen["hvd_init"] else "Horovod was never initialised in this process"


def _horovod_optimizer(seen: dict, args: dict, result: dict) -> str | None:
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


def _broadcast(seen: dict, args: dict, result: dict) -> str | None:
    if not seen["broadcasts"]:
        return (
            "rank 0's weights were never broadcast: each rank starts from its own initialisation (here the "
            "ranks happen to be seeded alike; in your own code they are not)"
        )
    return None


def _expected_lrs(args: dict, steps: int) -> list[float]:
    """Stage 07's LR at each step, from its arguments: the engine's scaling rule and schedule (the stage's twin)."""
    from dlscale.optim.schedules import lr_trace, scale_lr

    scaling = args["scaling"]
    if scaling == "auto":
        scaling = "sqrt" if args["optimizer_name"] in ("adamw", "lamb") else "linear"
    lr, warmup = args["lr"], args["warmup_steps"]
    peak = scale_lr(lr, args["base_batch"], args["batch_size"], scaling)
    return lr_trace(peak, warmup, steps, "cosine", lr / peak if peak > lr else 1.0 / max(1, warmup))


def _lr_peak(seen: dict, args: dict, result: dict) -> str | None:
    lrs = seen["lrs"]
    if not lrs or args.get("resume"):
        return None
    want = max(_expected_lrs(args, len(lrs)))
    if len(set(lrs)) > 1 and abs(max(lrs) - want) > 1e-9 * want:
        return (
            f"the LR peaked at {max(lrs):.6g}, want {want:.6g}: lr={args['lr']} tuned at base_batch="
            f"{args['base_batch']}, scaled for batch_size={args['batch_size']} by the {args['scaling']} rule"
        )
    return None


def _lr_shape(seen: dict, args: dict, result: dict) -> str | None:
    lrs = seen["lrs"]
    if not lrs or args.get("resume"):
        return None
    want = _expected_lrs(args, len(lrs))
    worst = max(range(len(lrs)), key=lambda i: abs(lrs[i] - want[i]))
    if abs(lrs[worst] - want[worst]) > 1e-9 * max(want):
        return (
            f"the LR at step {worst} was {lrs[worst]:.6g}, want {want[worst]:.6g} (first steps: "
            f"{[round(v, 6) for v in lrs[:4]]}, want {[round(v, 6) for v in want[:4]]}): a straight rise from "
            f"start over the warmup, then half a cosine to 0"
        )
    return None


def _lr_advances(seen: dict, args: dict, result: dict) -> str | None:
    lrs = seen["lrs"]
    first = _expected_lrs(args, 2)[0] if lrs and not args.get("resume") else None
    if len(lrs) > 1 and len(set(lrs)) == 1 and first is not None and abs(lrs[0] - first) <= 1e-9 * first:
        return (
            f"the LR stayed at {lrs[0]:.6g} for all {len(lrs)} steps: the schedule never moved on (one step of "
            f"it after every optimizer step)"
        )
    return None


def _meta_build(seen: dict, args: dict, result: dict) -> str | None:
    if not seen["vit_on_meta"]:
        return "no ViTRegressor was built"
    if not seen["vit_on_meta"][0]:
        return (
            "the transformer was built with real memory: on the meta device it takes none until each rank "
            "allocates its own shards (a model larger than one GPU could not be built at all)"
        )
    return None


def _tensor_parallel(seen: dict, args: dict, result: dict) -> str | None:
    if args.get("tp", 1) <= 1:
        return None
    want = {
        "attention.wq": "ColwiseParallel",
        "attention.wk": "ColwiseParallel",
        "attention.wv": "ColwiseParallel",
        "attention.wo": "RowwiseParallel",
        "mlp.w1": "ColwiseParallel",
        "mlp.w2": "RowwiseParallel",
    }
    if not seen["tp_splits"]:
        return f"tp={args['tp']}, but no block was split over the tensor-parallel ranks"
    wrong = {name: style for name, style in seen["tp_splits"][0].items() if want.get(name) != style}
    missing = sorted(set(want) - set(seen["tp_splits"][0]))
    if wrong or missing:
        return (
            f"the split plan has {wrong or 'no wrong entry'}, missing {missing or 'none'}: the query, key, "
            f"value and the MLP's first layer by columns, the attention's output and the MLP's second by rows"
        )
    return None


def _fsdp_units(seen: dict, args: dict, result: dict) -> str | None:
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


def _allocated(seen: dict, args: dict, result: dict) -> str | None:
    if not seen["to_empty"] or not seen["init_weights"]:
        return (
            f"memory given {seen['to_empty']} time(s), weights initialised {seen['init_weights']} time(s): "
            f"each rank's shards need both, after sharding"
        )
    return None


def _dcp_saved(seen: dict, args: dict, result: dict) -> str | None:
    epochs = len(result.get("r2") or [])
    if len(seen["dcp_saves"]) < epochs:
        return f"{len(seen['dcp_saves'])} sharded checkpoint(s) saved in {epochs} epoch(s): one at the end of each"
    if any("epoch-" not in folder for folder in seen["dcp_saves"]):
        return f"the checkpoints went to {seen['dcp_saves']}: a folder epoch-N inside checkpoint each"
    return None


#: Each stage's probes, by gap; a gap without a probe is checked by the losses or the R² (see :data:`BY_NUMBERS`).
PROBES: dict[str, dict[str, Probe]] = {
    "01_baseline.py": {"01.b": _one_step_each},
    "02_data_loading.py": {"02.a": _loader_settings, "02.b": _non_blocking_copies},
    "03_mixed_precision.py": {"03.a": _precision_choice, "03.b": _scaled_step},
    "04_compile.py": {"04.a": _compiled, "04.b": _named_phases},
    "05_ddp.py": {"05.a": _validation_sums, "05.b": _joined, "05.c": _sampler, "05.d": _ddp, "05.e": _epochs_ordered},
    "06_horovod.py": {"06.a": _horovod_joined, "06.b": _horovod_optimizer, "06.c": _broadcast},
    "07_large_batch.py": {"07.c": _lr_advances, "07.a": _lr_peak, "07.b": _lr_shape},
    "10_fsdp_tp.py": {
        "10.a": _meta_build,
        "10.b": _tensor_parallel,
        "10.c": _fsdp_units,
        "10.d": _allocated,
        "10.e": _dcp_saved,
    },
}

#: The gaps the numbers point to when no probe has spoken: (the R²'s, the update's) per stage.
BY_NUMBERS: dict[str, tuple[list[str], list[str]]] = {
    "01_baseline.py": (["01.a"], ["01.b"]),
    "02_data_loading.py": ([], ["02.a", "02.b"]),
    "03_mixed_precision.py": ([], ["03.a", "03.b"]),
    "04_compile.py": ([], ["04.a", "04.b"]),
    "05_ddp.py": (["05.a"], ["05.b", "05.c", "05.d", "05.e"]),
    "06_horovod.py": ([], ["06.b", "06.c"]),
    "07_large_batch.py": ([], ["07.a", "07.b", "07.c"]),
    "10_fsdp_tp.py": ([], ["10.a", "10.b", "10.c", "10.d"]),
}

#: Errors that say which call is missing: (words in the message, an API name the missing answer calls).
_KNOWN_ERRORS = (
    ("process group has not been initialized", "init_process_group"),
    ("no attribute 'set_requires_gradient_sync'", "fully_shard"),  # (a method FSDP2 adds)
    ("no attribute 'synchronize'", "DistributedOptimizer"),  # (a method Horovod's optimizer adds)
    ("meta", "to_empty"),
    ("Horovod has not been initialized", "hvd.init"),
)


def _label(gap_id: str) -> str:
    return f"TODO {gap_id} ({find_gap(gap_id)[1].asks.split(':')[0].split(',')[0]})"


def _assigned(code: str) -> set[str]:
    """Names a gap's answer makes (assignments, ``with ... as``, loop targets)."""
    try:
        tree = ast.parse("if True:\n" + "".join(f"    {line}\n" for line in code.splitlines()))
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


def _enclosing_functions(stage: str) -> dict[str, str]:
    """{function name: gap id} for the gaps that sit in a helper function of the stage (not in ``main``)."""
    from dlscale.lessons.recipe_folder import recipe_path

    tree = ast.parse(recipe_path(stage).read_text())
    found = {}
    for gap_id, gap in zip(gap_ids(stage), GAPS[stage]):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name != "main" and gap.first in ast.unparse(node):
                found[node.name] = gap_id
    return found


def _gap_of_error(stage: str, error: dict[str, Any]) -> tuple[str | None, str]:
    """(the gap an error points to, or None; what to say about it)."""
    message = error["message"]
    if error["type"] == "NotImplementedError" and message.startswith("TODO "):
        gap_id = message.split(":", 1)[0].removeprefix("TODO ")
        return gap_id, "still to write (it raises NotImplementedError)"
    ids = gap_ids(stage)
    if error.get("name"):  # NameError, UnboundLocalError: a name a gap should have made
        for gap_id in ids:
            if error["name"] in _assigned(answer_lines(gap_id)):
                return gap_id, f"`{error['name']}` is used but never made ({error['type']}: {message})"
    for words, api in _KNOWN_ERRORS:
        if words in message:
            for gap_id in ids:
                if api in answer_lines(gap_id):
                    return gap_id, f"{error['type']}: {message.splitlines()[0][:200]}"
    helpers = _enclosing_functions(stage)
    for frame in reversed(error["frames"]):
        for function, gap_id in helpers.items():
            if function == frame["function"] or f"{function}(" in frame["text"] or f"{function})" in frame["text"]:
                return gap_id, (f"{error['type']} at line {frame['line']} ({frame['text']}): {message[:200]}")
    where = error["frames"][-1] if error["frames"] else None
    return None, (f"{error['type']}: {message[:300]}" + (f" (line {where['line']}: {where['text']})" if where else ""))


def check_gaps(stage: str, mine: dict[str, Any]) -> None:
    """How the stage stopped, then each gap's probe: an AssertionError starting ``TODO NN.x`` for the first gap
    found wrong. A result without what the stage called (a plain ``main()``'s) is checked by its numbers only."""
    error = mine.get("error")
    if error:
        gap_id, said = _gap_of_error(stage, error)
        if gap_id is None:
            raise AssertionError(
                f"your stage stopped before the end: {said}. Its gaps: " + "; ".join(_label(g) for g in gap_ids(stage))
            )
        raise AssertionError(f"{_label(gap_id)}: {said}")
    if "seen" not in mine:
        return
    for gap_id, probe in PROBES[stage].items():
        wrong = probe(mine["seen"], mine.get("arguments") or {}, mine)
        if wrong:
            raise AssertionError(f"{_label(gap_id)}: {wrong}")


def _gaps_named(ids: list[str]) -> str:
    return "; ".join(_label(gap_id) for gap_id in ids) if ids else "the lines around the gaps"


def check_stage(stage: str, mine: dict, twin: dict | None, device: str | None = None) -> None:
    """The attendee's stage (:func:`~dlscale.lessons.stage_probes.run_stage`'s result) gap by gap
    (:func:`check_gaps`), then its losses per step and R² per epoch against ``dlscale.train`` with the same settings
    (``twin``, from :func:`~dlscale.lessons.parity.engine_twin`), within :data:`STAGE_TOLERANCE` for ``device``
    (default: CUDA where a GPU is visible). Every failure names the gap it points to."""
    check_gaps(stage, mine)
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tolerance, lesson = STAGE_TOLERANCE[kind], stage[:2]
    for_r2, for_update = BY_NUMBERS[stage]
    losses, reference = list(mine["losses"]), list(twin["losses"]) if twin else []
    assert len(losses) == len(reference), (
        f"your stage logged {len(losses)} steps, dlscale.train {len(reference)} with the same settings: check the "
        f"batch size each rank loads (the global batch over the ranks) and drop_last ({_gaps_named(for_update)})"
    )
    for step, (a, b) in enumerate(zip(losses, reference)):
        if abs(a - b) > tolerance * max(1.0, abs(b)):
            where = (
                "the first step's loss: the forward pass, the loss or the data each rank reads"
                if step == 0
                else f"step {step} (the steps before it agree): the update"
            )
            raise AssertionError(
                f"your stage's loss {a:.6f} differs from dlscale.train's {b:.6f} from {where} "
                f"(allowed on {kind}: {tolerance:g} of the loss). Look at {_gaps_named(for_update)}"
            )
    for epoch, (a, b) in enumerate(zip(mine["r2"], twin["r2"]), 1):
        assert a is not None and abs(a - b) <= max(1e-3, tolerance), (
            f"the losses agree but epoch {epoch}'s validation R² is {a if a is None else f'{a:.4f}'}, dlscale.train's "
            f"{b:.4f}: the R² "
            f"(1 - squared error / variance, per target, over every rank's share). Look at {_gaps_named(for_r2)}"
        )
    print(
        f"Lesson {lesson}'s stage passed ✓ every gap as asked, and {len(losses)} steps as dlscale.train takes them "
        f"(largest difference {max((abs(a - b) for a, b in zip(losses, reference)), default=0):.1e}), validation "
        f"R² {mine['r2'][-1]:.4f}. Ours beside yours: show_ours({lesson!r})"
    )


__all__ = ["BY_NUMBERS", "PROBES", "STAGE_TOLERANCE", "Gap", "check_gaps", "check_stage"]
