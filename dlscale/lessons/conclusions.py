"""Conclusions printed from the attendee's own numbers, not asserted in the lesson text.

A lesson's markdown says what to look for and why; these functions read the measurements of
the run that just happened and say what they show, including when they show nothing (the
rounds overlap, a recipe diverged). The notebook tests run them on CI-size runs and check that
each sentence follows from the numbers.
"""

from __future__ import annotations

import math
from typing import Any

from dlscale.bench.repeats import Spread, clearly_faster


def compare_spreads(name: str, spread: Spread, other: str, baseline: Spread) -> str:
    """One sentence: is ``spread`` clearly above, clearly below, or within the rounds of ``baseline``?"""
    ratio = spread.median / baseline.median
    if clearly_faster(spread, baseline):
        verdict = f"clearly faster than {other} ({ratio:.2f}×; every round beat every round of {other})"
    elif clearly_faster(baseline, spread):
        verdict = f"clearly slower than {other} ({ratio:.2f}×; every round lost to every round of {other})"
    else:
        verdict = (
            f"not distinguishable from {other} on this machine ({ratio:.2f}×, but the rounds overlap: "
            f"{spread.low:,.0f}-{spread.high:,.0f} against {baseline.low:,.0f}-{baseline.high:,.0f})"
        )
    return f"{name}: {verdict}."


def loader_conclusion(supply: Spread, demand: Spread) -> str:
    """Can the loader keep the model fed? ``supply``: the loader alone (one process, samples/s);
    ``demand``: training on plain maps, what the model could take."""
    if clearly_faster(supply, demand):
        return (
            f"One process augments {supply.median:,.0f} samples/s, more than the model's {demand.median:,.0f}: "
            f"moved into one worker, the augmentation can be hidden behind the training entirely. In the "
            f"training process it cannot: there every step pays for it in full."
        )
    if clearly_faster(demand, supply):
        needed = math.ceil(demand.median / supply.median)
        return (
            f"Starved: one process augments only {supply.median:,.0f} samples/s, and the model could take "
            f"{demand.median:,.0f}. Even moved into a worker, one worker cannot keep up; it takes about "
            f"{needed} workers, each with a core of its own."
        )
    return (
        f"Too close to call on this machine: the loader's {supply.low:,.0f}-{supply.high:,.0f} samples/s and the "
        f"model's {demand.low:,.0f}-{demand.high:,.0f} overlap, so one worker is just about enough."
    )


def convergence_conclusion(r2: list[float]) -> str:
    """What a run's validation R² by epoch shows: where it started and ended, its largest gain, any fall."""
    if len(r2) < 2:
        return f"One epoch only (R² {r2[0]:.3f}): train longer to see the curve." if r2 else "No validation yet."
    gains = [later - earlier for earlier, later in zip(r2, r2[1:])]
    best = max(range(len(gains)), key=gains.__getitem__)
    text = (
        f"R² went from {r2[0]:.3f} after epoch 1 to {r2[-1]:.3f} after epoch {len(r2)}; the largest gain came "
        f"in epoch {best + 2} ({gains[best]:+.3f})."
    )
    falls = [epoch + 2 for epoch, gain in enumerate(gains) if gain < 0]
    if falls:
        return text + (
            f" It fell in epoch(s) {', '.join(map(str, falls))}: one validation point is noisy (and the LR "
            f"is at its highest early on), so judge the trend, not a single epoch."
        )
    return text + " It rose in every epoch."


def ladder_conclusions(rows: list[dict[str, Any]]) -> list[str]:
    """For each measured rung of ``bench_ladder(rounds > 1)``: did it help, hurt, or neither?"""
    measured = [r for r in rows if "rates" in r]
    lines = [
        compare_spreads(row["rung"], Spread(row["rates"]), previous["rung"], Spread(previous["rates"]))
        for previous, row in zip(measured, measured[1:])
    ]
    lines += [f"{r['rung']}: skipped ({r['skipped']})." for r in rows if "skipped" in r]
    return lines


