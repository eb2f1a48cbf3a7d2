"""The large-batch sweep at CI size: it writes its table and figure, and shows what lesson 07 teaches."""

import csv
import re
from dataclasses import replace

import pytest

from dlscale.bench.large_batch import RECIPES, SIZES, large_batch_sweep

from ..conftest import run_cli


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard: 13 runs take ~40 s on 2 quiet cores and 2-3x that on a busy machine
def test_large_batch_sweep_writes_its_table_and_tells_the_story(in_tmp):
    # every recipe the story below reads (sqrt scaling, which it does not, is left out: 3 runs fewer; so is LARS,
    # whose sweep lesson 07's test runs, and whose steps tests/unit/test_layerwise.py holds to timm's: 3 more)
    told = [r for r in RECIPES if r not in ("sqrt", "LARS + warmup")]
    # (lesson 07's "ci" size on three quarters of its maps: 6,144, three shards)
    size = replace(SIZES["ci"], overrides={**SIZES["ci"].overrides, "train_samples": 6144})
    rows = large_batch_sweep("sweep", size=size, recipes=told, progress=False)
    assert len(rows) == 1 + 3 * len(told)
    with open(in_tmp / "sweep/table.csv") as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    table = (in_tmp / "sweep/table.md").read_text()
    assert "| LAMB + warmup |" in table and "batch 2048 (128×)" in table
    assert (in_tmp / "sweep/sweep.png").read_bytes()[:4] == b"\x89PNG"

    r2 = {(r["recipe"], r["multiple"]): r["val_r2"] for r in rows}
    baseline = r2[("baseline", 1)]
    noise_scale = rows[0]["noise_scale"]
    # the measured noise scale lies between the baseline batch and the largest, where scaling stops paying. It is a
    # statistic of float32 training and moves with the CPU's kernels: 746 on an Intel Xeon, below 512 on CI's CPU.
    assert 16 < noise_scale < 2048
    # without scaling, the largest batch falls far behind
    assert r2[("no scaling", 128)] < baseline - 0.3
    # below the noise scale (8x) a scaled recipe keeps up with the baseline, to the tolerance lesson 07's
    # conclusions use ("within 0.02 of the baseline")...
    assert max(r2[(r, 8)] for r in told if r != "no scaling") > baseline - 0.02
    # ...warmup helps linear scaling (where, moves with the CPU's float32 kernels: at 32x on CI's CPU, at 8x on an
    # Intel Xeon, where the two tie at 32x: 0.612 and 0.614), and at 32x the layer-wise optimizer holds up better
    # than no scaling
    assert any(r2[("linear + warmup", k)] > r2[("linear", k)] for k in (8, 32))
    assert r2[("LAMB + warmup", 32)] > r2[("no scaling", 32)]


def test_bench_optim_prints_ratios_side_by_side(in_tmp):
    done = run_cli("bench", "optim", "--models", "lesson", "--steps", "2", "--rounds", "1", cwd=in_tmp)
    assert done.returncode == 0, done.stderr
    for name in ("AdamW (foreach)", "SGD (foreach)", "LAMB (dlscale)", "LARS (dlscale)", "LAMB (timm)", "LARS (timm)"):
        assert f"| {name} |" in done.stdout, name
    assert re.search(
        r"lesson: LAMB \(dlscale\) = [\d.]+x AdamW \(foreach\), [\d.]+x (faster|slower) than LAMB \(timm\)", done.stdout
    )  # (which of the two is a measurement, not something a test can promise)


def test_a_recipe_that_diverges_is_a_row_of_the_table_not_a_failed_sweep(in_tmp):
    from dlscale.bench.large_batch import SweepSize

    size = SweepSize(base_config="tiny", base_batch=32, multiples=(2,), epochs=1, sgd_lr=1e9)
    rows = large_batch_sweep("sweep", size=size, recipes=["linear"], progress=False)
    diverged = next(r for r in rows if r["recipe"] == "linear")
    assert diverged["val_r2"] != diverged["val_r2"] and diverged["steps"] >= 1  # NaN, and the step it happened
    assert "| linear | diverged |" in (in_tmp / "sweep/table.md").read_text()
    assert "starting afresh" in (in_tmp / "sweep/b64-linear/output.log").read_text()  # its log is kept


def test_bench_parity_times_a_stage_against_its_engine_twin_on_the_same_steps(in_tmp):
    done = run_cli(
        "bench", "parity", "--stages", "01", "--rounds", "1", "--epochs", "1", "--config", "tiny", cwd=in_tmp
    )
    assert done.returncode == 0, done.stderr
    row = re.search(r"\| 01_baseline \| ([\d.]+) .*\| ([\d.]+) .*\| ([\d.]+)× .*\| (\S+) \|", done.stdout)
    assert row and float(row[4]) == 0.0, done.stdout  # the same losses, step for step
    assert not list(in_tmp.iterdir())  # (it ran in a folder of its own)
    refused = run_cli("bench", "parity", "--stages", "05", cwd=in_tmp)
    assert refused.returncode == 2 and "no single-process stage 05" in refused.stderr
