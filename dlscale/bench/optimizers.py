"""``dlscale bench optim``: one optimizer step of LAMB, LARS, AdamW and SGD, and timm's, side by side.

Times one optimizer step of each (torch's multi-tensor versions, and timm's ``Lamb`` and
``Lars`` when timm is installed) on the lesson model and on a model of about 25 M
parameters, with the same gradients. The optimizers take turns in several rounds, so a
slow spell of a shared machine hits all of them alike, and each is reported by its median
round. Figures go to ``docs/benchmarks.md``.
"""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from dlscale.models import CNNRegressor, count_parameters
from dlscale.optim.factory import param_groups
from dlscale.optim.layerwise import LAMB, LARS
from dlscale.reporting.tables import markdown_table

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
    return {"Lamb": importlib.import_module(f"{name}.lamb").Lamb, "Lars": importlib.import_module(f"{name}.lars").Lars}


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
        factories["LAMB (timm)"] = lambda m: timm["Lamb"](
            param_groups(m, weight_decay), lr=1e-3, max_grad_norm=None, foreach=True
        )
        factories["LARS (timm)"] = lambda m: timm["Lars"](
            param_groups(m, weight_decay), lr=1.0, momentum=0.9, foreach=True
        )
    return factories


def _time_steps(optimizer: torch.optim.Optimizer, steps: int) -> float:
    """Seconds per ``optimizer.step()``, by torch's benchmark timer (it synchronises CUDA and warms up).

    The thread count is set explicitly, so every optimizer is timed with the same threads.
    """
    from torch.utils import benchmark

    timer = benchmark.Timer("optimizer.step()", globals={"optimizer": optimizer}, num_threads=torch.get_num_threads())
    return timer.timeit(steps).mean


def bench_optimizers(
    models: Iterable[str] = ("lesson", "25M"), steps: int = 10, rounds: int = 5, device: str = "cpu"
) -> list[dict]:
    """Median seconds per ``optimizer.step()`` for every optimizer on every model.

    Returns rows ``{model, parameters, tensors, optimizer, ms_per_step, vs_adamw}``.
    """
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
            _time_steps(optimizer, 2)  # allocate state
            contenders[name] = (model, optimizer)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, (_, optimizer) in contenders.items():
                times[name].append(_time_steps(optimizer, steps))
        model = next(iter(contenders.values()))[0]
        adamw = statistics.median(times["AdamW (foreach)"])
        for name, values in times.items():
            median = statistics.median(values)
            rows.append(
                {
                    "model": model_name,
                    "parameters": count_parameters(model),
                    "tensors": len(list(model.parameters())),
                    "optimizer": name,
                    "ms_per_step": 1000 * median,
                    "vs_adamw": median / adamw,
                }
            )
    return rows


def format_rows(rows: list[dict]) -> str:
    """The benchmark as a Markdown table (what docs/benchmarks.md records)."""
    return markdown_table(
        ["model", "optimizer", "ms / step", "× AdamW (foreach)"],
        [
            (
                f"{row['model']} ({row['parameters'] / 1e6:.2f} M params, {row['tensors']} tensors)",
                row["optimizer"],
                f"{row['ms_per_step']:.2f}",
                f"{row['vs_adamw']:.2f}",
            )
            for row in rows
        ],
    )


def comparison_lines(rows: list[dict]) -> list[str]:
    """One line per model: our LAMB and LARS against AdamW (foreach) and against timm's, where it ran."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        by_name = {r["optimizer"]: r for r in rows if r["model"] == model}
        for ours, theirs in (("LAMB (dlscale)", "LAMB (timm)"), ("LARS (dlscale)", "LARS (timm)")):
            line = f"{model}: {ours} = {by_name[ours]['vs_adamw']:.2f}x AdamW (foreach)"
            if theirs in by_name:
                ratio = by_name[theirs]["ms_per_step"] / by_name[ours]["ms_per_step"]
                line += (
                    f", {ratio:.2f}x faster than {theirs}" if ratio >= 1 else f", {1 / ratio:.2f}x slower than {theirs}"
                )
            lines.append(line)
    return lines
