"""The conclusions the lessons print follow from the numbers they are given, and the helpers behind them."""

import math

import pytest
import torch

from dlscale.bench.repeats import Spread, clearly_faster, measure_rounds
from dlscale.lessons.lesson01 import convergence_conclusion
from dlscale.lessons.lesson02 import loader_conclusion
from dlscale.lessons.lesson03 import precision_conclusion
from dlscale.lessons.lesson04 import ladder_conclusions
from dlscale.lessons.lesson05 import efficiency_conclusion
from dlscale.lessons.lesson07 import noise_scale_conclusions, sweep_conclusions
from dlscale.lessons.lesson_tools import compare_spreads
from dlscale.metrics.weight_difference import largest_weight_difference


def test_spreads_are_compared_by_their_ranges_not_their_medians():
    fast, slow, overlapping = Spread([110, 120, 130]), Spread([90, 95, 100]), Spread([95, 125, 140])
    assert clearly_faster(fast, slow) and not clearly_faster(overlapping, slow)
    assert "clearly faster" in compare_spreads("b", fast, "a", slow)
    assert "clearly slower" in compare_spreads("a", slow, "b", fast)
    assert "not distinguishable" in compare_spreads("c", overlapping, "a", slow)  # higher median, but overlap
    assert str(Spread([1000, 3000, 2000])) == "2,000 (rounds 1,000-3,000)"


