"""The engine against the plain recipe: each stage's engine twin, and the two timed in turns (``dlscale bench parity``).

Every stage of ``recipes/`` has a twin: ``dlscale.train`` with the settings that make it compute what the stage's
``main(**arguments)`` computes (:func:`engine_settings`), step for step (the tests hold the losses equal). Timing
the two in turns, in one process, on the same data, shows what the engine costs over the plain loop: its set-up
(the FLOP count, the checks), its step log, its checkpoints and summary. ``docs/benchmarks.md`` has the figures.

Both sides run with the same torch threads, chosen once (:func:`parity_threads`) and given to each: the recipe through
``OMP_NUM_THREADS`` (its ``use_free_cpus`` keeps it), the engine through its config's ``threads``. Left to count the
busy CPUs at their own start, the two chose different counts beside a busy process, and their losses parted by
4-9e-2.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlscale.bench.repeats import Spread, measure_rounds
from dlscale.lessons.recipe_folder import RecipeError, recipe_path
from dlscale.runtime.threads import ThreadChoice, choose_threads, pinned_threads

#: Recipe arguments whose config key has another name.
_CONFIG_KEYS = {
    "batch_size": "global_batch_size",
    "workers": "num_workers",
    "clip": "grad_clip",
    "tp": "tensor_parallel",
    "scaling": "lr_scaling",
    "optimizer_name": "optimizer",
    "accumulate": "grad_accumulation",
    "schedule": "pipeline_schedule",
    "microbatches": "pipeline_microbatches",
    "stages_per_rank": "pipeline_virtual_stages",
}
#: Recipe arguments with no effect on what is computed (where it runs, where it writes, what it logs).
_NOT_COMPUTED = {"device", "checkpoint", "resume", "config", "log_every", "profile_steps"}


def recipe_defaults(stage: str) -> dict:
    """The arguments of a stage's ``main`` and their defaults (read from its file, which is not run)."""
    import ast

    tree = ast.parse(recipe_path(stage).read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    names = [a.arg for a in main.args.args]
    defaults = main.args.defaults
    return {
        name: ast.literal_eval(value)
        for name, value in zip(names[len(names) - len(defaults) :], defaults)
        if name != "device"
    }


def engine_settings(stage: str, **arguments) -> tuple[str, dict]:
    """``(config, overrides)`` with which ``dlscale.train`` computes what ``main(**arguments)`` of a stage does.

    The recipe's defaults apply where ``arguments`` are silent; the stage's record says what else its twin needs
    (:attr:`~dlscale.lessons.stage_record.Stage.twin`: a constant LR before 07, fp32 before 03, group norm, the
    memory layout, the model and its parallelism).
    """
    from dlscale.lessons.stages import stage_record

    values = {**recipe_defaults(stage), **arguments}
    overrides = {_CONFIG_KEYS.get(k, k): v for k, v in values.items() if k not in _NOT_COMPUTED}
    overrides.setdefault("num_workers", 0)
    if overrides.get("lr_scaling") == "auto":  # stage 07's rule: square root for Adam-like optimizers
        overrides["lr_scaling"] = "sqrt" if overrides.get("optimizer", "adamw") in ("adamw", "lamb") else "linear"
    overrides.update(stage_record(stage).twin)
    if overrides.get("pipeline_parallel") == "every other rank":  # stage 13: the ranks not splitting a stage's matrices
        world = int(os.environ.get("WORLD_SIZE", "1"))
        overrides["pipeline_parallel"] = world // int(overrides.get("tensor_parallel", 1))
        if overrides.get("pipeline_schedule") != "interleaved-1f1b":  # (the stage runs one stage per rank then)
            overrides["pipeline_virtual_stages"] = 1
    return values.get("config", "tiny"), overrides


def engine_twin(stage: str, name: str | None = None, threads: int | None = None, **arguments) -> dict:
    """``dlscale.train`` with the settings of a stage's ``main(**arguments)``, its results shaped as the recipe's:
    ``{"losses": [per step], "r2": [per epoch]}`` (on engines too: nothing in it holds a sharded model). ``threads``:
    the config's ``threads`` (the count the stage ran with, for a comparison); None: the engine chooses."""
    from dlscale.training.loop import train_quietly

    config, settings = engine_settings(stage, **arguments)
    if threads:
        settings["threads"] = threads
    result = train_quietly(config, name=name or f"engine-twin-{stage[:-3]}", progress=False, plot=False, **settings)
    return {"losses": [row["loss"] for row in result.steps], "r2": [row["r2"] for row in result.history]}


def largest_loss_gap(recipe_losses: list[float], twin_losses: list[float]) -> float:
    """The largest difference between the losses a recipe logged and those of its engine twin, step by step."""
    if len(recipe_losses) != len(twin_losses):
        raise RecipeError(f"the recipe took {len(recipe_losses)} steps, the engine {len(twin_losses)}")
    return max(abs(a - b) for a, b in zip(recipe_losses, twin_losses))


#: The stages that run in one process (the others need ranks), with the arguments the benchmark gives each: the
#: shipped tiny config, fp32 where a stage would pick the precision, no loader workers (one process, 2 cores).
SINGLE_PROCESS = {
    "01_baseline.py": {},
    "02_data_loading.py": {"workers": 0},
    "03_mixed_precision.py": {"precision": "fp32", "workers": 0},
    "04_compile.py": {"precision": "fp32", "workers": 0},
}


@contextlib.contextmanager
def _in_folder(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def parity_threads(requested: int = 0) -> ThreadChoice:
    """The torch threads both sides of a comparison get, chosen once: ``requested`` if given, else as the engine
    chooses (:func:`~dlscale.runtime.threads.choose_threads`: ``OMP_NUM_THREADS``, Slurm's CPUs, or the CPUs of the
    affinity mask that no other process keeps busy now)."""
    return choose_threads(requested=requested)


def time_stage(
    stage: str, rounds: int = 3, threads: int | ThreadChoice | None = None, **arguments: Any
) -> dict[str, Any]:
    """The recipe's ``main(**arguments)`` and its engine twin, each run ``rounds`` times in turns after one untimed run
    of each (it makes the data set and warms the caches), in a fresh folder, both with ``threads`` torch threads (a
    count, or :func:`parity_threads`'s choice for several stages; None: chosen here, once). Returns both spreads
    (seconds), the engine-to-recipe ratio of each round, the largest loss gap seen (0 when the two computed the same)
    and the threads both used, with where the count came from."""
    choice = threads if isinstance(threads, ThreadChoice) else parity_threads(threads or 0)
    count = choice.count
    arguments = {"device": "cpu", **SINGLE_PROCESS.get(stage, {}), **arguments}
    main = runpy.run_path(str(recipe_path(stage)), run_name="recipe")["main"]
    gaps: list[float] = []
    last: dict[str, dict] = {}

    def run(which: str) -> float:
        # (the recipe prints its steps; the table is what counts)
        with contextlib.redirect_stdout(io.StringIO()), pinned_threads(count):
            start = time.perf_counter()
            out = main(**arguments) if which == "recipe" else engine_twin(stage, threads=count, **arguments)
            seconds = time.perf_counter() - start
        last[which] = out
        if len(last) == 2:
            gaps.append(largest_loss_gap(last["recipe"]["losses"], last["engine"]["losses"]))
        return seconds

    with tempfile.TemporaryDirectory(prefix="dlscale-parity-") as folder, _in_folder(Path(folder)):
        run("recipe"), run("engine")
        spreads = measure_rounds({"recipe": lambda: run("recipe"), "engine": lambda: run("engine")}, rounds)
    ratios = Spread([e / r for e, r in zip(spreads["engine"].values, spreads["recipe"].values)])
    return {
        "stage": stage,
        "recipe": spreads["recipe"],
        "engine": spreads["engine"],
        "ratio": ratios,
        "loss_gap": max(gaps),
        "threads": count,
        "threads_source": "asked for" if choice.source == "config threads" else choice.source,
    }


def format_parity(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`time_stage`'s rows, after a line with the threads both sides used."""
    counts = sorted({(row["threads"], row["threads_source"]) for row in rows})
    lines = [
        "threads, the same on both sides: " + "; ".join(f"{count} ({source})" for count, source in counts),
        "",
        "| stage | threads | recipe s | engine s | engine / recipe | largest loss gap |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        recipe, engine, ratio = row["recipe"], row["engine"], row["ratio"]
        lines.append(
            f"| {row['stage'][:-3]} | {row['threads']} | {recipe.median:.2f} ({recipe.low:.2f}–{recipe.high:.2f}) | "
            f"{engine.median:.2f} ({engine.low:.2f}–{engine.high:.2f}) | {ratio.median:.3f}× "
            f"({ratio.low:.3f}–{ratio.high:.3f}) | {row['loss_gap']:.1e} |"
        )
    return "\n".join(lines)
