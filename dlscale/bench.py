"""Benchmarks that print ratios measured side by side in one run.

``dlscale bench ladder`` climbs lesson 04's optimization ladder: each rung adds one change
(loader workers and pinned memory, channels_last, mixed precision, a fused optimizer,
torch.compile, CUDA graphs) and every rung is trained and timed in the same run.
``dlscale bench loader`` times the input pipeline alone (lesson 02).

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
import json
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
from .tables import markdown_table

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


def _time_steps(optimizer: torch.optim.Optimizer, steps: int) -> float:
    """Seconds per ``optimizer.step()``, by torch's benchmark timer (it synchronises CUDA and warms up).

    The thread count is set explicitly, so every optimizer is timed with the same threads.
    """
    from torch.utils import benchmark

    timer = benchmark.Timer("optimizer.step()", globals={"optimizer": optimizer}, num_threads=torch.get_num_threads())
    return timer.timeit(steps).mean


def bench_optimizers(models: Iterable[str] = ("lesson", "25M"), steps: int = 10, rounds: int = 5,
                     device: str = "cpu") -> list[dict]:
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
            rows.append({"model": model_name, "parameters": count_parameters(model),
                         "tensors": len(list(model.parameters())), "optimizer": name,
                         "ms_per_step": 1000 * median, "vs_adamw": median / adamw})
    return rows


def format_rows(rows: list[dict]) -> str:
    """The benchmark as a Markdown table (what docs/benchmarks.md records)."""
    return markdown_table(["model", "optimizer", "ms / step", "× AdamW (foreach)"], [
        (f"{row['model']} ({row['parameters'] / 1e6:.2f} M params, {row['tensors']} tensors)", row["optimizer"],
         f"{row['ms_per_step']:.2f}", f"{row['vs_adamw']:.2f}") for row in rows])


# -- the input pipeline alone ----------------------------------------------------------------------

def bench_loader(cfg, batches: int = 50, warmup: int = 3, device: str | torch.device | None = None) -> dict:
    """Samples/s of the input pipeline alone (read, collate, copy to the device), no model.

    Compare it with the full training throughput: if the loader alone is not much faster
    than training, the device is starved and waits for data.
    """
    from .data import make_loader
    from .train import resolve_device

    device = resolve_device(cfg.device) if device is None else torch.device(device)
    loader = make_loader(cfg, split="train", device=device)
    loader.sampler.set_position(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seen, start = 0, None
    for index, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if index == warmup:
            sync()
            start = time.perf_counter()
        elif index > warmup:
            seen += len(x)
        if index >= warmup + batches:
            break
    sync()
    elapsed = time.perf_counter() - start if start else float("nan")
    return {"samples_per_s": seen / elapsed if seen else float("nan"), "batches": index - warmup,
            "num_workers": loader.num_workers, "pin_memory": loader.pin_memory, "batch_size": loader.batch_size}


# -- the optimization ladder -----------------------------------------------------------------------

def ladder_rungs(device: torch.device) -> list[tuple[str, dict, str | None]]:
    """(rung, the settings it adds, why it is skipped or None), each rung on top of the previous ones."""
    import os

    workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    cuda = device.type == "cuda"
    return [
        ("fp32 baseline", {"precision": "fp32", "num_workers": 0, "pin_memory": False, "channels_last": False,
                           "optimizer": "adamw", "optimizer_impl": "loop", "compile": False, "cuda_graphs": False},
         None),
        ("+ loader workers, pinned memory", {"num_workers": workers, "pin_memory": True}, None),
        ("+ channels_last", {"channels_last": True}, None),
        ("+ mixed precision", {"precision": "auto" if cuda else "bf16"}, None),
        ("+ fused optimizer", {"optimizer_impl": "fused"}, None),
        ("+ torch.compile", {"compile": True}, None),
        ("+ CUDA graphs", {"cuda_graphs": True}, None if cuda else "CUDA graphs need a GPU"),
    ]


def bench_ladder(cfg, steps: int = 60, out_dir: str | Path | None = None, progress: bool = True,
                 rounds: int = 1) -> list[dict]:
    """Train ``steps`` steps per rung of the ladder, in one run, and report samples/s and speedups.

    With ``rounds > 1`` every rung is trained once per round, the rungs taking turns, and its
    median is reported: on a shared machine one run's noise can exceed a rung's effect.
    Writes ``ladder.json`` and ``ladder.png`` into ``out_dir`` (default ``runs/ladder``).
    """
    from tqdm.auto import tqdm

    from .train import resolve_device, train_quietly

    device = resolve_device(cfg.device)
    out_dir = Path(out_dir or "runs/ladder")
    settings: dict = {}
    rows: list[dict] = []
    configs = []
    for index, (rung, adds, skipped) in enumerate(ladder_rungs(device)):
        rows.append({"rung": rung, "skipped": skipped} if skipped else {"rung": rung, "rates": []})
        if not skipped:
            settings.update(adds)
            configs.append((rows[-1], cfg.override({
                **settings, "name": f"ladder-{index}", "run_dir": str(out_dir / f"rung{index}"), "max_steps": steps,
                "epochs": 10 ** 6, "checkpoint_every": 0, "plot": False, "progress": False, "warmup_steps": 0})))
    with tqdm(total=rounds * len(configs), desc="ladder", unit="run", disable=not progress) as bar:
        for _ in range(rounds):
            for row, run_cfg in configs:
                result = train_quietly(run_cfg)
                row["rates"].append(result.samples_per_s)
                row.update(applied=result.applied, mfu=result.mfu)
                bar.update()
    for row, _ in configs:
        row["samples_per_s"] = statistics.median(row["rates"])
    measured = [r for r in rows if "samples_per_s" in r]
    for row in measured:
        row["speedup"] = row["samples_per_s"] / measured[0]["samples_per_s"]
    for previous, row in zip(measured, measured[1:]):
        row["vs_previous"] = row["samples_per_s"] / previous["samples_per_s"]
    measured[0]["vs_previous"] = 1.0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ladder.json").write_text(json.dumps({"device": str(device), "steps": steps, "rows": rows},
                                                    indent=1, default=str) + "\n")
    ladder_chart(rows, f"optimization ladder on {device}").savefig(out_dir / "ladder.png", dpi=120)
    return rows


def ladder_chart(rows: list[dict], title: str = "optimization ladder"):
    """The measured rungs as bars at their median with the range of their rounds."""
    from .plots import spread_chart
    from .repeats import Spread

    return spread_chart({r["rung"]: Spread(r["rates"]) for r in rows if "rates" in r}, "samples / s", title)


def format_ladder(rows: list[dict]) -> str:
    """The ladder as a Markdown table."""
    return markdown_table(["rung", "samples/s (median)", "rounds: lowest-highest", "× baseline", "× previous"], [
        (row["rung"], f"skipped: {row['skipped']}", "", "", "") if "skipped" in row else
        (row["rung"], f"{row['samples_per_s']:,.0f}", f"{min(row['rates']):,.0f}-{max(row['rates']):,.0f}",
         f"{row['speedup']:.2f}", f"{row['vs_previous']:.2f}")
        for row in rows])


# -- all-reduce bandwidth ----------------------------------------------------------------------------

#: Message sizes of the all-reduce benchmark: 4 KiB to 256 MiB in steps of 4.
ALLREDUCE_SIZES = tuple(4 * 1024 * 4 ** i for i in range(9))


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``2·(n−1)/n · bytes / time``, comparable across sizes of job."""
    return 2 * (world_size - 1) / world_size * size_bytes / seconds


