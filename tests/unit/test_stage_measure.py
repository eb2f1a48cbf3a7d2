"""The lessons measure the attendee's stage, and check the attendee's reading of it against their numbers."""

from __future__ import annotations

import pytest

from dlscale.bench.repeats import Spread
from dlscale.lessons.lesson01 import FASTEST_BATCH
from dlscale.lessons.lesson02 import FEWEST_WORKERS
from dlscale.lessons.lesson03 import FP16_KEPT
from dlscale.lessons.lesson04 import LARGEST_RANGE
from dlscale.lessons.lesson05 import TWO_RANK_EFFICIENCY
from dlscale.lessons.lesson07 import LARGER_BATCH_KEPT
from dlscale.lessons.lesson10 import SHARD_SHARE
from dlscale.lessons.stage_measure import (
    MEASURED,
    StageFailed,
    StageMeasurement,
    checkpoint_shares,
    final_r2,
    measure_stage,
    steady_throughput,
)


def _stage(rates: dict[int, float], calls: list):
    """A stage whose samples/s depend on its batch size: a first (warm-up) block, then steady blocks."""

    def main(batch_size: int = 32, epochs: int = 1, checkpoint: str = "x.pt") -> dict:
        calls.append(batch_size)
        print("a line the notebook must not show")
        return {
            "losses": [1.0],
            "r2": [0.5],
            "throughput": [1.0, rates[batch_size], rates[batch_size] + 2],
            "mark": "m",
        }

    return main


def test_each_setting_can_run_on_its_own_thread_count_and_the_count_is_put_back():
    """#63, lesson 02's shared node: a thread per CPU against a thread per free CPU, in turns."""
    import torch

    seen: list = []

    def main(threads_asked: int = 0, epochs: int = 1) -> dict:
        seen.append((threads_asked, torch.get_num_threads()))
        return {"losses": [1.0], "r2": [0.5], "throughput": [1.0, 2.0, 2.0]}

    kept = torch.get_num_threads()
    measure_stage(
        main, {"one": {"threads_asked": 1}, "two": {"threads_asked": 2}}, rounds=1, threads={"one": 1, "two": 2}
    )
    assert seen == [(1, 1), (2, 2)] and torch.get_num_threads() == kept


def test_a_measurement_runs_the_stage_it_is_given_with_each_setting_and_says_whose(capsys):
    calls: list = []
    before = len(MEASURED)
    measured = measure_stage(
        _stage({16: 100.0, 64: 300.0}, calls), {16: {"batch_size": 16}, 64: {"batch_size": 64}}, rounds=2
    )
    assert calls == [16, 64, 64, 16]  # the settings take turns, the order reversed every other round
    assert measured[64].values == [301.0, 301.0]  # the steady blocks' median: the warm-up block left out
    assert measured.whose == "your stage" and str(measured).startswith("your stage, 16: 101")
    assert [run["mark"] for run in MEASURED[before:]] == ["m"] * 4  # what the marked-stage tests read
    assert "must not show" not in capsys.readouterr().out


def test_our_stage_says_it_is_ours_and_a_failing_stage_is_one_line_naming_whose():
    from dlscale.lessons.recipes import use_ours

    ours = use_ours("01")
    assert measure_stage(ours, {}).whose == "our stage (use_ours)"

    def broken(epochs: int = 1) -> dict:
        raise NotImplementedError("TODO 01.b: each step starts from zero gradients")

    with pytest.raises(
        StageFailed,
        match=r"^your stage stopped while being measured with \{'epochs': 1\}: "
        r"NotImplementedError: TODO 01.b.*use_ours",
    ):
        measure_stage(broken, {"one": {"epochs": 1}})
    with pytest.raises(StageFailed, match="returned no 'throughput'"):
        measure_stage(lambda: {"losses": [], "r2": []}, {"one": {}})
    with pytest.raises(StageFailed, match="logged no samples/s"):
        steady_throughput({"throughput": []})
    with pytest.raises(StageFailed, match="no validation R²"):
        final_r2({"r2": []})


def test_checkpoint_shares_read_the_latest_epoch_of_a_dcp_folder(tmp_path):
    for epoch, sizes in ((1, (10, 10)), (2, (30, 10))):
        folder = tmp_path / f"epoch-{epoch}"
        folder.mkdir()
        for rank, size in enumerate(sizes):
            (folder / f"__{rank}_0.distcp").write_bytes(b"x" * size)
        (folder / ".metadata").write_bytes(b"m" * 99)
    assert checkpoint_shares(tmp_path) == {"__0_0.distcp": 0.75, "__1_0.distcp": 0.25}
    with pytest.raises(StageFailed, match="holds no .distcp file"):
        checkpoint_shares(tmp_path / "none")


def _spreads(**values: list[float]) -> StageMeasurement:
    return StageMeasurement("your stage", {int(k[1:]): Spread(v) for k, v in values.items()})


def test_each_reading_accepts_what_the_numbers_show_and_names_them_otherwise():
    rates = _spreads(b16=[100, 110], b64=[300, 320], b256=[310, 330])  # 64 and 256 overlap: both "fastest"
    assert "support it: 64" in FASTEST_BATCH.check(64, rates)
    assert "support it: 256" in FASTEST_BATCH.check(256, rates)
    wrong = FASTEST_BATCH.check(16, rates)
    assert wrong.startswith("Your numbers do not support 16: they show batch 256 fastest") and "batch 64" in wrong
    assert FASTEST_BATCH.check(None, rates).startswith("You left your conclusion empty")

    workers = _spreads(w0=[50, 52], w1=[90, 95], w2=[92, 99])  # 1 is as fast as 2: the fewest that are
    assert "support it" in FEWEST_WORKERS.check(1, workers)
    assert "do not support 2" in FEWEST_WORKERS.check(2, workers)

    r2 = {"fp32": 0.60, "bf16": 0.59, "fp16": 0.50}
    assert "support it" in FP16_KEPT.check(False, r2, 0.02)
    assert "do not support True" in FP16_KEPT.check(True, r2, 0.02)
    assert "do not support 'no'" in FP16_KEPT.check("no", r2, 0.02)  # True or False, not a word

    times = {"forward": 5.0, "backward": 9.0, "optimizer step": 8.5}
    assert "support it" in LARGEST_RANGE.check("backward", times, list(times))
    assert "support it" in LARGEST_RANGE.check("optimizer step", times, list(times))  # within 10%
    assert "do not support 'forward'" in LARGEST_RANGE.check("forward", times, list(times))

    scaling = StageMeasurement("your stage", {"1 rank": Spread([100, 100]), "2 ranks": Spread([150, 150])})
    assert "support it" in TWO_RANK_EFFICIENCY.check(75, scaling, "1 rank", "2 ranks", 2)
    assert "do not support 150" in TWO_RANK_EFFICIENCY.check(150, scaling, "1 rank", "2 ranks", 2)

    assert "support it" in LARGER_BATCH_KEPT.check(False, {64: 0.5, 256: 0.3})
    assert "do not support True" in LARGER_BATCH_KEPT.check(True, {64: 0.5, 256: 0.3})

    assert "support it" in SHARD_SHARE.check(50, {"__0_0.distcp": 0.44, "__1_0.distcp": 0.56})
    assert "do not support 100" in SHARD_SHARE.check(100, {"__0_0.distcp": 0.44, "__1_0.distcp": 0.56})