def test_rounds_take_turns_and_keep_every_value():
    calls = []
    spreads = measure_rounds({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"] and spreads["b"].values == [2.0] * 3  # (no one always second)


def test_the_noise_scale_sentences_place_each_batch_against_b_simple():
    rows = [
        _sweep_row("baseline", 1, 0.744),
        _sweep_row("linear + warmup", 8, 0.733),
        _sweep_row("no scaling", 8, 0.631),
        _sweep_row("LARS + warmup", 32, 0.625),
        _sweep_row("linear + warmup", 32, float("nan")),
    ]
    lines = noise_scale_conclusions(rows, b_simple=288)
    assert lines[0].startswith("batch 128 is 0.44× B_simple (below it): linear + warmup kept up")
    assert lines[1].startswith("batch 512 is 1.8× B_simple (beyond it): no recipe kept up")


def test_the_loader_sentence_says_whether_one_worker_can_keep_up():
    fast, slow = Spread([1600, 1650, 1700]), Spread([780, 800, 810])
    assert "can be hidden" in loader_conclusion(fast, slow)
    starved = loader_conclusion(slow, fast)
    assert starved.startswith("Starved") and "about 3 workers" in starved  # ceil(1650 / 800)
    assert "Too close to call" in loader_conclusion(Spread([800, 900]), Spread([850, 950]))


def test_the_convergence_sentence_follows_the_curve():
    text = convergence_conclusion([0.759, 0.816, 0.681, 0.897, 0.894, 0.921])
    assert "from 0.759 after epoch 1 to 0.921 after epoch 6" in text
    assert "largest gain came in epoch 4 (+0.216)" in text and "fell in epoch(s) 3, 5" in text
    assert convergence_conclusion([0.3, 0.5, 0.55]).endswith("It rose in every epoch.")
    assert "train longer" in convergence_conclusion([0.4])


def test_ladder_conclusions_name_each_rung_against_the_one_before():
    rows = [
        {"rung": "fp32", "rates": [100, 102, 101]},
        {"rung": "compile", "rates": [150, 155, 149]},
        {"rung": "fused", "rates": [148, 160, 151]},
        {"rung": "CUDA graphs", "skipped": "needs a GPU"},
    ]
    lines = ladder_conclusions(rows)
    assert lines[0].startswith("compile: clearly faster than fp32")
    assert lines[1].startswith("fused: not distinguishable from compile")
    assert lines[2] == "CUDA graphs: skipped (needs a GPU)."


def _sweep_row(recipe, multiple, r2, steps=10):
    return {"recipe": recipe, "multiple": multiple, "batch": 16 * multiple, "val_r2": r2, "steps": steps}


def test_sweep_conclusions_follow_the_table_including_divergence():
    rows = [
        _sweep_row("baseline", 1, 0.80, 100),
        _sweep_row("sqrt", 32, 0.79),
        _sweep_row("linear + warmup", 32, 0.70),
        _sweep_row("LARS + warmup", 32, math.nan),
        _sweep_row("sqrt", 8, 0.50),
        _sweep_row("linear + warmup", 8, 0.81),
    ]
    lines = sweep_conclusions(rows)
    assert lines[1] == (
        "8× (batch 128): best linear + warmup (R² 0.810, 10 steps); within 0.02 of the baseline: linear + warmup."
    )
    assert lines[2] == (
        "32× (batch 512): best sqrt (R² 0.790, 10 steps); within 0.02 of the baseline: sqrt; diverged: LARS + warmup."
    )


def test_precision_conclusion_weighs_the_gap_against_seed_noise():
    assert "no precision lost accuracy" in precision_conclusion({"fp32": 0.80, "bf16": 0.79, "fp16": 0.81}, 0.03)
    verdict = precision_conclusion({"fp32": 0.80, "bf16": 0.70, "fp16": 0.81}, 0.03)
    assert verdict.startswith("bf16 reached R² 0.700 against 0.810 for fp16")


def test_efficiency_conclusion_flags_runs_with_different_threads():
    rows = [
        {"mode": "strong", "processes": 1, "efficiency": 1.0, "threads_per_process": 1},
        {"mode": "strong", "processes": 2, "efficiency": 0.6, "threads_per_process": 1},
    ]
    assert efficiency_conclusion(rows) == [
        "every process had 1 thread(s)",
        "strong scaling to 2 processes: 60% efficiency",
    ]
    rows[0]["threads_per_process"] = 2
    assert efficiency_conclusion(rows)[0].startswith("warning: the runs had different threads per process")


def test_largest_weight_difference_over_every_tensor():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert largest_weight_difference(a, b) == 0.0
    with torch.no_grad():
        b.bias[1] += 0.25
    assert largest_weight_difference(a, b.state_dict()) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="differ in their tensors"):
        largest_weight_difference(a, torch.nn.Linear(3, 2, bias=False))


# -- predictions asked before the measurement --------------------------------------------------------


def test_a_prediction_is_printed_beside_what_the_measurement_shows():
    from dlscale.lessons.lesson01 import CONVERGENCE

    assert (
        CONVERGENCE.verdict("a", [0.2, 0.4, 0.5])
        == "You predicted (a), and the measurement says (a) rises in every epoch."
    )
    assert CONVERGENCE.verdict("a", [0.2, 0.5, 0.45]).startswith(
        "You predicted (a) rises in every epoch; the measurement says (b) falls in at least one epoch."
    )
    assert CONVERGENCE.verdict(None, [0.2, 0.4]).startswith("No prediction was made")
    with pytest.raises(ValueError, match="prediction must be one of 'a', 'b'"):
        CONVERGENCE.verdict("yes", [0.2, 0.4])


def test_each_question_reads_its_answer_from_the_numbers():
    from dlscale.bench.repeats import Spread
    from dlscale.lessons.lesson02 import LOADER
    from dlscale.lessons.lesson03 import ACCURACY_BY_PRECISION
    from dlscale.lessons.lesson05 import STRONG_SCALING
    from dlscale.lessons.lesson07 import NO_SCALING, NOISE_SCALE
    from dlscale.lessons.lesson10 import FSDP_MEMORY

    assert [
        LOADER.outcome(Spread([900, 950]), Spread([400, 420])),
        LOADER.outcome(Spread([400, 420]), Spread([900, 950])),
        LOADER.outcome(Spread([400, 950]), Spread([500, 900])),
    ] == ["a", "b", "c"]
    assert ACCURACY_BY_PRECISION.outcome({"fp32": 0.80, "bf16": 0.79}, 0.02) == "a"
    assert ACCURACY_BY_PRECISION.outcome({"fp32": 0.80, "fp16": 0.70}, 0.02) == "b"
    rows = [
        {"mode": "strong", "processes": 1, "efficiency": 1.0},
        {"mode": "weak", "processes": 2, "efficiency": 0.95},
        {"mode": "strong", "processes": 2, "efficiency": 0.62},
    ]
    assert STRONG_SCALING.outcome(rows) == "b"  # the strong row, not the weak one
    sweep = [
        {"recipe": "baseline", "multiple": 1, "val_r2": 0.80},
        {"recipe": "no scaling", "multiple": 8, "val_r2": 0.79},
        {"recipe": "no scaling", "multiple": 32, "val_r2": 0.60},
    ]
    assert NO_SCALING.outcome(sweep) == "b"  # judged at the largest multiple
    assert NO_SCALING.outcome(sweep[:2]) == "a"
    assert NO_SCALING.outcome([sweep[0], {"recipe": "LAMB", "multiple": 8, "val_r2": 0.7}]) is None
    assert NO_SCALING.verdict("a", [sweep[0], {"recipe": "LAMB", "multiple": 8, "val_r2": 0.7}]).startswith(
        "This run did not measure it"
    )
    assert [NOISE_SCALE.outcome(b, [64, 512, 2048]) for b in (20.0, 300.0, 5000.0)] == ["a", "b", "c"]
    memory = [
        {"layout": "DDP 2", "processes": 2, "held_vs_ddp": 1.0},
        {"layout": "FSDP 2", "processes": 2, "held_vs_ddp": 0.52},
    ]
    assert FSDP_MEMORY.outcome(memory) == "b"


def test_the_search_verdict_reads_the_seeds_and_calls_a_tie_a_tie():
    from dlscale.lessons.lesson12 import BEST_PER_COST, repeated_searches, search_conclusions

    def study(*bests):  # (node-hours spent, best so far) after each of a study's trials, 1 node-second each
        return [((i + 1) / 3600, b) for i, b in enumerate(bests)]

    clear = {
        "grid": [study(0.3, 0.4), study(0.2, 0.45), study(0.41, 0.41)],
        "random": [study(0.5, 0.5), study(0.3, 0.52), study(0.5, 0.55)],
        "tpe": [study(0.6, 0.7), study(0.66, 0.66), study(0.2, 0.61)],
    }
    assert BEST_PER_COST.outcome(repeated_searches(clear)) == "c"  # TPE's worst seed beats the others' best
    # TPE ahead on the median, but one of its seeds falls below random's best: no clear winner
    overlap = {**clear, "tpe": [study(0.6, 0.7), study(0.66, 0.66), study(0.2, 0.51)]}
    assert BEST_PER_COST.outcome(repeated_searches(overlap)) == "d"
    # random and TPE drawing the same best on every seed tie exactly: a tie, not a win for whichever comes first
    tie = {**clear, "tpe": clear["random"]}
    summary = repeated_searches(tie)
    assert BEST_PER_COST.outcome(summary) == "d"
    rows = {way: [[{"state": "complete"}] * 2] * 3 for way in tie}
    assert "random and tpe tie on the median" in search_conclusions(summary, rows, 0.3)[1]
    # the medians are compared at the budget the cheapest study spent: a study that ran on does not win by spending
    longer = {**clear, "grid": [study(0.3, 0.4, 0.9), study(0.2, 0.45, 0.9), study(0.41, 0.41, 0.9)]}
    assert repeated_searches(longer)["grid"]["median"] == pytest.approx(0.41)


def test_the_breakdown_verdict_says_when_the_rounds_disagree():
    from dlscale.lessons.lesson11 import LARGEST_LOSS

    def result(rest_range, communication_range):
        row = {
            "size": 2,
            "io": 0.01,
            "communication": 0.2,
            "rest": 0.22,
            "range": {"io": (0.0, 0.02), "communication": communication_range, "rest": rest_range},
        }
        return {"rounds": 2, "rows": [{"size": 1}, row]}

    assert LARGEST_LOSS.outcome(result((0.21, 0.23), (0.19, 0.205))) == "c"
    assert LARGEST_LOSS.outcome(result((0.09, 0.23), (0.19, 0.25))) == "d"  # quiet and loaded rounds disagree


def test_the_width_sentence_says_what_it_compares():
    from dlscale.lessons.lesson12 import width_conclusions

    lines = width_conclusions(
        {
            "workers": 2,
            "concurrent": {"seconds": 2.5, "trials_per_hour": 2880, "r2": 0.5, "global_batch": 32},
            "wide": {"seconds": 2.5, "trials_per_hour": 1440, "r2": 0.45, "global_batch": 64, "noise_scale": 70.0},
        }
    )
    assert "2 ranks made one trial 1.00x as fast as one rank did, 50% of the ideal 2x" in lines[1]
    assert "too close to say" in lines[-1]  # 64 against a B_simple of 70 from one short trial