def sweep_conclusions(rows: list[dict[str, Any]], tolerance: float = 0.02) -> list[str]:
    """What the large-batch sweep shows, per batch multiple: the best recipe, who kept up, who diverged."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    lines = [f"baseline: batch {baseline['batch']}, R² {baseline['val_r2']:.3f}."]
    for multiple in sorted({r["multiple"] for r in rows if r["recipe"] != "baseline"}):
        runs = [r for r in rows if r["multiple"] == multiple and r["recipe"] != "baseline"]
        finite = [r for r in runs if math.isfinite(r["val_r2"]) and r["val_r2"] > -1]
        diverged = [r["recipe"] for r in runs if r not in finite]
        parts = []
        if finite:
            best = max(finite, key=lambda r: r["val_r2"])
            kept_up = [r["recipe"] for r in finite if r["val_r2"] >= baseline["val_r2"] - tolerance]
            parts.append(f"best {best['recipe']} (R² {best['val_r2']:.3f}, {best['steps']} steps)")
            parts.append(f"within {tolerance} of the baseline: {', '.join(kept_up) if kept_up else 'none'}")
        if diverged:
            parts.append(f"diverged: {', '.join(diverged)}")
        lines.append(f"{multiple}× (batch {runs[0]['batch']}): " + "; ".join(parts) + ".")
    return lines


def noise_scale_conclusions(rows: list[dict[str, Any]], b_simple: float, tolerance: float = 0.02) -> list[str]:
    """Per batch multiple of the sweep: the batch against the measured noise scale, and whether any recipe
    kept up with the baseline there (McCandlish et al.: batches well beyond B_simple stop paying)."""
    baseline = next(r for r in rows if r["recipe"] == "baseline")
    lines = []
    for multiple in sorted({r["multiple"] for r in rows if r["recipe"] != "baseline"}):
        runs = [r for r in rows if r["multiple"] == multiple and r["recipe"] != "baseline"]
        kept_up = [
            r["recipe"] for r in runs if math.isfinite(r["val_r2"]) and r["val_r2"] >= baseline["val_r2"] - tolerance
        ]
        where = "below" if runs[0]["batch"] < b_simple else "beyond"
        lines.append(
            f"batch {runs[0]['batch']} is {runs[0]['batch'] / b_simple:.2g}× B_simple ({where} it): "
            + (
                f"{', '.join(kept_up)} kept up with the baseline."
                if kept_up
                else "no recipe kept up with the baseline."
            )
        )
    return lines


def precision_conclusion(r2: dict[str, float], spread: float) -> str:
    """Do the precisions' validation R² differ by more than ``spread`` (run-to-run noise of fp32 seeds)?"""
    low, high = min(r2, key=r2.get), max(r2, key=r2.get)
    gap = r2[high] - r2[low]
    if gap <= spread:
        return (
            f"The R² of {', '.join(r2)} differ by at most {gap:.3f}, within the {spread:.3f} that fp32 "
            f"alone varies between seeds: no precision lost accuracy here."
        )
    return (
        f"{low} reached R² {r2[low]:.3f} against {r2[high]:.3f} for {high}: a gap of {gap:.3f}, larger than "
        f"the {spread:.3f} that fp32 varies between seeds. Look at its loss curve before trusting it."
    )


def efficiency_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """Scaling rows (``bench_scaling``): the efficiency per mode, and whether both sides had the same threads."""
    threads = {r.get("threads_per_process") for r in rows}
    lines = [
        f"every process had {threads.pop()} thread(s)"
        if len(threads) == 1
        else f"warning: the runs had different threads per process ({sorted(map(str, threads))}): "
        "their efficiencies are not comparable"
    ]
    for row in rows:
        if row["processes"] > min(r["processes"] for r in rows):
            note = (
                " (above 100%: look for a cache effect, or a noisy single-process run)"
                if row["efficiency"] > 1.05
                else ""
            )
            lines.append(
                f"{row['mode']} scaling to {row['processes']} processes: {100 * row['efficiency']:.0f}% "
                f"efficiency{note}"
            )
    return lines


