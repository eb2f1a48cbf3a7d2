"""The one door from the notebooks into the kit: every name a lesson, exercise or solution uses.

Lessons import from here only (``from dlscale.lab import bench_allreduce, loss_curves``); the
recipe's own imports (the data set, ``dlscale.optim``'s layer-wise optimizers, the ViT) and
``dlscale.train`` aside. So the package's insides can move or be renamed without touching a lesson:
only the table below changes. The names are stable; a test keeps the notebooks to them.

Two sources give the names. The table below names the rest of the kit, and what several lessons share.
Each lesson's own questions, readings, conclusions and exercise checks live in its module,
``dlscale/lessons/lessonNN.py``, whose ``__all__`` lists what its notebooks import: the door finds those
modules by their file names and reads each ``__all__`` from its source (without importing it), the first
time a name outside the table is asked for. Adding a lesson's module needs no change here; a name two
lesson modules export, or one the table already gives, is an error naming both.

What is here, by what a notebook does with it:

- **train and set up**: the engine (``train``), configs, models, data, devices, optimizers;
- **measure**: the benchmarks (``bench_*``), the profiler's tables, memory, throughput rounds;
- **run elsewhere**: ipyparallel engines, torchrun, a Slurm queue or a cluster on this machine;
- **read and show**: reports, tables and plots;
- **ask and check**: each lesson's module (the predictions asked before a measurement, the readings
  and conclusions drawn from the attendee's numbers, the exercises' checks), the stage's run and check,
  the recipe's engine twin;
- **plan and search**: the scaling model and plans, the hyperparameter search, K-Means.

Each name is imported when first used (PEP 562), so ``import dlscale.lab`` is cheap and a name
whose optional extra is missing fails only when a cell uses it, with the extra's name.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

#: name -> (module, attribute in it; None for the module itself)
_WHERE: dict[str, tuple[str, str | None]] = {}


def _add(module: str, *names: str) -> None:
    for name in names:
        _WHERE[name] = (module, name)


# -- train and set up ----------------------------------------------------------------------------------
_add("dlscale.train", "train", "train_quietly")
_add("dlscale.config", "load_config")
_add("dlscale.models", "CNNRegressor", "ViTRegressor", "build_model")
_add(
    "dlscale.data",
    "FieldSpec",
    "ShardDataset",
    "TARGET_NAMES",
    "generate_fields",
    "make_loader",
    "mini_cosmoflow",
    "prepare_data",
    "read_manifest",
    "synthetic_dir",
)
_add("dlscale.checkpoint", "load_model")
_add("dlscale.runtime.devices", "device_for_ranks", "resolve_device")
_add("dlscale.runtime.precision", "Precision", "gradient_underflow")
_add("dlscale.runtime.threads", "affinity_cpus", "busy_cpus", "fair_threads")
_add("dlscale.bench.threads", "busy_neighbours")
_add("dlscale.optim", "LAMB", "LARS")
_add("dlscale.training.step", "train_step")
_add("dlscale.training.passes", "whole_model")
_add("dlscale.metrics.evaluation", "predict")
_add("dlscale.metrics.steplog", "DivergedError")
_WHERE["distributed"] = ("dlscale.distributed", None)
_add("dlscale.distributed", "detect_launcher", "horovod_backend")

# -- measure ---------------------------------------------------------------------------------------------
_add("dlscale.bench.allreduce", "ALLREDUCE_SIZES", "bench_allreduce")
_add("dlscale.bench.breakdown", "bench_breakdown", "engine_runner", "format_breakdown", "slurm_runner")
_add("dlscale.bench.breakdown_terms", "add_communication_terms")
_add("dlscale.bench.kmeans", "bench_kmeans", "format_kmeans")
_add("dlscale.bench.ladder", "bench_ladder", "format_ladder", "ladder_chart")
_add("dlscale.bench.large_batch", "format_table", "large_batch_sweep", "sweep_figure")
_add("dlscale.bench.loader", "bench_loader")
_add("dlscale.bench.memory", "LAYOUTS", "bench_memory", "format_memory")
_add("dlscale.bench.repeats", "measure_rounds")
_add("dlscale.bench.staging", "bench_staging")
_add("dlscale.profiling", "as_shell", "nsys_command", "nsys_stats_command", "nvtx_range")
_add("dlscale.metrics.memory", "checkpointing_trade")
_add("dlscale.metrics.tracking", "read_rows")
_add("dlscale.metrics.weight_difference", "largest_weight_difference")

# -- run elsewhere: engines, torchrun, Slurm --------------------------------------------------------------
_add("dlscale.jobs.environment", "describe", "environment_report")
_add("dlscale.jobs.local_ranks", "torchrun_command")
_add("dlscale.jobs.local_slurm", "LocalSlurm", "missing_programs", "multi_node_unavailable", "stop_on_error")
_add("dlscale.jobs.notebook_engines", "run_on_engines", "stop_engines", "train_rank")
_add("dlscale.jobs.queue", "job_environ", "open_queue")
_add("dlscale.jobs.slurm_jobs", "job_info", "submit", "submit_sweep", "wait_for_jobs", "wait_until")

# -- read and show -----------------------------------------------------------------------------------------
_add(
    "dlscale.reporting.plots",
    "allreduce_bandwidth",
    "allreduce_fit",
    "bar_chart",
    "breakdown_bars",
    "cost_to_solution",
    "efficiency_projection",
    "kmeans_ratios",
    "loss_curves",
    "map_gallery",
    "memory_chart",
    "noise_scale_curve",
    "predictions_vs_truth",
    "quantized_images",
    "scaling_curves",
    "search_progress",
    "spread_chart",
    "trace_timeline",
    "trial_curves",
    "trust_ratios",
)
_add("dlscale.reporting.report", "collect", "format_report")
_add("dlscale.reporting.tables", "markdown_table")

# -- ask and check: what several lessons share (each lesson's own names are in its module: _lesson_table) ------------
_add("dlscale.lessons.lesson_tools", "compare_spreads", "stage_config")
_add("dlscale.lessons.parity", "engine_twin")
_add("dlscale.lessons.recipes", "recipe_path")
_add("dlscale.lessons.recipes", "show_ours", "show_recipe_change", "use_ours")
_add("dlscale.lessons.stage_probes", "run_stage")
_add("dlscale.lessons.stage_check", "check_gaps", "check_stage")
_add("dlscale.lessons.stage_measure", "checkpoint_shares", "final_r2", "measure_stage", "profile_stage")
_add("dlscale.lessons.gaps", "hint")

# -- plan and search -----------------------------------------------------------------------------------------
_add("dlscale.scaling.fit", "fit_link", "predict_allreduce", "worst_ratio")
_add("dlscale.scaling.overlap", "published_layers")
_add("dlscale.scaling.ddp_cost", "PUBLISHED_DDP_COST")
_add("dlscale.scaling.slowdown", "OVERLAP_SLOWDOWN")
_add("dlscale.scaling.layouts", "GPUS", "Training", "choose_layout", "format_layouts")
_add("dlscale.scaling.model_size", "PRESETS")
_add(
    "dlscale.scaling.plan",
    "allocation_request",
    "compare_with_measured",
    "cost_rows",
    "format_plan",
    "predict_next",
    "recommend",
)
_add(
    "dlscale.scaling.projection",
    "AUTO",
    "RESNET50_A100_IMAGES_PER_S",
    "RESNET50_PARAMETERS",
    "Workload",
    "assumptions",
    "largest_efficient",
    "overlap_from_breakdown",
    "project_efficiency",
    "workload_for",
)
_add("dlscale.scaling.sites", "FRONTIER", "PERLMUTTER", "site_from_link")
_add("dlscale.hpo", "SearchSpaceError", "create_study", "load_space")
_add("dlscale.hpo.space", "SEARCH_DIR")
_add("dlscale.hpo.heartbeat", "wait_for_running")
_add("dlscale.hpo.local_search", "rerun_best", "run_search", "start_workers", "wait_for_workers")
_add(
    "dlscale.hpo.results",
    "best_by_budget",
    "best_trial",
    "curves",
    "format_trials",
    "importances",
    "save_optuna_plots",
    "trial_rows",
)
_add("dlscale.bench.concurrent_trials", "concurrent_or_wide")
_add("dlscale.hpo.worker", "run_worker")
_add("dlscale.kmeans", "KMeans")
_add("dlscale.kmeans.command", "load_sample_image", "quantize", "rank_block")
_add("dlscale.kmeans.on_ranks", "launch_kmeans")
_WHERE["daal4py_available"] = ("dlscale.kmeans.daal", "available")

#: The lessons' own modules: dlscale/lessons/lessonNN.py, each with an ``__all__ = [...]`` of string literals.
_LESSONS = Path(__file__).with_name("lessons")
_LESSON_FILE = re.compile(r"lesson\d\d\.py")
_ALL = re.compile(r"^__all__\s*=\s*(\[[^\]]*\])", re.MULTILINE)


def _lesson_exports(path: Path) -> list[str]:
    """The ``__all__`` of the lesson module at ``path``, read from its source (the module is not imported)."""
    import ast

    found = _ALL.search(path.read_text(encoding="utf-8"))
    try:
        names = ast.literal_eval(found[1]) if found else None
    except (ValueError, SyntaxError):
        names = None
    if not (isinstance(names, list) and all(isinstance(n, str) and n.isidentifier() for n in names)):
        from dlscale.errors import DlscaleError

        raise DlscaleError(f"{path}: a lesson's module lists the names it exports as __all__ = [...] of strings")
    return names


@cache
def _lesson_table(folder: Path = _LESSONS) -> dict[str, tuple[str, str]]:
    """name -> (its lesson module, name), for every name in the ``__all__`` of a ``lessonNN.py`` in ``folder``."""
    table: dict[str, tuple[str, str]] = {}
    for path in sorted(p for p in folder.iterdir() if _LESSON_FILE.fullmatch(p.name)):
        module = f"dlscale.lessons.{path.stem}"
        for name in _lesson_exports(path):
            other = table.get(name) or _WHERE.get(name)
            if other is not None:
                from dlscale.errors import DlscaleError

                raise DlscaleError(
                    f"dlscale.lab: {module} exports {name!r}, which {other[0]} already gives; a name a notebook "
                    f"imports has one home (a name several lessons use belongs in the door's table)"
                )
            table[name] = (module, name)
    return table


if TYPE_CHECKING:  # (editors and type checkers see where each name lives; nothing is imported at run time)
    from dlscale import distributed
    from dlscale.bench.allreduce import ALLREDUCE_SIZES, bench_allreduce
    from dlscale.bench.breakdown import bench_breakdown, engine_runner, format_breakdown, slurm_runner
    from dlscale.bench.breakdown_terms import add_communication_terms
    from dlscale.bench.concurrent_trials import concurrent_or_wide
    from dlscale.bench.kmeans import bench_kmeans, format_kmeans
    from dlscale.bench.ladder import bench_ladder, format_ladder, ladder_chart
    from dlscale.bench.large_batch import format_table, large_batch_sweep, sweep_figure
    from dlscale.bench.loader import bench_loader
    from dlscale.bench.memory import LAYOUTS, bench_memory, format_memory
    from dlscale.bench.repeats import measure_rounds
    from dlscale.bench.staging import bench_staging
    from dlscale.bench.threads import busy_neighbours
    from dlscale.checkpoint import load_model
    from dlscale.config import load_config
    from dlscale.data import (
        TARGET_NAMES,
        FieldSpec,
        ShardDataset,
        generate_fields,
        make_loader,
        mini_cosmoflow,
        prepare_data,
        read_manifest,
        synthetic_dir,
    )
    from dlscale.distributed import detect_launcher, horovod_backend
    from dlscale.hpo import SearchSpaceError, create_study, load_space
    from dlscale.hpo.heartbeat import wait_for_running
    from dlscale.hpo.local_search import rerun_best, run_search, start_workers, wait_for_workers
    from dlscale.hpo.results import (
        best_by_budget,
        best_trial,
        curves,
        format_trials,
        importances,
        save_optuna_plots,
        trial_rows,
    )
    from dlscale.hpo.space import SEARCH_DIR
    from dlscale.hpo.worker import run_worker
    from dlscale.jobs.environment import describe, environment_report
    from dlscale.jobs.local_ranks import torchrun_command
    from dlscale.jobs.local_slurm import LocalSlurm, missing_programs, multi_node_unavailable, stop_on_error
    from dlscale.jobs.notebook_engines import run_on_engines, stop_engines, train_rank
    from dlscale.jobs.queue import job_environ, open_queue
    from dlscale.jobs.slurm_jobs import job_info, submit, submit_sweep, wait_for_jobs, wait_until
    from dlscale.kmeans import KMeans
    from dlscale.kmeans.command import load_sample_image, quantize, rank_block
    from dlscale.kmeans.daal import available as daal4py_available
    from dlscale.kmeans.on_ranks import launch_kmeans
    from dlscale.lessons.gaps import hint
    from dlscale.lessons.lesson_tools import compare_spreads, stage_config
    from dlscale.lessons.parity import engine_twin
    from dlscale.lessons.recipes import recipe_path, show_ours, show_recipe_change, use_ours
    from dlscale.lessons.stage_check import check_gaps, check_stage
    from dlscale.lessons.stage_measure import checkpoint_shares, final_r2, measure_stage, profile_stage
    from dlscale.lessons.stage_probes import run_stage
    from dlscale.metrics.evaluation import predict
    from dlscale.metrics.memory import checkpointing_trade
    from dlscale.metrics.steplog import DivergedError
    from dlscale.metrics.tracking import read_rows
    from dlscale.metrics.weight_difference import largest_weight_difference
    from dlscale.models import CNNRegressor, ViTRegressor, build_model
    from dlscale.optim import LAMB, LARS
    from dlscale.profiling import as_shell, nsys_command, nsys_stats_command, nvtx_range
    from dlscale.reporting.plots import (
        allreduce_bandwidth,
        allreduce_fit,
        bar_chart,
        breakdown_bars,
        cost_to_solution,
        efficiency_projection,
        kmeans_ratios,
        loss_curves,
        map_gallery,
        memory_chart,
        noise_scale_curve,
        predictions_vs_truth,
        quantized_images,
        scaling_curves,
        search_progress,
        spread_chart,
        trace_timeline,
        trial_curves,
        trust_ratios,
    )
    from dlscale.reporting.report import collect, format_report
    from dlscale.reporting.tables import markdown_table
    from dlscale.runtime.devices import device_for_ranks, resolve_device
    from dlscale.runtime.precision import Precision, gradient_underflow
    from dlscale.runtime.threads import affinity_cpus, busy_cpus, fair_threads
    from dlscale.scaling.ddp_cost import PUBLISHED_DDP_COST
    from dlscale.scaling.fit import fit_link, predict_allreduce, worst_ratio
    from dlscale.scaling.layouts import GPUS, Training, choose_layout, format_layouts
    from dlscale.scaling.model_size import PRESETS
    from dlscale.scaling.overlap import published_layers
    from dlscale.scaling.plan import (
        allocation_request,
        compare_with_measured,
        cost_rows,
        format_plan,
        predict_next,
        recommend,
    )
    from dlscale.scaling.projection import (
        AUTO,
        RESNET50_A100_IMAGES_PER_S,
        RESNET50_PARAMETERS,
        Workload,
        assumptions,
        largest_efficient,
        overlap_from_breakdown,
        project_efficiency,
        workload_for,
    )
    from dlscale.scaling.sites import FRONTIER, PERLMUTTER, site_from_link
    from dlscale.scaling.slowdown import OVERLAP_SLOWDOWN
    from dlscale.train import train, train_quietly
    from dlscale.training.passes import whole_model
    from dlscale.training.step import train_step


def __getattr__(name: str) -> Any:
    """Import the module behind ``name`` on first use and keep the value (PEP 562); ``__all__`` is the table's
    names and the lesson modules', listed when first asked for."""
    if name == "__all__":
        names = globals()["__all__"] = sorted({**_WHERE, **_lesson_table()})
        return names
    where = None if name.startswith("__") else _WHERE.get(name) or _lesson_table().get(name)
    if where is None:
        raise AttributeError(
            f"module 'dlscale.lab' has no attribute {name!r}: the lessons' names are dlscale.lab.__all__"
        )
    module, attribute = where
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __getattr__("__all__")
