"""Conclusions printed from the attendee's own numbers, not asserted in the lesson text.

A lesson's markdown says what to look for and why; these functions read the measurements of
the run that just happened and say what they show, including when they show nothing (the
rounds overlap, a recipe diverged). The notebook tests run them on CI-size runs and check that
each sentence follows from the numbers.
"""

from __future__ import annotations

import math
from typing import Any

from ..repeats import Spread, clearly_faster


def compare_spreads(name: str, spread: Spread, other: str, baseline: Spread) -> str:
    """One sentence: is ``spread`` clearly above, clearly below, or within the rounds of ``baseline``?"""
    ratio = spread.median / baseline.median
    if clearly_faster(spread, baseline):
        verdict = f"clearly faster than {other} ({ratio:.2f}×; every round beat every round of {other})"
    elif clearly_faster(baseline, spread):
        verdict = f"clearly slower than {other} ({ratio:.2f}×; every round lost to every round of {other})"
    else:
        verdict = (f"not distinguishable from {other} on this machine ({ratio:.2f}×, but the rounds overlap: "
                   f"{spread.low:,.0f}-{spread.high:,.0f} against {baseline.low:,.0f}-{baseline.high:,.0f})")
    return f"{name}: {verdict}."


def ladder_conclusions(rows: list[dict[str, Any]]) -> list[str]:
    """For each measured rung of ``bench_ladder(rounds > 1)``: did it help, hurt, or neither?"""
    measured = [r for r in rows if "rates" in r]
    lines = [compare_spreads(row["rung"], Spread(row["rates"]), previous["rung"], Spread(previous["rates"]))
             for previous, row in zip(measured, measured[1:])]
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


def precision_conclusion(r2: dict[str, float], spread: float) -> str:
    """Do the precisions' validation R² differ by more than ``spread`` (run-to-run noise of fp32 seeds)?"""
    low, high = min(r2, key=r2.get), max(r2, key=r2.get)
    gap = r2[high] - r2[low]
    if gap <= spread:
        return (f"The R² of {', '.join(r2)} differ by at most {gap:.3f}, within the {spread:.3f} that fp32 "
                f"alone varies between seeds: no precision lost accuracy here.")
    return (f"{low} reached R² {r2[low]:.3f} against {r2[high]:.3f} for {high}: a gap of {gap:.3f}, larger than "
            f"the {spread:.3f} that fp32 varies between seeds. Look at its loss curve before trusting it.")


def efficiency_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """Scaling rows (``bench_scaling``): the efficiency per mode, and whether both sides had the same threads."""
    threads = {r.get("threads_per_process") for r in rows}
    lines = [f"every process had {threads.pop()} thread(s)" if len(threads) == 1 else
             f"warning: the runs had different threads per process ({sorted(map(str, threads))}): "
             "their efficiencies are not comparable"]
    for row in rows:
        if row["processes"] > min(r["processes"] for r in rows):
            note = " (above 100%: look for a cache effect, or a noisy single-process run)" if row["efficiency"] > 1.05 \
                else ""
            lines.append(f"{row['mode']} scaling to {row['processes']} processes: {100 * row['efficiency']:.0f}% "
                         f"efficiency{note}")
    return lines