def memory_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """The memory table (``bench_memory``): what each sharded layout holds and costs against DDP on as many ranks."""
    lines = []
    for row in rows:
        if row["layout"].startswith(("1 process", "DDP")):
            continue
        lines.append(
            f"{row['layout']}: each rank holds {row['held_vs_ddp']:.2f}x the parameters, gradients and "
            f"optimizer state of DDP on {row['processes']} ranks (1/{row['processes']} would be "
            f"{1 / row['processes']:.2f}), and a step takes {row['step_vs_ddp']:.2f}x as long"
        )
    return lines


_PART_NAMES = {"io": "exposed I/O", "communication": "exposed communication", "rest": "the rest"}


def breakdown_conclusions(result: dict[str, Any]) -> list[str]:
    """The breakdown (``bench_breakdown``): per size, the loss and its largest part, whether the rounds agree on
    which part that is, and the bucket size that hid the most communication."""
    lines = []
    for row in result["rows"][1:]:
        parts = sorted(("io", "communication", "rest"), key=lambda p: -row[p])
        top, second = parts[0], parts[1]
        low_top, _ = row["range"][top]
        _, high_second = row["range"][second]
        sure = (
            "one round only: run more to know how sure that is"
            if result["rounds"] < 2
            else "every round agrees"
            if low_top > high_second
            else f"but the rounds overlap with {_PART_NAMES[second]} ({100 * row['range'][second][0]:.0f} to "
            f"{100 * high_second:.0f}%): run more rounds or steps before acting on it"
        )
        lines.append(
            f"{row['size']} {result['unit']}: {100 * row['efficiency']:.0f}% efficient; of the "
            f"{100 * row['loss']:.0f}% lost, {_PART_NAMES[top]} is the largest part "
            f"({100 * row[top]:.0f}%), {sure}"
        )
        exposed = row.get("exposed_communication_ms")
        if exposed and len(exposed) > 1:
            best = min(exposed, key=exposed.get)
            others = ", ".join(f"{mb} MiB {ms:.2f} ms" for mb, ms in exposed.items() if mb != best)
            lines.append(
                f"buckets of {best} MiB left the least communication exposed ({exposed[best]:.2f} ms per "
                f"step; {others})"
            )
    return lines


