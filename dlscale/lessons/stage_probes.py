"""The attendee's stage, run and watched: what it did, gap by gap, beside the losses it logged.

:func:`run_stage` runs a stage's ``main`` (a function defined in the lesson, or the file the lesson wrote for the
ranks) while :func:`watch` notes the calls each gap of :mod:`dlscale.lessons.gaps` is about: the loaders'
workers and pinned memory, the non-blocking copies, the compiled module, the profiler's ranges, autocast's dtype
and the scaler's order, the sampler and its epochs, DDP, Horovod's broadcast, the LR at every step, the FSDP
units, the meta-device build and the DCP folder. Nothing is changed: each wrapper notes, then calls the original.

A failure inside the stage does not end the cell: the result carries it, and the stage check names the gap
(:func:`~dlscale.lessons.stage_check.check_stage`). What is noted is plain data, so it travels back from an engine.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import re
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

#: Most entries of the step-by-step call order kept (the order of the first steps is what the checks read).
_ORDER_KEPT = 400


def _new_record() -> dict[str, Any]:
    return {
        "loaders": [],
        "copies": 0,
        "non_blocking_copies": 0,
        "compiled": 0,
        "ranges": Counter(),
        "window_steps": 0,
        "order": [],
        "autocast": [],
        "scaler_enabled": [],
        "optimizer_steps": 0,
        "lrs": [],
        "zero_grads": 0,
        "process_group": None,
        "all_reduced": [],
        "samplers": [],
        "set_epochs": [],
        "ddp": 0,
        "saves": 0,
        "hvd_init": 0,
        "hvd_optimizers": [],
        "broadcasts": 0,
        "vit_on_meta": [],
        "tp_splits": [],
        "fsdp_units": [],
        "to_empty": 0,
        "init_weights": 0,
        "dcp_saves": [],
    }


class _Patches:
    """Wrappers put in place (on a module or class, and on the stage's own names bound to the same object) and
    taken out again in reverse."""

    def __init__(self, namespace: dict[str, Any]):
        self.namespace, self.undo = namespace, []

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        replacement = make(original)
        self.undo.append((owner, name, original))
        setattr(owner, name, replacement)
        for key, value in list(self.namespace.items()):
            if value is original:  # (``from torch.distributed.fsdp import fully_shard`` in the stage)
                self.undo.append((self.namespace, key, original))
                self.namespace[key] = replacement

    def restore(self) -> None:
        for owner, name, original in reversed(self.undo):
            if isinstance(owner, dict):
                owner[name] = original
            else:
                setattr(owner, name, original)


#: Whether a watch is on. A module first imported during a watch may keep a wrapper it found (``from torch.profiler
#: import record_function``): after the watch, such a wrapper only calls the original.
_WATCHING: list[bool] = [False]


def _noting(original: Callable, note: Callable[..., None]) -> Callable:
    """``original`` that first calls ``note`` with the same arguments (while a watch is on)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _WATCHING[0]:
            note(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _after(original: Callable, note: Callable[..., None]) -> Callable:
    """``original``, then ``note`` with the same arguments (for constructors: ``self`` is then whole)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if _WATCHING[0]:
            note(*args, **kwargs)
        return result

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def watch(namespace: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Note, while the block runs, the calls the stage checks read (see the module's docstring); yields the record.

    ``namespace`` is the stage's globals: names it imported (``fully_shard``, ``DataLoader``) are wrapped there too.
    """
    import torch.distributed.checkpoint  # noqa: F401  (imported before any wrapper is in place: see _WATCHING)
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    from torch.optim.optimizer import register_optimizer_step_post_hook

    import dlscale.models  # noqa: F401

    seen = _new_record()
    patches = _Patches(namespace if namespace is not None else {})
    _watch_loading(patches, seen)
    step_order = _watch_step(patches, seen)

    def stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        seen["optimizer_steps"] += 1
        seen["lrs"].append(float(optimizer.param_groups[0]["lr"]))
        step_order("optimizer step")

    hook = register_optimizer_step_post_hook(stepped)

    _watch_ranks(patches, seen)
    _watch_horovod(patches, seen)
    _watch_sharding(patches, seen)
    _WATCHING[0] = True
    try:
        yield seen
    finally:
        _WATCHING[0] = False
        hook.remove()
        patches.restore()
        seen["ranges"] = dict(seen["ranges"])


def _watch_loading(patches: _Patches, seen: dict[str, Any]) -> None:
    """The loaders' settings, the copies to the device, the samplers' settings and their epochs."""
    from torch.utils.data import DataLoader, DistributedSampler

    patches.wrap(
        DataLoader,
        "__init__",
        lambda f: _after(
            f,
            lambda self, *a, **k: seen["loaders"].append(
                {
                    "num_workers": self.num_workers,
                    "pin_memory": bool(self.pin_memory),
                    "shuffled_by": type(self.sampler).__name__,
                    "drop_last": self.drop_last,
                }
            ),
        ),
    )

    def copied(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], (torch.device, str)):
            seen["copies"] += 1
            seen["non_blocking_copies"] += bool(kwargs.get("non_blocking") or (len(args) > 1 and args[1] is True))

    patches.wrap(torch.Tensor, "to", lambda f: _noting(f, copied))
    patches.wrap(
        DistributedSampler,
        "__init__",
        lambda f: _after(
            f,
            lambda self, *a, **k: seen["samplers"].append(
                {
                    "num_replicas": self.num_replicas,
                    "rank": self.rank,
                    "seed": self.seed,
                    "drop_last": self.drop_last,
                    "shuffle": self.shuffle,
                }
            ),
        ),
    )
    patches.wrap(
        DistributedSampler, "set_epoch", lambda f: _noting(f, lambda self, epoch: seen["set_epochs"].append(int(epoch)))
    )


def _watch_step(patches: _Patches, seen: dict[str, Any]) -> Callable[[str], None]:
    """The step's calls: compiling, named ranges and the profiling window, autocast, the scaler, clipping, the
    gradients cleared; returns the function that notes a call's place in the step's order."""
    order = seen["order"]

    def step_order(name: str) -> None:
        if len(order) < _ORDER_KEPT:
            order.append(name)

    patches.wrap(
        torch, "compile", lambda f: _noting(f, lambda *a, **k: seen.__setitem__("compiled", seen["compiled"] + 1))
    )
    # (the class keeps its identity: torch.compile's tracing checks isinstance against it)
    patches.wrap(
        torch.autograd.profiler.record_function,
        "__init__",
        lambda f: _noting(f, lambda self, name, *a, **k: seen["ranges"].update([str(name)])),
    )
    tools = sys.modules.get("training_tools")
    if tools is not None and hasattr(tools, "ProfilingWindow"):
        patches.wrap(
            tools.ProfilingWindow,
            "step",
            lambda f: _noting(f, lambda self: seen.__setitem__("window_steps", seen["window_steps"] + 1)),
        )
    patches.wrap(
        torch.autocast,
        "__enter__",
        lambda f: _noting(
            f,
            lambda self: (
                seen["autocast"].append((str(self.device), str(self.fast_dtype), bool(self._enabled)))
                if len(seen["autocast"]) < _ORDER_KEPT
                else None
            ),
        ),
    )
    scaler = torch.amp.GradScaler
    patches.wrap(
        scaler,
        "scale",
        lambda f: _noting(
            f,
            lambda self, *a, **k: (
                step_order("scale"),
                seen["scaler_enabled"].append(self.is_enabled()) if len(seen["scaler_enabled"]) < _ORDER_KEPT else None,
            ),
        ),
    )
    for method, name in (("unscale_", "unscale"), ("step", "scaler step"), ("update", "update")):
        patches.wrap(scaler, method, lambda f, name=name: _noting(f, lambda *a, **k: step_order(name)))
    patches.wrap(torch.nn.utils, "clip_grad_norm_", lambda f: _noting(f, lambda *a, **k: step_order("clip")))
    patches.wrap(
        torch.optim.Optimizer,
        "zero_grad",
        lambda f: _noting(
            f, lambda *a, **k: (seen.__setitem__("zero_grads", seen["zero_grads"] + 1), step_order("zero_grad"))
        ),
    )

    return step_order


def _watch_ranks(patches: _Patches, seen: dict[str, Any]) -> None:
    """What the ranks do together: the process group joined, the all-reduces, DDP's wrapper, the files saved."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def joined(*args: Any, **kwargs: Any) -> None:
        backend = kwargs.get("backend", args[0] if args else None)
        timeout = kwargs.get("timeout")
        seen["process_group"] = {
            "backend": str(backend),
            "rank": kwargs.get("rank"),
            "world_size": kwargs.get("world_size"),
            "timeout_s": timeout.total_seconds() if timeout is not None else None,
        }

    patches.wrap(dist, "init_process_group", lambda f: _noting(f, joined))
    patches.wrap(
        dist,
        "all_reduce",
        lambda f: _noting(
            f,
            lambda tensor, *a, **k: (
                seen["all_reduced"].append((list(tensor.shape), str(tensor.dtype)))
                if len(seen["all_reduced"]) < _ORDER_KEPT
                else None
            ),
        ),
    )
    patches.wrap(
        DistributedDataParallel,
        "__init__",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("ddp", seen["ddp"] + 1)),
    )
    patches.wrap(torch, "save", lambda f: _noting(f, lambda *a, **k: seen.__setitem__("saves", seen["saves"] + 1)))


def _watch_horovod(patches: _Patches, seen: dict[str, Any]) -> None:
    """Horovod's join, its optimizer and its broadcast, when the stage has imported Horovod."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return
    patches.wrap(hvd, "init", lambda f: _noting(f, lambda *a, **k: seen.__setitem__("hvd_init", seen["hvd_init"] + 1)))
    patches.wrap(
        hvd,
        "DistributedOptimizer",
        lambda f: _noting(
            f,
            lambda *a, **k: seen["hvd_optimizers"].append(
                {
                    "averaged": k.get("op", hvd.Average) == hvd.Average,
                    "op": str(k.get("op", "Average")),
                    "backward_passes_per_step": k.get("backward_passes_per_step", 1),
                    "named": k.get("named_parameters") is not None,
                }
            ),
        ),
    )
    patches.wrap(
        hvd,
        "broadcast_parameters",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("broadcasts", seen["broadcasts"] + 1)),
    )


