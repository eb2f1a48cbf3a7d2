"""#80: a comparison in one process gives both sides the same torch threads, chosen once and printed.

Beside a busy process the plain recipe (``use_free_cpus``) and the engine each counted the busy CPUs at their own
start, chose different counts, and ``bench parity``'s loss gap rose from 0 to 4-9e-2. Here a fake busy-CPU counter
answers differently at every look: each side left to itself would choose another count each run.
"""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

import pytest
import torch

import dlscale.lessons.recipe_folder  # noqa: F401  (recipes/ on the path: the stages import training_tools)
from dlscale.lessons import parity
from dlscale.lessons.stage_measure import measure_stage
from dlscale.runtime import threads


@pytest.fixture
def fickle_neighbour(monkeypatch):
    """Two CPUs, one of them busy at every other look (the first look: busy); the looks are counted."""
    looks = []
    busy = itertools.cycle([1, 0])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(threads, "busy_cpus", lambda *a, **k: looks.append(1) or next(busy))
    kept = torch.get_num_threads()
    yield looks
    torch.set_num_threads(kept)


def _recipe_side(seen: list):
    """A stage's ``main`` that takes its threads as the plain recipe does (``use_free_cpus``: OMP_NUM_THREADS if set,
    else the CPUs the fake counter leaves free) and records them."""
    from training_tools import use_free_cpus

    def main(**arguments) -> dict:
        count = use_free_cpus() if os.environ.get("OMP_NUM_THREADS") else 2 - threads.busy_cpus()
        seen.append(("recipe", count, torch.get_num_threads()))
        return {"losses": [1.0, 0.5], "r2": [0.5], "throughput": [10.0, 11.0]}

    return main


def test_bench_parity_gives_the_recipe_and_the_engine_the_same_threads_and_prints_them(
    fickle_neighbour, monkeypatch, tmp_path
):
    seen: list = []
    monkeypatch.setattr(parity.runpy, "run_path", lambda path, run_name: {"main": _recipe_side(seen)})

    def engine(config, name, progress, plot, **settings):  # the engine's own choice, as its set-up makes it
        choice = threads.apply_threads(requested=settings.get("threads", 0))
        seen.append(("engine", choice.count, torch.get_num_threads()))
        return SimpleNamespace(steps=[{"loss": 1.0}, {"loss": 0.5}], history=[{"r2": 0.5}])

    monkeypatch.setattr("dlscale.training.loop.train_quietly", engine)
    monkeypatch.chdir(tmp_path)
    row = parity.time_stage("01_baseline.py", rounds=3, config="tiny", epochs=1)
    assert row["threads"] == 1 and "1 of its 2 CPUs busy" in row["threads_source"]  # (chosen once: the first look)
    assert len(fickle_neighbour) == 1  # neither side looked again
    assert {side for side, *_ in seen} == {"recipe", "engine"} and len(seen) == 2 * 4  # (an untimed run, 3 rounds)
    assert {(count, torch_count) for _, count, torch_count in seen} == {(1, 1)}
    assert row["loss_gap"] == 0.0
    table = parity.format_parity([row])
    assert "threads, the same on both sides: 1 (affinity mask, 1 of its 2 CPUs busy" in table
    assert "| 01_baseline | 1 |" in table
    # what each side chooses by itself, with the same counter: another count at each start
    assert {threads.choose_threads().count for _ in range(4)} == {1, 2}


def test_bench_parity_takes_a_count_it_is_given_for_every_stage(fickle_neighbour, monkeypatch, capfd):
    from dlscale.cli import main

    calls = []
    monkeypatch.setattr(
        parity, "time_stage", lambda stage, rounds, threads, **kw: calls.append(threads) or _row(stage, threads)
    )
    assert main(["bench", "parity", "--stages", "01,02", "--rounds", "1"]) == 0
    assert len(fickle_neighbour) == 1 and len({id(choice) for choice in calls}) == 1  # chosen once for both stages
    assert "threads, the same on both sides: 1 (affinity mask" in capfd.readouterr().out
    calls.clear()
    assert main(["bench", "parity", "--stages", "03", "--threads", "2"]) == 0
    assert calls[0].count == 2 and "threads, the same on both sides: 2 (asked for)" in capfd.readouterr().out


def _row(stage: str, choice: threads.ThreadChoice) -> dict:
    """A row of time_stage's shape, for the threads it was given."""
    from dlscale.bench.repeats import Spread

    one = Spread([1.0])
    return {
        "stage": stage,
        "recipe": one,
        "engine": one,
        "ratio": one,
        "loss_gap": 0.0,
        "threads": choice.count,
        "threads_source": "asked for" if choice.source == "config threads" else choice.source,
    }


def test_the_lessons_side_by_side_measurements_run_every_setting_with_one_count(fickle_neighbour):
    """measure_stage without ``threads``: every setting that runs in this process gets the count chosen once before
    the first run (the fake counter would give 1 and 2 by turns), and the measurement records it."""
    seen: list = []
    measured = measure_stage(_recipe_side(seen), {"a": {}, "b": {}}, rounds=3)
    assert len(seen) == 6 and {(count, torch_count) for _, count, torch_count in seen} == {(1, 1)}
    assert measured.threads == 1 and len(fickle_neighbour) == 1
    assert os.environ.get("OMP_NUM_THREADS") is None  # (put back)
