"""The attendee's stage, run and watched: what it did, gap by gap, beside the losses it logged.

:func:`run_stage` runs a stage's ``main`` (a function defined in the lesson, or the file the lesson wrote for the
ranks) while :func:`watch` notes the calls each gap of :mod:`dlscale.lessons.gaps` is about: the loaders'
workers and pinned memory, the non-blocking copies, the compiled module, the profiler's ranges, autocast's dtype
and the scaler's order, the sampler and its epochs, DDP, Horovod's broadcast, the LR at every step, the FSDP
units, the meta-device build and the DCP folder. Each wrapper notes, then calls the original; three change what a
CPU could not show: a copy of a batch to the device it is on returns a new tensor (as a copy to a GPU does), a
rank that joins under another number than its launcher's joins under the launcher's (noted), and gloo's wait is
bounded (:func:`collective_wait`).

A failure inside the stage does not end the cell: the result carries it, and the stage check names the gap
(:func:`~dlscale.lessons.stage_check.check_stage`). What is noted is plain data, so it travels back from an engine.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import io
import linecache
import os
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dlscale.lessons.stage_record import device_kind

#: Most entries of the step-by-step call order kept (the order of the first steps is what the checks read).
_ORDER_KEPT = 400


def _new_record() -> dict[str, Any]:
    return {
        "loaders": [],
        "copies": 0,
        "non_blocking_copies": 0,
        "uncopied_inputs": 0,
        "compiled": 0,
        "compile_backends": [],
        "loss_ranges": Counter(),
        "ranges": Counter(),
        "window_steps": 0,
        "order": [],
        "autocast": [],
        "scaler_enabled": [],
        "optimizer_steps": 0,
        "skipped_steps": 0,
        "empty_steps": 0,
        "backwards": 0,
        "stale_backwards": 0,
        "backwards_per_step": Counter(),
        "compiled_calls": 0,
        "range_events": {},
        "lrs": [],
        "zero_grads": 0,
        "process_group": None,
        "all_reduced": Counter(),
        "validation_all_reduces": 0,
        "validation_largest_reduce": 0,
        "samplers": [],
        "sampler_iterations": [],
        "set_epochs": [],
        "ddp": 0,
        "ddp_calls": 0,
        "saves": 0,
        "compiled_names_saved": 0,
        "hvd_init": 0,
        "hvd_asked_before_init": [],
        "hvd_optimizers": [],
        "broadcasts": 0,
        "vit_on_meta": [],
        "tp_splits": [],
        "fsdp_units": [],
        "to_empty": 0,
        "init_weights": 0,
        "dcp_saves": [],
        "dcp_saved": [],
        "pipeline_parts": [],
        "pipeline_stages": [],
        "pipeline_schedules": [],
        "pipeline_steps": [],
        "held_activations_peak": 0,
    }


_INHERITED = object()


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
        # (a method a class inherits is put back by removing the wrapper, not by pinning the parent's on it)
        own = not isinstance(owner, type) or name in owner.__dict__
        self.undo.append((owner, name, original if own else _INHERITED))
        setattr(owner, name, replacement)
        for key, value in list(self.namespace.items()):
            if value is original:  # (``from torch.distributed.fsdp import fully_shard`` in the stage)
                self.undo.append((self.namespace, key, original))
                self.namespace[key] = replacement

    def restore(self) -> None:
        for owner, name, original in reversed(self.undo):
            if isinstance(owner, dict):
                owner[name] = original
            elif original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def collective_wait() -> datetime.timedelta:
    """How long a checked stage's rank waits in a gloo collective before it gives up (``DLSCALE_CHECK_WAIT_S``; by
    default 300 s, the recipes' own): a room that wants a rank waiting for a peer that skipped the collective (a save
    on rank 0 only) named sooner sets it lower. (NCCL's watchdog ends the process on a timeout: its groups keep
    theirs.) The default is the stages' own because a shorter one also cut short a busy machine's teardown, where a
    rank can wait in gloo's group destructor."""
    return datetime.timedelta(seconds=float(os.environ.get("DLSCALE_CHECK_WAIT_S", "300")))


