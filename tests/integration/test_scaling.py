"""Where the efficiency goes and how many nodes to ask for: the tests that launch ranks, engines or runs beside them
(tests/unit/test_scaling.py
has the rest)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dlscale.bench.breakdown import ADDS_UP_WITHIN, ALONE, FULL, MEMORY
from dlscale.scaling.fit import fit_link, predict_allreduce, worst_ratio


def test_an_fsdp_breakdown_takes_the_communication_from_the_profiler_and_adds_up(tmp_path, monkeypatch):
    """FSDP cannot step without its collectives: the no-communication time is the step less gloo's own time."""
    from dlscale.bench.breakdown import bench_breakdown, engine_runner
    from dlscale.config import load_config

    monkeypatch.chdir(tmp_path)
    cfg = load_config("vit-tiny", ["data_parallel=fsdp", "global_batch_size=16", "val_samples=256"])
    result = bench_breakdown(
        cfg, [1, 2], engine_runner(cfg), steps=30, rounds=1, out_dir=tmp_path / "bd", progress=False
    )
    assert result["layout"] == "FSDP/TP" and "profiler" in result["no_communication_from"]
    one, two = result["rows"]
    assert set(two["ms"]) == {FULL, MEMORY, ALONE}  # (no run with data_parallel=none, nor with buckets)
    summary = json.loads((tmp_path / "bd/ranks2-data_in_memory__profiled-round1/profile_summary.json").read_text())
    assert summary["collectives_ms_per_step"] > 0
    assert two["ms"][MEMORY] - two["ms"][ALONE] == pytest.approx(summary["collectives_ms_per_step"])
    assert two["communication"] > 0
    assert abs(two["io"] + two["communication"] + two["rest"] - two["loss"]) <= ADDS_UP_WITHIN
    assert (tmp_path / "bd/breakdown.png").stat().st_size > 10_000


def test_data_in_memory_and_every_rank_alone_change_what_the_run_does(tmp_path, monkeypatch):
    """The two ways the breakdown adds to the engine: batches replayed from the device, and no DDP at all."""
    from dlscale.jobs.notebook_engines import run_on_engines, train_rank

    monkeypatch.chdir(tmp_path)
    done = run_on_engines(
        train_rank,
        2,
        "tiny",
        data_parallel="none",
        data_in_memory=True,
        max_steps=6,
        epochs=99,
        norm="group",
        progress=False,
        plot=False,
        checkpoint_every=0,
        threads=1,
        run_dir=str(tmp_path / "alone"),
    )
    applied = done[0]["applied"]
    assert applied["ddp"] is False and applied["data_parallel_ranks"] == 2 and applied["world_size"] == 2
    from dlscale.config import ConfigError, load_config
    from dlscale.distributed.launch_variables import DistEnv
    from dlscale.distributed.parallelize import plan_parallelism

    with pytest.raises(ConfigError, match="tensor_parallel"):
        plan_parallelism(
            load_config("vit-tiny", ["data_parallel=none", "tensor_parallel=2"]).sections.parallel,
            DistEnv(rank=0, world_size=2),
        )


#: How far the model fitted here may miss on message sizes it did not see (measured: within 1.3x; docs/benchmarks.md).
HELD_OUT_WITHIN = 2.0

#: The link the test's ranks talk over: loopback in a network namespace of the test's own, shaped by the kernel's
#: token-bucket filter. Then the wire, not the CPU, sets the time of every message from 64 KiB up, and a busy machine
#: (the other test process, the suite's installs) cannot move the measurement as it moves gloo on plain loopback.
#: The burst is above loopback's 64 KiB MTU (a packet larger than the burst would never leave).
SHAPED_LINK = "tbf rate 200mbit burst 256kb latency 1s"


def _allreduce_on_a_shaped_link(out) -> list[dict]:
    script = (
        f"ip link set lo up && tc qdisc add dev lo root {SHAPED_LINK} && exec {sys.executable} -m dlscale bench "
        f"allreduce --nproc 2 --max-mib 1 --out {out}"
    )
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "allreduce.json").read_text())