def slowest_rank(seconds: float, device: torch.device) -> float:
    """The largest of every rank's ``seconds``, reduced on the benchmark's device (NCCL takes no CPU tensors)."""
    from . import distributed

    return float(distributed.all_reduce_max(torch.tensor(seconds, dtype=torch.float64, device=device)))


def bench_allreduce(sizes: Iterable[int] = ALLREDUCE_SIZES, device: str = "auto", min_seconds: float = 0.2,
                    max_iters: int = 50, data_parallel: str = "auto") -> list[dict]:
    """Time the all-reduce of float32 tensors of each size on the active backend; run on every rank.

    The backend is the process group (gloo on CPUs, NCCL on GPUs) or, with
    ``data_parallel="horovod"`` (the default under horovodrun), Horovod. Each size runs a
    few untimed iterations, then enough timed ones to last about ``min_seconds`` (at most
    ``max_iters``). Returns rows on every rank (rank 0 prints them).
    """
    from . import distributed

    env = distributed.init(device, data_parallel=data_parallel)
    if not env.distributed:
        raise distributed.DistributedError("bench allreduce needs several ranks: run it under torchrun, srun, "
                                           "mpirun or horovodrun, or pass --nproc N to start N local processes")
    backend = env.backend if env.backend != "horovod" else "horovod (gloo)" if not env.device.startswith("cuda") \
        else "horovod (nccl)"
    target = torch.device(env.device)
    sync = torch.cuda.synchronize if target.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=target)
        # Timed by hand, not by torch.utils.benchmark: its adaptive repetition would let ranks make
        # different numbers of calls, and each call is a collective. Three untimed calls size the
        # timed loop, and the count comes from the slowest rank's estimate so that all agree.
        sync()
        start = time.perf_counter()
        for _ in range(3):
            distributed.all_reduce_sum(tensor)
        sync()
        estimate = slowest_rank((time.perf_counter() - start) / 3, target)
        iters = int(min(max_iters, max(3, min_seconds / max(estimate, 1e-9))))
        start = time.perf_counter()
        for _ in range(iters):
            distributed.all_reduce_sum(tensor)
        sync()
        seconds = slowest_rank((time.perf_counter() - start) / iters, target)  # the slowest rank sets the pace
        rows.append({"bytes": size, "ms": 1000 * float(seconds), "iters": iters,
                     "algbw_gbs": size / float(seconds) / 1e9,
                     "busbw_gbs": bus_bandwidth(size, float(seconds), env.world_size) / 1e9,
                     "world_size": env.world_size, "backend": backend})
    return rows