def search_conclusions(
    summary: dict[str, dict[str, Any]],
    rows: dict[str, list[list[dict[str, Any]]]],
    baseline: float,
    pruning: dict[str, dict[str, Any]] | None = None,
    pruned_way: str = "tpe + hyperband",
    plain_way: str = "tpe",
) -> list[str]:
    """What lesson 12's searches show over their seeds (``rows[way]``: the trials of each seed's study): the samplers
    with pruning off (``summary``, ``repeated_searches`` of those studies), then what pruning changed on one sampler
    (``pruning``, ``repeated_searches`` of its two ways: each question at its own common budget). A tie is called a
    tie, and a lead whose seeds overlap another's is not called a win."""
    from dlscale.lessons.predictions import SEARCHES, clear_winner

    def shown(way: str, table: dict[str, dict[str, Any]] = summary) -> str:
        s = table[way]
        return f"{way} {s['median']:.4f} ({s['low']:.4f} to {s['high']:.4f})"

    seeds = len(next(iter(rows.values())))
    samplers = [w for w in SEARCHES if w in summary]
    lines = [
        f"Within {summary[samplers[0]]['budget'] * 3600:.1f} node-seconds (what the cheapest study spent), the best "
        f"R², median over {seeds} seeds (range): "
        + ", ".join(shown(w) for w in samplers)
        + f"; the config's defaults give {baseline:.4f}."
    ]
    winner = clear_winner(summary, samplers)
    ranked = sorted(samplers, key=lambda w: -summary[w]["median"])
    if winner:
        lines.append(
            f"With pruning off, {winner} found the best settings on every seed: its worst seed beats the others' best."
        )
    elif summary[ranked[0]]["median"] - summary[ranked[1]]["median"] <= 1e-12:
        tied = [w for w in ranked if summary[ranked[0]]["median"] - summary[w]["median"] <= 1e-12]
        lines.append(f"{' and '.join(tied)} tie on the median: at this budget the samplers cannot be told apart.")
    else:
        lines.append(
            f"{ranked[0]} is ahead on the median, but its seeds overlap {ranked[1]}'s: at this budget "
            f"the sampler matters less than the draw. More trials, or more seeds, would tell."
        )
    if pruning and pruned_way in pruning and plain_way in pruning:
        trials = [t for study in rows[pruned_way] for t in study]
        pruned = [t for t in trials if t["state"] == "pruned"]
        a, b = pruning[plain_way], pruning[pruned_way]
        cheaper = b["high_spent"] < a["low_spent"]
        lines.append(
            f"Pruning, on {plain_way}: {len(pruned)} of {len(trials)} trials stopped early; node-seconds "
            f"spent, median {a['median_spent'] * 3600:.1f} without and {b['median_spent'] * 3600:.1f} with "
            f"({a['low_spent'] * 3600:.1f}-{a['high_spent'] * 3600:.1f} against "
            f"{b['low_spent'] * 3600:.1f}-{b['high_spent'] * 3600:.1f}): "
            + (
                "cheaper on every seed."
                if cheaper
                else "the ranges overlap, so these seeds do not show pruning saving node-hours."
            )
            + f" Best R² within {b['budget'] * 3600:.1f} node-seconds (what the cheapest of these spent): "
            f"{shown(plain_way, pruning)} against {shown(pruned_way, pruning)}."
        )
    return lines


def width_conclusions(result: dict[str, Any]) -> list[str]:
    """Concurrent trials against one wider trial on the same devices (dlscale.bench.concurrent_trials)."""
    many, wide, n = result["concurrent"], result["wide"], result["workers"]
    speedup = many["seconds"] / wide["seconds"]  # (one trial on one rank, of n at once; one trial on n ranks)
    efficiency = speedup / n
    lines = [
        f"{n} trials at once, one rank each: each took {many['seconds']:.1f} s, {many['trials_per_hour']:.0f} "
        f"trials per hour in all (R² {many['r2']:.4f} at global batch {many['global_batch']}).",
        f"One trial at a time over {n} ranks: each took {wide['seconds']:.1f} s, {wide['trials_per_hour']:.0f} "
        f"trials per hour (R² {wide['r2']:.4f} at global batch {wide['global_batch']}). {n} ranks made one "
        f"trial {speedup:.2f}x as fast as one rank did, {efficiency:.0%} of the ideal {n}x: that is the "
        f"scaling efficiency.",
    ]
    if efficiency < 1:
        lines.append(
            "Below perfect scaling the concurrent trials finish more of the search per device-hour; a wider "
            "trial pays only when the search must wait for each result."
        )
    b_simple = wide.get("noise_scale")
    if b_simple:
        ratio = wide["global_batch"] / b_simple
        rough = (
            "one estimate from one short trial, which can be off several times over (lesson 07 measures it on "
            "longer runs and finds other values)"
        )
        if 1 / 3 <= ratio <= 3:
            lines.append(
                f"The wide trial's batch {wide['global_batch']} is within a factor of 3 of its measured noise "
                f"scale B_simple ≈ {b_simple:.0f}, {rough}: too close to say on which side it lies."
            )
        else:
            above = ratio > 3
            lines.append(
                f"The wide trial's batch {wide['global_batch']} is {'above' if above else 'below'} its "
                f"measured noise scale B_simple ≈ {b_simple:.0f} by more than 3x ({rough}): "
                + (
                    "past it, a wider trial needs more epochs for the same R², so widening stops paying"
                    if above
                    else "widening can still keep the epochs per trial"
                )
            )
    return lines