def _bounded(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``init_process_group``'s keywords with the timeout bounded by :func:`collective_wait`, for gloo alone."""
    backend = str(kwargs.get("backend", args[0] if args else None))
    if backend != "gloo" and not (backend == "None" and not torch.cuda.is_available()):
        return kwargs
    timeout = kwargs.get("timeout")
    return {**kwargs, "timeout": min(timeout, collective_wait()) if timeout is not None else collective_wait()}


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
def watch(
    namespace: dict[str, Any] | None = None, built: Callable[[dict[str, Any]], str | None] | None = None
) -> Iterator[dict[str, Any]]:
    """Note, while the block runs, what the stage did that the probes read (see the module's docstring); yields the
    record, plain data once the block ends.

    ``namespace`` is the stage's globals: names it imported (``fully_shard``, ``DataLoader``) are wrapped there too.
    """
    import torch.distributed.checkpoint  # noqa: F401  (imported before any wrapper is in place: see _WATCHING)
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    import dlscale.models  # noqa: F401

    seen = _new_record()
    patches = _Patches(namespace if namespace is not None else {})
    hooks = _watch_loading(patches, seen)
    hooks += _watch_step(patches, seen)
    _watch_ranks(patches, seen)
    _watch_horovod(patches, seen)
    _watch_sharding(patches, seen)
    _watch_pipeline(patches, seen, built)
    _WATCHING[0] = True
    try:
        yield seen
    finally:
        _WATCHING[0] = False
        for hook in hooks:
            hook.remove()
        patches.restore()
        for key in ("ranges", "backwards_per_step", "all_reduced", "loss_ranges"):
            seen[key] = {str(k): v for k, v in seen[key].items()}
        seen["range_events"] = {name: dict(events) for name, events in seen["range_events"].items()}


def _watch_loading(patches: _Patches, seen: dict[str, Any]) -> list[Any]:
    """The loaders' settings, the copies to the device (and whether the model read the copy), the samplers' settings
    and the epoch of each pass. Returns the hooks to remove."""
    batches: dict[int, Any] = {}  # id -> weak reference: the tensors the loaders gave, not yet copied
    hooks: list[Any] = []
    import torch.distributed as dist
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
        # Tensor.to(device, dtype, non_blocking, copy), .to(dtype, non_blocking), .to(other, non_blocking), and each
        # argument by keyword: a copy names a device (or a tensor on one); non_blocking is the first bool after it
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (torch.device, str, int)) or isinstance(target, torch.Tensor):
            seen["copies"] += 1
            flag = kwargs.get("non_blocking", next((a for a in args[1:] if isinstance(a, bool)), False))
            seen["non_blocking_copies"] += bool(flag)

    def copied_to_gpu(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> None:
        seen["copies"] += 1
        seen["non_blocking_copies"] += bool(non_blocking)

    patches.wrap(torch.Tensor, "to", lambda f: _as_a_copy(_noting(f, copied), batches))
    patches.wrap(torch.Tensor, "cuda", lambda f: _noting(f, copied_to_gpu))
    _watch_batches(patches, seen, batches, hooks)

    def sampler_made(self: Any, *args: Any, **kwargs: Any) -> None:
        grouped = dist.is_available() and dist.is_initialized()
        seen["samplers"].append(
            {
                "num_replicas": self.num_replicas,
                "rank": self.rank,
                "seed": self.seed,
                "drop_last": self.drop_last,
                "shuffle": self.shuffle,
                "job_size": dist.get_world_size() if grouped else None,
                "job_rank": dist.get_rank() if grouped else None,
            }
        )
        self._dlscale_index = len(seen["samplers"]) - 1

    patches.wrap(DistributedSampler, "__init__", lambda f: _after(f, sampler_made))
    patches.wrap(
        DistributedSampler, "set_epoch", lambda f: _noting(f, lambda self, epoch: seen["set_epochs"].append(int(epoch)))
    )

    def iterated(self: Any) -> None:
        if len(seen["sampler_iterations"]) < _ORDER_KEPT:
            seen["sampler_iterations"].append((getattr(self, "_dlscale_index", -1), int(self.epoch), self.shuffle))

    patches.wrap(DistributedSampler, "__iter__", lambda f: _noting(f, iterated))
    return hooks


def _is_batch(tensor: Any, batches: dict[int, Any]) -> bool:
    reference = batches.get(id(tensor))
    return reference is not None and reference() is tensor


def _as_a_copy(to: Callable, batches: dict[int, Any]) -> Callable:
    """``Tensor.to`` that returns a new tensor when it copies a loader's batch to the device it is already on (one
    device, as here on CPUs), as a copy to a GPU does: so that a step that reads the batch instead of its copy
    (``x.to(device)`` with its result dropped) is seen on a CPU too."""

    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = to(self, *args, **kwargs)
        if _WATCHING[0] and result is self and _is_batch(self, batches):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (torch.device, str, int, torch.Tensor)):
                result = self.clone()
        return result

    wrapper.__wrapped__ = to  # type: ignore[attr-defined]
    return wrapper