def test_the_model_fitted_here_predicts_message_sizes_it_was_not_fitted_on(tmp_path):
    if os.geteuid() != 0 or not shutil.which("tc"):
        pytest.skip("needs root and tc (iproute2) for a network namespace of its own with a shaped link")
    # Each size's fastest of two launches (a busy spell only ever slows a collective down). Fitted on the smallest
    # sizes (α) and the largest (β); checked on the sizes between, which neither term decides alone. (Rank counts:
    # on one shaped loopback all ranks share one link, not a ring of links, so docs/benchmarks.md gives the ratio
    # measured on plain loopback instead; on GPU nodes the check belongs there.)
    launches = [_allreduce_on_a_shaped_link(tmp_path / f"launch{turn}") for turn in range(2)]
    measured = {rows[0]["bytes"]: {**rows[0], "ms": min(r["ms"] for r in rows)} for rows in zip(*launches)}
    held_out = [measured.pop(64 * 1024), measured.pop(256 * 1024)]
    link = fit_link(measured.values())
    assert link.alpha > 0 and link.beta > 0
    assert worst_ratio(predict_allreduce(link, held_out)) <= HELD_OUT_WITHIN


def test_ddp_cost_is_measured_on_one_rank_and_read_back_as_the_projections_prices(in_tmp):
    """#79: the engine's step with and without DDP over a gloo group of one, at two bucket caps: more buckets as the
    cap shrinks, a fit written beside the times, and dlscale project taking it (and a factor for the slow-down)."""
    from dlscale.scaling.ddp_cost import measured_ddp_cost

    from ..conftest import run_cli

    done = run_cli(
        "bench", "ddp-cost", "tiny", "--buckets", "25,0.001", "--blocks", "2", "--steps", "1", "--out", "dc", cwd=in_tmp
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DDP's own cost:" in done.stdout and "gradient_as_bucket_view=true" in done.stdout
    result = json.loads((in_tmp / "dc/ddp_cost.json").read_text())
    (model,) = result["models"]
    assert [way["way"] for way in model["ways"]] == ["no DDP", "25 MiB", "0.001 MiB"]
    assert [way["buckets"] for way in model["ways"]][:2] == [0, 1] and model["ways"][2]["buckets"] > 1
    assert measured_ddp_cost(in_tmp / "dc/ddp_cost.json").source.startswith("measured: ")
    shown = run_cli(
        "project",
        "--samples-per-s",
        "2600",
        "--ddp-cost",
        "dc/ddp_cost.json",
        "--slowdown",
        "0.5",
        "--out",
        "p",
        cwd=in_tmp,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "DDP's own cost: " in shown.stdout and "(measured: " in shown.stdout
    assert "costs the backward pass 0.5 s more (entered on the command line)" in shown.stdout


def test_the_overlap_slowdown_is_measured_beside_a_real_allreduce(in_tmp):
    """#79: two local ranks time the backward pass alone, the all-reduce alone and the two together (gloo)."""
    from dlscale.bench.overlap_slowdown import ALLREDUCE, ALONE, BESIDE
    from dlscale.scaling.slowdown import measured_slowdown

    from ..conftest import run_cli

    done = run_cli("bench", "overlap", "tiny", "--nproc", "2", "--blocks", "2", "--out", "ov", cwd=in_tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "slow-down of the overlapped backward pass" in done.stdout
    result = json.loads((in_tmp / "ov/overlap.json").read_text())
    assert result["backend"] == "gloo" and result["ranks"] == 2 and set(result["ms"]) == {ALONE, ALLREDUCE, BESIDE}
    assert all(ms > 0 for ms in result["ms"].values()) and result["slowdown"] >= 0
    factor, where = measured_slowdown(in_tmp / "ov/overlap.json")
    assert 0 <= factor <= 1 and "gloo on 2 ranks" in where
    alone = run_cli("bench", "overlap", "tiny", "--nproc", "1", cwd=in_tmp)
    assert alone.returncode == 2 and "needs several ranks" in alone.stderr