def _watch_sharding(patches: _Patches, seen: dict[str, Any]) -> None:
    """Lesson 10's parts: the ViT's build, the tensor-parallel split, the FSDP units, to_empty and DCP's save."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.fsdp as fsdp
    from torch.distributed.tensor import parallel

    from dlscale.models import ViTRegressor

    patches.wrap(
        ViTRegressor,
        "__init__",
        lambda f: _after(f, lambda self, *a, **k: seen["vit_on_meta"].append(next(self.parameters()).is_meta)),
    )
    patches.wrap(
        ViTRegressor,
        "init_weights",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("init_weights", seen["init_weights"] + 1)),
    )
    patches.wrap(
        parallel,
        "parallelize_module",
        lambda f: _noting(
            f,
            lambda module, mesh=None, plan=None, *a, **k: seen["tp_splits"].append(
                {name: type(style).__name__ for name, style in (plan or {}).items()} if isinstance(plan, dict) else {}
            ),
        ),
    )

    def sharded(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        policy = kwargs.get("mp_policy")
        seen["fsdp_units"].append(
            {
                "module": type(module).__name__,
                "param_dtype": str(getattr(policy, "param_dtype", None)),
                "output_dtype": str(getattr(policy, "output_dtype", None)),
            }
        )

    patches.wrap(fsdp, "fully_shard", lambda f: _noting(f, sharded))
    patches.wrap(
        torch.nn.Module,
        "to_empty",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("to_empty", seen["to_empty"] + 1)),
    )
    patches.wrap(
        dcp, "save", lambda f: _noting(f, lambda *a, **k: seen["dcp_saves"].append(str(k.get("checkpoint_id"))))
    )


def effective_arguments(main: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """``main``'s arguments as a call with ``arguments`` gives them: its defaults, then those given."""
    signature = inspect.signature(main)
    bound = signature.bind_partial(**{k: v for k, v in arguments.items() if k in signature.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def _stage_frames(err: BaseException, filename: str) -> list[dict[str, Any]]:
    """The frames of ``err``'s traceback in the stage's own code: function, line number and line text."""
    frames = []
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename == filename:
            frames.append(
                {
                    "function": frame.name,
                    "line": frame.lineno,
                    "text": (frame.line or linecache.getline(filename, frame.lineno or 0)).strip(),
                }
            )
    return frames


def stage_main(stage: str | Callable[..., dict]) -> Callable[..., dict]:
    """A stage's ``main``: the function a lesson's cell defined, or the one in the file a lesson wrote (loaded as
    :func:`~dlscale.jobs.notebook_engines.run_file` loads it, with ``recipes/`` importable for ``training_tools``)."""
    if callable(stage):
        return stage
    import dlscale.lessons.recipe_folder  # noqa: F401  (puts recipes/ on the path: a stage imports training_tools)
    from dlscale.jobs.notebook_engines import load_file

    return load_file(str(stage))["main"]


def run_stage(stage: str | Callable[..., dict], **arguments: Any) -> dict[str, Any]:
    """Run a stage's ``main(**arguments)`` and watch it: the stage's own result (losses, R², throughput) plus
    ``seen`` (what it called, :func:`watch`), ``arguments`` (as the call gave them, defaults included) and
    ``error`` (None, or how it stopped: the stage check names the gap).

    ``stage`` is the ``main`` a lesson's cell defined, or the path of the file a lesson wrote (run on each rank,
    as :func:`~dlscale.jobs.notebook_engines.run_file` does: ``recipes/`` importable, so ``training_tools`` is found).
    """
    main = stage_main(stage)
    filename = main.__code__.co_filename
    result: dict[str, Any] = {"losses": [], "r2": [], "throughput": []}
    error = None
    with watch(main.__globals__) as seen:
        try:
            result = dict(main(**arguments))
        except Exception as err:  # noqa: BLE001 - the attendee's code: any failure is reported, by gap, by the check
            error = {
                "type": type(err).__name__,
                "message": str(err)[:2000],
                "name": getattr(err, "name", None),
                "frames": _stage_frames(err, filename),
            }
            where = error["frames"][-1] if error["frames"] else None
            print(
                f"your stage stopped: {error['type']}: {str(err)[:300]}"
                + (f" (line {where['line']}: {where['text']})" if where else "")
                + "; the check below names the gap",
                flush=True,
            )
            leave_group()
    source = _source_of(main, stage)
    header = re.match(r"(?:%%writefile \S+\n)?# recipes/(\S+\.py)", source or "")
    if header:
        _LAST_SOURCE[header[1]] = source
    ours = is_ours(main)
    if ours:
        print("(this run is OUR stage, recipes/" + Path(filename).name + ", not yours: use_ours)", flush=True)
    return {
        **result,
        "seen": seen,
        "arguments": effective_arguments(main, arguments),
        "error": error,
        "source": source,
        "ours": ours,
    }


#: The source of the stage each lesson ran last in this process, by stage file (for show_ours).
_LAST_SOURCE: dict[str, str] = {}


def last_source(stage: str) -> str | None:
    """The source of the last run of ``stage`` (``"01_baseline.py"``) in this process, if any."""
    return _LAST_SOURCE.get(stage)


def is_ours(stage: str | Callable) -> bool:
    """Whether a stage (its ``main``, or its file) is ours: defined in the kit's ``recipes/`` folder (use_ours)."""
    from dlscale.lessons.recipe_folder import recipe_path

    filename = stage.__code__.co_filename if callable(stage) else str(stage)
    return Path(filename).resolve().parent == recipe_path("01_baseline.py").resolve().parent


def leave_group() -> None:
    """After a failed stage, the process group it joined is left, so that the lesson can run it again."""
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _source_of(main: Callable, stage: str | Callable) -> str | None:
    """The stage's source as the attendee wrote it (for show_ours): the file, or the cell's function."""
    if not callable(stage):
        return Path(stage).read_text()
    cell = linecache.getlines(main.__code__.co_filename)  # (a notebook cell: IPython keeps its whole source there)
    if cell:
        return "".join(cell)
    with contextlib.suppress(OSError, TypeError):
        return inspect.getsource(main)
    return None
