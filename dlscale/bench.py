"""Benchmarks that print ratios measured side by side in one run.

``dlscale bench optim`` times one optimizer step of LAMB, LARS, AdamW and SGD (torch's
multi-tensor versions) — and of timm's ``Lamb`` and ``Lars`` when timm is installed — on
the lesson model and on a model of about 25 M parameters, with the same gradients. The
optimizers take turns in several rounds, so a slow spell of a shared machine hits all
of them alike, and each is reported by its median round. Figures go to
``docs/benchmarks.md``.
"""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from .layerwise import LAMB, LARS
from .models import CNNRegressor, count_parameters
from .optim import param_groups

#: The models the optimizer benchmark runs on: the lessons' default, and one of ~25 M parameters.
BENCH_MODELS: dict[str, Callable[[], nn.Module]] = {
    "lesson": lambda: CNNRegressor(width=16, depth=3),
    "25M": lambda: CNNRegressor(width=70, depth=5),
}


def timm_optimizers() -> dict[str, type] | None:
    """timm's ``Lamb`` and ``Lars`` classes, or None when timm is not installed.

    Only timm's optimizer files are loaded, not the timm package itself, whose model zoo
    needs a torchvision that matches torch (not always available, e.g. beside a CPU build).
    """
    spec = importlib.util.find_spec("timm")
    if spec is None or spec.origin is None:
        return None
    name = "_dlscale_timm_optim"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(Path(spec.origin).parent / "optim")]
        sys.modules[name] = package
    return {"Lamb": importlib.import_module(f"{name}.lamb").Lamb,
            "Lars": importlib.import_module(f"{name}.lars").Lars}


def optimizer_factories(weight_decay: float = 0.01) -> dict[str, Callable[[nn.Module], torch.optim.Optimizer]]:
    """Name -> constructor, with equivalent settings (same groups, decay and exclusions)."""
    factories: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
        "AdamW (foreach)": lambda m: torch.optim.AdamW(param_groups(m, weight_decay), lr=1e-3, foreach=True),
        "SGD (foreach)": lambda m: torch.optim.SGD(param_groups(m, weight_decay), lr=0.1, momentum=0.9, foreach=True),
        "LAMB (dlscale)": lambda m: LAMB(param_groups(m, weight_decay), lr=1e-3),
        "LARS (dlscale)": lambda m: LARS(param_groups(m, weight_decay), lr=1.0, momentum=0.9),
    }
    timm = timm_optimizers()
    if timm is not None:
        factories["LAMB (timm)"] = lambda m: timm["Lamb"](param_groups(m, weight_decay), lr=1e-3, max_grad_norm=None,
                                                          foreach=True)
        factories["LARS (timm)"] = lambda m: timm["Lars"](param_groups(m, weight_decay), lr=1.0, momentum=0.9,
                                                          foreach=True)
    return factories


def _time_steps(optimizer: torch.optim.Optimizer, steps: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    sync()
    return (time.perf_counter() - start) / steps


def bench_optimizers(models: Iterable[str] = ("lesson", "25M"), steps: int = 10, rounds: int = 5,
                     device: str = "cpu") -> list[dict]:
    """Median seconds per ``optimizer.step()`` for every optimizer on every model.

    Returns rows ``{model, parameters, tensors, optimizer, ms_per_step, vs_adamw}``.
    """
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for model_name in models:
        generator = torch.Generator().manual_seed(0)
        contenders = {}
        for name, make in optimizer_factories().items():
            torch.manual_seed(0)
            model = BENCH_MODELS[model_name]().to(device)
            for p in model.parameters():
                p.grad = (torch.randn(p.shape, generator=generator) * 1e-2).to(device)
            optimizer = make(model)
            _time_steps(optimizer, 2, sync)  # allocate state
            contenders[name] = (model, optimizer)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, (_, optimizer) in contenders.items():
                times[name].append(_time_steps(optimizer, steps, sync))
        model = next(iter(contenders.values()))[0]
        adamw = statistics.median(times["AdamW (foreach)"])
        for name, values in times.items():
            median = statistics.median(values)
            rows.append({"model": model_name, "parameters": count_parameters(model),
                         "tensors": len(list(model.parameters())), "optimizer": name,
                         "ms_per_step": 1000 * median, "vs_adamw": median / adamw})
    return rows


def format_rows(rows: list[dict]) -> str:
    """The benchmark as a Markdown table (what docs/benchmarks.md records)."""
    lines = ["| model | optimizer | ms / step | × AdamW (foreach) |", "|---|---|---|---|"]
    for row in rows:
        model = f"{row['model']} ({row['parameters'] / 1e6:.2f} M params, {row['tensors']} tensors)"
        lines.append(f"| {model} | {row['optimizer']} | {row['ms_per_step']:.2f} | {row['vs_adamw']:.2f} |")
    return "\n".join(lines)