def format_allreduce(rows: list[dict]) -> str:
    def size(row: dict) -> str:
        return f"{row['bytes'] / 2**20:g} MiB" if row["bytes"] >= 2 ** 20 else f"{row['bytes'] / 1024:g} KiB"

    table = markdown_table(["size", "time (ms)", "algbw (GB/s)", "busbw (GB/s)"], [
        (size(row), f"{row['ms']:.3f}", f"{row['algbw_gbs']:.3f}", f"{row['busbw_gbs']:.3f}") for row in rows])
    return f"all-reduce, {rows[0]['world_size']} ranks, {rows[0]['backend']}\n\n{table}"


def save_allreduce(rows: list[dict], out_dir: str | Path) -> Path:
    """Write ``allreduce.json`` and ``allreduce.png`` into ``out_dir``."""
    from .plots import allreduce_bandwidth

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "allreduce.json").write_text(json.dumps(rows, indent=1) + "\n")
    allreduce_bandwidth(rows).savefig(out_dir / "allreduce.png", dpi=120)
    return out_dir


def torchrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under torchrun (a free port each time)."""
    from .distributed import free_port

    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={free_port()}",
            "-m", *module_args]


def horovodrun_command(nproc: int, module_args: list[str]) -> list[str]:
    """Start ``python -m MODULE ARGS`` as ``nproc`` local ranks under ``horovodrun --gloo``."""
    import shutil

    from .horovod_backend import INSTALL_HINT, HorovodError

    beside = Path(sys.executable).with_name("horovodrun")
    runner = str(beside) if beside.exists() else shutil.which("horovodrun")
    if runner is None:
        raise HorovodError(f"horovodrun is not installed; {INSTALL_HINT}")
    return [runner, "-np", str(nproc), "--gloo", "-H", f"localhost:{nproc}", sys.executable, "-m", *module_args]


def run_training(cfg, processes: int, run_dir: Path, overrides: Iterable[str], threads: int, label: str) -> dict:
    """Train ``cfg`` with ``overrides`` as ``processes`` local ranks (torchrun beyond one) into ``run_dir``.

    Quiet, no checkpoints, never resumed; every process gets ``threads`` threads. Returns the
    run's ``summary.json``; a failed run raises with the ranks' own error (``label`` names it).
    """
    import subprocess

    from .threads import per_process_env

    args = ["dlscale.train", *(f"{k}={v}" for k, v in cfg.to_dict().items() if k != "profile_steps"), *overrides,
            f"run_dir={run_dir}", "checkpoint_every=0", "progress=false", "plot=false", "resume=false"]
    command = torchrun_command(processes, args) if processes > 1 else [sys.executable, "-m", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=per_process_env(threads))
    if done.returncode != 0:
        # The cause is usually near the start (a rank's own error); torchrun's summary is at the end.
        raise RuntimeError(f"{label} failed:\n{done.stderr[:3000]}\n...\n{done.stderr[-1500:]}")
    return json.loads((Path(run_dir) / "summary.json").read_text())


# -- weak and strong scaling of the training ------------------------------------------------------------

def bench_scaling(cfg, procs: Iterable[int] = (1, 2), steps: int = 60, out_dir: str | Path = "runs/scaling",
                  progress: bool = True, threads: int | None = None) -> list[dict]:
    """Train at each process count, strong (same global batch) and weak (same per-rank batch), and compare.

    Each run is ``dlscale.train`` under torchrun on this machine; on a cluster the same
    comparison comes from the Slurm scripts. Efficiency is throughput over
    ``processes × single-process throughput``. Every process of every run gets the same
    ``threads`` (default: the CPUs shared by the largest run's processes), and each row
    reports the threads its run's summary says it used.
    """
    from tqdm.auto import tqdm

    from .threads import fair_threads

    procs = list(procs)
    threads = threads or fair_threads(max(procs))
    out_dir = Path(out_dir)
    base = cfg.global_batch_size
    jobs = [(mode, n) for mode in ("strong", "weak") for n in procs]
    rows = []
    for mode, n in tqdm(jobs, desc="scaling", unit="run", disable=not progress):
        batch = base if mode == "strong" else base * n
        summary = run_training(cfg, n, out_dir / f"{mode}-n{n}", [f"global_batch_size={batch}", f"max_steps={steps}",
                               "epochs=1000000"], threads, f"{mode} scaling run with {n} processes")
        rows.append({"mode": mode, "processes": n, "global_batch": batch, "samples_per_s": summary["samples_per_s"],
                     "threads_per_process": summary["threads"]["count"]})
    for row in rows:
        single = next(r for r in rows if r["mode"] == row["mode"] and r["processes"] == min(procs))
        row["speedup"] = row["samples_per_s"] / single["samples_per_s"]
        row["efficiency"] = row["speedup"] * single["processes"] / row["processes"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scaling.json").write_text(json.dumps(rows, indent=1) + "\n")
    from .plots import scaling_curves
    scaling_curves(rows).savefig(out_dir / "scaling.png", dpi=120)
    return rows


def format_scaling(rows: list[dict]) -> str:
    return markdown_table(["scaling", "processes", "threads each", "global batch", "samples/s", "speedup",
                           "efficiency"], [
        (r["mode"], r["processes"], r.get("threads_per_process", "?"), r["global_batch"], f"{r['samples_per_s']:,.0f}",
         f"{r['speedup']:.2f}", f"{100 * r['efficiency']:.0f}%") for r in rows])