def _watch_batches(patches: _Patches, seen: dict[str, Any], batches: dict[int, Any], hooks: list[Any]) -> None:
    """The tensors each loader gives, and whether a model being trained read one of them itself, not its copy to the
    device (``seen["uncopied_inputs"]``): a forward hook on each module moved with ``Module.to``."""
    import weakref

    from torch.utils.data.dataloader import _BaseDataLoaderIter

    def note_batch(batch: Any) -> None:
        parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
        for part in parts:
            if isinstance(part, torch.Tensor):
                batches[id(part)] = weakref.ref(part)

    def next_batch(original: Callable) -> Callable:
        def wrapper(self: Any) -> Any:
            batch = original(self)
            if _WATCHING[0]:
                note_batch(batch)
            return batch

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    patches.wrap(_BaseDataLoaderIter, "__next__", next_batch)

    def read(module: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling() or not _WATCHING[0] or not torch.is_grad_enabled():
            return
        seen["uncopied_inputs"] += any(_is_batch(arg, batches) for arg in args)

    watched: set[int] = set()

    def moved(module: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(module, torch.nn.Module) and id(module) not in watched:
            watched.add(id(module))
            hooks.append(module.register_forward_pre_hook(read))

    patches.wrap(torch.nn.Module, "to", lambda f: _after(f, moved))


def _gradients(optimizers: list[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The gradients the optimizers hold now (each shard's local part)."""
    found = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grad = p.grad
                    found.append(grad.to_local() if hasattr(grad, "to_local") else grad)
    return found


def _any_nonzero(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and bool(torch.stack([t.ne(0).any() for t in tensors]).any())


class _Step:
    """Where the watched stage is in its step: the calls' order, the backward passes since the last optimizer step,
    the named ranges open now, whether a backward pass is running."""

    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen, self.since_step, self.in_backward, self.ranges = seen, 0, False, []

    def note(self, name: str) -> None:
        """A call's place in the step's order (the first steps' order is what the checks read)."""
        if len(self.seen["order"]) < _ORDER_KEPT:
            self.seen["order"].append(name)

    def held(self, event: str) -> None:
        """``event`` happened inside each range open now."""
        for name in self.ranges:
            self.seen["range_events"].setdefault(name, Counter())[event] += 1

    def ended(self, stepped: bool) -> None:
        """A step ended: the optimizer stepped, or a scaler's update followed a step it skipped."""
        if self.since_step:
            self.seen["backwards_per_step"][self.since_step] += 1
            self.seen["skipped_steps"] += not stepped
        self.since_step = 0


def _watch_step(patches: _Patches, seen: dict[str, Any]) -> list[Any]:
    """The step's behaviour: its gradients and backward passes, what was compiled and called, the named ranges and
    what each held, autocast and the scaler's order, the LR. Returns the hooks to remove."""
    step = _Step(seen)
    hooks = _watch_gradients(patches, seen, step)
    _watch_compiling(patches, seen)
    _watch_ranges(patches, seen, step)
    _watch_precision(patches, seen, step)
    return hooks


def _watch_gradients(patches: _Patches, seen: dict[str, Any], step: _Step) -> list[Any]:
    """What each backward pass and each optimizer step found: gradients left from the last step, none at all; the
    backward passes per step; the LR of every step. Returns the optimizer hooks to remove."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    optimizers: list[torch.optim.Optimizer] = []
    patches.wrap(torch.optim.Optimizer, "__init__", lambda f: _after(f, lambda self, *a, **k: optimizers.append(self)))
    backward = torch.autograd.backward

    def backward_pass(*args: Any, **kwargs: Any) -> Any:
        if not _WATCHING[0] or step.in_backward:  # (a backward inside a backward: reentrant checkpointing)
            return backward(*args, **kwargs)
        if step.since_step == 0 and _any_nonzero(_gradients(optimizers)):
            seen["stale_backwards"] += 1
        step.since_step += 1
        seen["backwards"] += 1
        step.held("backward")
        step.in_backward = True
        try:
            return backward(*args, **kwargs)
        finally:
            step.in_backward = False

    backward_pass.__wrapped__ = backward  # type: ignore[attr-defined]
    patches.wrap(torch.autograd, "backward", lambda f: backward_pass)  # (Tensor.backward calls it too)

    def before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _WATCHING[0] and not _any_nonzero(_gradients([optimizer])):
            seen["empty_steps"] += 1

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not _WATCHING[0]:
            return
        seen["optimizer_steps"] += 1
        seen["lrs"].append(float(optimizer.param_groups[0]["lr"]))
        step.held("optimizer step")
        step.note("optimizer step")
        step.ended(stepped=True)

    patches.wrap(
        torch.optim.Optimizer,
        "zero_grad",
        lambda f: _noting(
            f, lambda *a, **k: (seen.__setitem__("zero_grads", seen["zero_grads"] + 1), step.note("zero_grad"))
        ),
    )
    return [register_optimizer_step_pre_hook(before_step), register_optimizer_step_post_hook(after_step)]


def _traced_only(compile_: Callable) -> Callable:
    """``torch.compile`` that, while a watch is on, traces with dynamo's ``eager`` backend where inductor was asked
    for: the same compiled module, calls and ``_orig_mod.`` names the check reads, without inductor generating and
    building C++ for every answer (10-30 CPU-s a stage on a CPU). The backend asked for is noted before."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _WATCHING[0] and kwargs.get("backend", "inductor") == "inductor":
            kwargs = {key: value for key, value in kwargs.items() if key not in ("mode", "options")}
            kwargs["backend"] = "eager"  # (inductor's mode and options mean nothing to another backend)
        return compile_(*args, **kwargs)

    wrapper.__wrapped__ = compile_  # type: ignore[attr-defined]
    return wrapper


def _watch_compiling(patches: _Patches, seen: dict[str, Any]) -> None:
    """``torch.compile``'s calls and backends, and the compiled modules' calls."""
    from torch._dynamo.eval_frame import OptimizedModule

    def compiling(*args: Any, **kwargs: Any) -> None:
        seen["compiled"] += 1
        seen["compile_backends"].append(str(kwargs.get("backend", "inductor")))

    patches.wrap(torch, "compile", lambda f: _noting(_traced_only(f), compiling))
    patches.wrap(
        OptimizedModule,
        "__call__",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("compiled_calls", seen["compiled_calls"] + 1)),
    )


def _watch_ranges(patches: _Patches, seen: dict[str, Any], step: _Step) -> None:
    """The named ranges opened (and what each held: see :meth:`_Step.held`), the range each training loss was
    computed in, and the profiling window's steps."""
    # (the class keeps its identity: torch.compile's tracing checks isinstance against it)
    record = torch.autograd.profiler.record_function

    def range_opened(self: Any) -> None:
        seen["ranges"].update([str(self.name)])
        step.ranges.append(str(self.name))

    def range_closed(self: Any, *args: Any) -> None:
        if str(self.name) in step.ranges:
            del step.ranges[len(step.ranges) - 1 - step.ranges[::-1].index(str(self.name))]

    patches.wrap(record, "__enter__", lambda f: _noting(f, range_opened))
    patches.wrap(record, "__exit__", lambda f: _noting(f, range_closed))

    def loss_computed(*args: Any, **kwargs: Any) -> None:  # (the training losses: the phase range they are in)
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            phases = [name for name in step.ranges if name in ("forward", "backward", "optimizer step")]
            seen["loss_ranges"][phases[-1] if phases else "none"] += 1

    patches.wrap(torch.nn.functional, "mse_loss", lambda f: _noting(f, loss_computed))
    tools = sys.modules.get("training_tools")
    if tools is not None and hasattr(tools, "ProfilingWindow"):
        patches.wrap(
            tools.ProfilingWindow,
            "step",
            lambda f: _noting(f, lambda self: seen.__setitem__("window_steps", seen["window_steps"] + 1)),
        )


def _watch_precision(patches: _Patches, seen: dict[str, Any], step: _Step) -> None:
    """Autocast's blocks (device, dtype, enabled), the scaler's calls in the step's order, and the clip."""

    def autocast_entered(self: Any) -> None:
        if len(seen["autocast"]) < _ORDER_KEPT:
            seen["autocast"].append((str(self.device), str(self.fast_dtype), bool(self._enabled)))

    patches.wrap(torch.autocast, "__enter__", lambda f: _noting(f, autocast_entered))
    scaler = torch.amp.GradScaler

    def scaled(self: Any, *args: Any, **kwargs: Any) -> None:
        step.note("scale")
        if len(seen["scaler_enabled"]) < _ORDER_KEPT:
            seen["scaler_enabled"].append(self.is_enabled())

    patches.wrap(scaler, "scale", lambda f: _noting(f, scaled))
    for method, name in (("unscale_", "unscale"), ("step", "scaler step")):
        patches.wrap(scaler, method, lambda f, name=name: _noting(f, lambda *a, **k: step.note(name)))
    patches.wrap(
        scaler, "update", lambda f: _noting(f, lambda *a, **k: (step.note("update"), step.ended(stepped=False)))
    )
    patches.wrap(torch.nn.utils, "clip_grad_norm_", lambda f: _noting(f, lambda *a, **k: step.note("clip")))


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
            "launcher_rank": int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None,
        }

    def joining(original: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _WATCHING[0]:
                joined(*args, **kwargs)
                kwargs = _bounded(args, kwargs)
                launcher = seen["process_group"]["launcher_rank"]
                if kwargs.get("rank") is not None and launcher is not None and kwargs["rank"] != launcher:
                    kwargs["rank"] = launcher  # (two ranks under one number would wait for a peer forever: noted)
            return original(*args, **kwargs)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    patches.wrap(dist, "init_process_group", joining)

    def reduced(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        # by kind, every one counted: the one that matters is never crowded out by the gradients' many
        seen["all_reduced"][f"{list(tensor.shape)} {tensor.dtype}"] += 1
        if not torch.is_grad_enabled():
            seen["validation_all_reduces"] += 1
            seen["validation_largest_reduce"] = max(seen["validation_largest_reduce"], tensor.numel())

    patches.wrap(dist, "all_reduce", lambda f: _noting(f, reduced))

    def gathered(*args: Any, **kwargs: Any) -> None:  # (every rank gets every rank's part: a sum can follow)
        if not torch.is_grad_enabled():
            seen["validation_all_reduces"] += 1
            part = next((a for a in reversed(args) if isinstance(a, torch.Tensor)), None)
            # (an object gathered may hold any number of sums: counted as more than one)
            seen["validation_largest_reduce"] = max(
                seen["validation_largest_reduce"], part.numel() if part is not None else 2
            )

    for name in ("all_gather", "all_gather_into_tensor", "all_gather_object"):
        patches.wrap(dist, name, lambda f: _noting(f, gathered))
    patches.wrap(
        DistributedDataParallel,
        "__init__",
        lambda f: _noting(f, lambda *a, **k: seen.__setitem__("ddp", seen["ddp"] + 1)),
    )

    def ddp_ran(*args: Any, **kwargs: Any) -> None:
        if not torch.compiler.is_compiling():  # (inside a compiled forward this is traced, and must note nothing)
            seen["ddp_calls"] += torch.is_grad_enabled()

    patches.wrap(DistributedDataParallel, "forward", lambda f: _noting(f, ddp_ran))

    def saved(obj: Any, *args: Any, **kwargs: Any) -> None:
        seen["saves"] += 1
        states = [value for value in obj.values() if isinstance(value, dict)] if isinstance(obj, dict) else []
        if any(str(key).startswith("_orig_mod.") for state in states for key in state):
            seen["compiled_names_saved"] += 1

    patches.wrap(torch, "save", lambda f: _noting(f, saved))


def _watch_horovod(patches: _Patches, seen: dict[str, Any]) -> None:
    """Horovod's join, its optimizer and its broadcast, when the stage has imported Horovod."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return
    patches.wrap(hvd, "init", lambda f: _noting(f, lambda *a, **k: seen.__setitem__("hvd_init", seen["hvd_init"] + 1)))
    # asked before joining: in a fresh process the call fails, but where an earlier run left Horovod up (a kernel's
    # engines, a test process) it answers, and the stage would pass
    for name in ("rank", "size", "local_rank"):
        patches.wrap(
            hvd,
            name,
            lambda f, name=name: _noting(
                f, lambda *a, **k: None if seen["hvd_init"] else seen["hvd_asked_before_init"].append(name)
            ),
        )
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
        dcp,
        "save",
        lambda f: _noting(
            f,
            # (the folder: checkpoint_id=..., or a writer's own path)
            lambda *a, **k: (
                seen["dcp_saves"].append(str(k.get("checkpoint_id") or getattr(k.get("storage_writer"), "path", None))),
                seen["dcp_saved"].append(_what_is_saved(a[0] if a else k.get("state_dict"))),
            ),
        ),
    )


def _layers_of(module: torch.nn.Module) -> dict[str, Any]:
    """Which of the ViT's layers a pipeline stage holds, read from its parameters' names (a stage keeps the whole
    model's: ``blocks.3.mlp.w1.weight``): the blocks' numbers, and whether it has the embedding and the head."""
    names = [name for name, _ in module.named_parameters()]
    blocks = sorted({int(m[1]) for name in names if (m := re.search(r"(?:^|\.)blocks\.(\d+)\.", name))})
    return {
        "blocks": blocks,
        "embeds": any(re.search(r"(?:^|\.)(?:patch|position)(?:\.|$)", name) for name in names),
        "head": any(re.search(r"(?:^|\.)head\.", name) for name in names),
        "parameters": len(names),
    }


def _mean_loss(losses: Any) -> float | None:
    """The mean of the micro-batches' losses a step kept (None where it kept none: a stage other than the last)."""
    if not isinstance(losses, list) or not losses:
        return None
    return float(torch.stack([torch.as_tensor(loss).detach().float() for loss in losses]).mean())


def _pipeline_step(seen: dict[str, Any]) -> Callable[[Callable], Callable]:
    """A schedule's ``step``, timed: the step, the time in this rank's own stages' forwards and backwards (the rest it
    waited for a neighbour), the activations held for backward passes, and what the call handed the schedule."""
    from dlscale.bench.pipeline import time_stages
    from dlscale.metrics.memory import HeldActivations

    def make(original: Callable) -> Callable:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _WATCHING[0] or not getattr(self, "_has_backward", True):  # (eval() steps forward only)
                return original(self, *args, **kwargs)
            stages = list(getattr(self, "_stages", None) or [self._stage])
            given = kwargs.get("losses")
            kept = given if isinstance(given, list) else []
            if given is None:  # (a list of the watch's own: the schedule only adds the micro-batches' losses to it)
                kwargs = {**kwargs, "losses": kept}
            busy = [0.0]
            with time_stages(stages, busy), HeldActivations(torch.nn.ModuleList(s.submod for s in stages)) as held:
                start = time.perf_counter()
                out = original(self, *args, **kwargs)
                took = time.perf_counter() - start
            seen["pipeline_steps"].append(
                {
                    "step_s": took,
                    "busy_s": busy[0],
                    "inputs": len(args),
                    "target": kwargs.get("target") is not None,
                    "losses": given is not None,
                    "firsts": sum(bool(s.is_first) for s in stages),
                    "lasts": sum(bool(s.is_last) for s in stages),
                    "loss": _mean_loss(kept),
                }
            )
            seen["held_activations_peak"] = max(seen["held_activations_peak"], held.peak)
            return out

        step.__wrapped__ = original  # type: ignore[attr-defined]
        return step

    return make


def _watch_pipeline(
    patches: _Patches, seen: dict[str, Any], built: Callable[[dict[str, Any]], str | None] | None
) -> None:
    """Lesson 13's parts: the model's stages, each rank's PipelineStage, the schedule made, and its steps."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules, stage

    from dlscale.models import ViTRegressor

    patches.wrap(
        ViTRegressor,
        "pipeline_stage",
        lambda f: _noting(
            f,
            lambda self, blocks, first=False, last=False, *a, **k: seen["pipeline_parts"].append(
                {"blocks": [int(b) for b in blocks], "first": bool(first), "last": bool(last)}
            ),
        ),
    )

    def staged(self: Any, *args: Any, **kwargs: Any) -> None:
        group = self.group
        size = dist.get_world_size(group) if dist.is_initialized() else None
        place = dist.get_rank(group) if dist.is_initialized() else None
        seen["pipeline_stages"].append(
            {
                "index": self.stage_index,
                "stages": self.num_stages,
                "group_size": size,
                "group_rank": place,
                **_layers_of(self.submod),
            }
        )
        if size and self.stage_index % size != place:  # (the one change the watch makes: a certain wait, stopped)
            raise RuntimeError(
                f"stage {self.stage_index} of {self.num_stages} was built on the pipeline's rank {place} of {size}, "
                f"but torch.distributed.pipelining sends to stage i on rank i % {size}: its neighbours would wait "
                f"for it there, and this rank for them, until the timeout"
            )

    patches.wrap(stage._PipelineStageBase, "__init__", lambda f: _after(f, staged))
    patches.wrap(
        schedules._PipelineSchedule,
        "__init__",
        lambda f: _after(
            f,
            lambda self, *a, **k: seen["pipeline_schedules"].append(
                {
                    "kind": type(self).__name__,
                    "microbatches": self._n_microbatches,
                    "loss_fn": self._loss_fn is not None,
                }
            ),
        ),
    )

    def scheduled(schedule: Any, *args: Any, **kwargs: Any) -> None:
        _stages_fit(schedule)
        wrong = built(seen) if built else None
        if wrong:  # (its gap's probe names it: the check asks it first, judged_before_errors)
            raise RuntimeError(f"the pipeline was built wrong, so it stopped before its first step: {wrong}")

    for kind in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        patches.wrap(kind, "__init__", lambda f: _after(f, scheduled))
        patches.wrap(kind, "step", _pipeline_step(seen))


def _stages_fit(schedule: Any, *args: Any, **kwargs: Any) -> None:
    """A schedule's stages must make one pipeline: ``group size × stages per rank`` stages in all. Otherwise the ranks
    wait for stages that are not there until the timeout: stopped here at once, and named by its gap."""
    stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
    size = getattr(stages[0], "group_size", None)
    told = {stage.num_stages for stage in stages}
    if len({stage.stage_index for stage in stages}) < len(stages):
        raise RuntimeError(
            f"this rank's {len(stages)} stages were all numbered {stages[0].stage_index}: each stage of a pipeline "
            f"has a number of its own, or the ranks wait for stages that are not there, until the timeout"
        )
    if size and told != {size * len(stages)}:
        raise RuntimeError(
            f"this rank's {len(stages)} stage(s) were told {sorted(told)} stages in all, but a pipeline of {size} "
            f"rank(s) with {len(stages)} stage(s) each has {size * len(stages)}: the ranks would wait for stages that "
            f"are not there, until the timeout"
        )


def _what_is_saved(state: Any) -> list[str]:
    """What a checkpoint's state holds, by kind: "weights", "optimizer", "number" (an epoch or step)."""
    kinds = []
    for value in (state or {}).values() if isinstance(state, dict) else ():
        if isinstance(value, torch.optim.Optimizer) or (isinstance(value, dict) and "param_groups" in value):
            kinds.append("optimizer")
        elif isinstance(value, torch.nn.Module) or (isinstance(value, dict) and value and "param_groups" not in value):
            kinds.append("weights")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            kinds.append("number")
    return kinds


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


def _built_check(main: Callable[..., dict], arguments: dict[str, Any]) -> Callable[[dict[str, Any]], str | None]:
    """What the stage's record asks of what is built before the first step (its ``judged_before_errors`` probes), to
    ask as soon as it is built: a pipeline built wrong waits for ever otherwise (until the timeout)."""
    from dlscale.lessons.stages import stage_record

    try:
        record = stage_record(Path(main.__code__.co_filename).name.removeprefix("my_").removeprefix("variant_"))
    except KeyError:
        return lambda seen: None
    probes = [probe for gap, probe in record.probes() if gap.id in record.judged_before_errors]
    given = effective_arguments(main, arguments)

    def check(seen: dict[str, Any]) -> str | None:
        return next((wrong for probe in probes if (wrong := probe(seen, given, {}))), None)

    return check


def _watched_run(main: Callable[..., dict], arguments: dict[str, Any]) -> dict[str, Any]:
    """``main(**arguments)`` under :func:`watch`: its result, ``seen``, ``arguments`` and ``error`` (None, or how it
    stopped). Every exception comes back as the error, ``BaseException``s too (DCP's ``CheckpointException``, a
    ``SystemExit``), except the attendee's own interrupt."""
    filename = main.__code__.co_filename
    result: dict[str, Any] = {"losses": [], "r2": [], "throughput": []}
    error = None
    with watch(main.__globals__, _built_check(main, arguments)) as seen, one_rank_per_node():
        try:
            result = dict(main(**arguments))
        except KeyboardInterrupt:
            leave_group()
            raise
        except BaseException as err:  # noqa: BLE001 - the attendee's code: any failure is reported, by gap
            error = {
                "type": type(err).__name__,
                "message": str(err)[:2000],
                "name": getattr(err, "name", None),
                "frames": _stage_frames(err, filename),
            }
            leave_group()
    return {**result, "seen": seen, "arguments": effective_arguments(main, arguments), "error": error}


#: The variables a stage may read its number on its node from (torchrun's, Slurm's, PMI's)
_LOCAL_RANK = ("LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK")


@contextlib.contextmanager
def one_rank_per_node() -> Iterator[None]:
    """Ranks of CPUs that all run on this one host are watched as if each ran on a node of its own (number 0 on its
    node, one rank there), the layout of a job of one GPU per node: on one host a rank's number in the job and on
    its node are equal, so a stage that took one for the other would pass. GPU ranks keep theirs (each needs its
    own device)."""
    size = os.environ.get("WORLD_SIZE", "1")
    same_host = os.environ.get("LOCAL_WORLD_SIZE") == size and size.isdigit() and int(size) > 1
    if not same_host or torch.cuda.is_available():
        yield
        return
    kept = {name: os.environ.get(name) for name in (*_LOCAL_RANK, "LOCAL_WORLD_SIZE")}
    os.environ.update({name: "0" for name in _LOCAL_RANK if kept[name] is not None}, LOCAL_WORLD_SIZE="1")
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def changes_a_setting(settled: dict[str, Any], switch: dict[str, Any]) -> bool:
    """Whether a switch run would run anything the lesson's run did not: a device compared by its kind, so that
    ``device="cpu"`` is a run of its own on a GPU host and none where ``auto`` already meant the CPU."""
    for key, value in switch.items():
        if key == "device":
            if device_kind(settled) != torch.device(value).type:
                return True
        elif settled.get(key) != value:
            return True
    return False


def _switch_runs(stage: Any, main: Callable[..., dict], arguments: dict[str, Any], ran: bool) -> list[dict[str, Any]]:
    """The stage run briefly with each of its record's other settings (:attr:`Stage.switches`), on a small set of its
    data: so that a switch the lesson's own run left at one value (``compile``, ``precision``, ``scaling``) is tried
    at the others. Each run writes its checkpoint beside the lesson's, never over it. None run unless the lesson's
    run (``ran``) ended well on every rank: the ranks go on together or not at all (:func:`_every_rank_ran`)."""
    settled = effective_arguments(main, arguments)
    if not _every_rank_ran(ran):
        return []
    runs = []
    for index, switch in enumerate(stage.switches):
        if not changes_a_setting(settled, switch):
            continue
        settings = {
            **arguments,
            **switch,
            "config": small_config(str(settled.get("config", "tiny")), stage.switch_samples),
            "resume": False,
            "checkpoint": f"{settled.get('checkpoint', 'checkpoint.pt')}-switch{index}",
        }
        settings.setdefault("epochs", 1)
        # (the attendee reads the lesson's run, not these) on a port of its own: see _spare_ports
        with contextlib.redirect_stdout(io.StringIO()), _master_port(len(runs)):
            runs.append(_watched_run(main, {k: v for k, v in settings.items() if k in settled or k in switch}))
    return runs


def _spare_ports() -> list[int]:
    """The ports run_on_engines set aside for this call (none: a run of its own): one for each switch run's
    process group, and the last for the ranks' agreement before them.

    Every run of a stage on the ranks makes its group on a port of its own: a stage that left a reference to its
    group (a DDP model the watch keeps, a cycle not yet collected) keeps the group's TCP store alive in rank 0, and
    a group made again on that port reuses that store and its keys: a peer then reads the last run's addresses and
    waits minutes for ranks that are gone (a lesson's cell hung in CI).
    """
    return [int(port) for port in os.environ.get("DLSCALE_SPARE_PORTS", "").split(",") if port]


@contextlib.contextmanager
def _master_port(run: int) -> Iterator[None]:
    """``MASTER_PORT`` is the ``run``-th switch run's spare port inside the block."""
    groups = _spare_ports()[:-1]
    if run >= len(groups):
        yield
        return
    kept = os.environ["MASTER_PORT"]
    os.environ["MASTER_PORT"] = str(groups[run])
    try:
        yield
    finally:
        os.environ["MASTER_PORT"] = kept


def _every_rank_ran(ran: bool) -> bool:
    """Whether the lesson's run of the stage ended well on every rank (a run of its own: whether it did here). A rank
    that went on to the switch runs alone would wait in each one's start, the stage's timeout, for peers that
    stopped."""
    spare = _spare_ports()
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not spare:
        return ran
    from dlscale.distributed.agreement import every_rank_says_yes

    return every_rank_says_yes(ran, spare[-1])


def small_config(config: str, samples: int) -> str:
    """A config file that inherits ``config`` with ``samples`` training maps and half as many to validate: written once
    under ``runs/stage-checks`` (atomically: every rank may write it) and named by what it holds."""
    import tempfile

    folder = Path("runs", "stage-checks")
    folder.mkdir(parents=True, exist_ok=True)
    text = f"inherit: {config}\ntrain_samples: {samples}\nval_samples: {samples // 2}\n"
    path = folder / f"{Path(config).stem}-{samples}.yaml"
    if not path.is_file() or path.read_text() != text:
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    return str(path)


def watched_rank(stage: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One run of a stage's file on this rank, watched, without the check's switch runs: what a lesson measures on
    the attendee's stage from what the watch saw (lesson 13: each pipeline step's time and busy time)."""
    return _watched_run(stage_main(stage), arguments)


def run_stage(stage: str | Callable[..., dict], **arguments: Any) -> dict[str, Any]:
    """Run a stage's ``main(**arguments)`` and watch it: the stage's own result (losses, R², throughput) plus
    ``seen`` (what it did, :func:`watch`), ``arguments`` (as the call gave them, defaults included), ``error`` (None,
    or how it stopped: the stage check names the gap), ``switches`` (the brief runs at its record's other settings)
    and ``source``.

    ``stage`` is the ``main`` a lesson's cell defined, or the path of the file a lesson wrote (run on each rank,
    as :func:`~dlscale.jobs.notebook_engines.run_file` does: ``recipes/`` importable, so ``training_tools`` is found).
    """
    from dlscale.lessons.stages import stage_record

    main = stage_main(stage)
    filename = main.__code__.co_filename
    run = _watched_run(main, arguments)
    error = run["error"]
    if error:
        where = error["frames"][-1] if error["frames"] else None
        print(
            f"your stage stopped: {error['type']}: {error['message'][:300]}"
            + (f" (line {where['line']}: {where['text']})" if where else "")
            + "; the check below names the gap",
            flush=True,
        )
    source = _source_of(main, stage)
    header = re.match(r"(?:%%writefile \S+\n)?# recipes/(\S+\.py)", source or "")
    if header:
        _LAST_SOURCE[header[1]] = source
    record = None
    with contextlib.suppress(KeyError):
        record = stage_record(header[1] if header else Path(filename).name.removeprefix("my_"))
    switches = _switch_runs(record, main, arguments, error is None) if record is not None else []
    ours = is_ours(main)
    if ours:
        print("(this run is OUR stage, recipes/" + Path(filename).name + ", not yours: use_ours)", flush=True)
    return {**run, "switches": switches, "source": source, "ours": ours}


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
