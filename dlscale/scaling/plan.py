"""``dlscale plan``: a sweep turned into an allocation request — time and node-hours to a target, and the next size up.

From a sweep's run directories (``dlscale report`` reads the same ones) each run's wall time to the
target R² and what it cost: node-hours (nodes × hours) and GPU-hours (ranks × hours). The fastest
and the cheapest are the two corners of one plot; :func:`recommend` picks the cheapest run that
meets a deadline and a budget, or says which one fails and by how much.

:func:`predict_next` predicts the next size up (twice the nodes of the largest run) before anyone
pays for it, from two models the lessons built:

- **the step**: the largest run's step time plus the growth of the all-reduce that the α–β model
  (:mod:`~dlscale.scaling.collectives`, with a link fitted by :mod:`~dlscale.scaling.fit`) predicts
  from its ranks to twice as many, less the share the breakdown measured as hidden;
- **the samples to the target**: with the gradient noise scale B_noise of lesson 07 (McCandlish
  et al. 2018), reaching a loss takes ``E_min·(1 + B/B_noise)`` samples: a global batch beyond
  B_noise buys little per sample.

How sure: the range spans the link fit's worst miss on sizes it was not fitted on (both ways) and
B_noise halved and doubled; outside it lie what neither model has (stragglers, another job on the
network, a run that reaches the target an epoch later by chance).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dlscale.errors import DlscaleError, check_range
from dlscale.reporting.report import collect, read_summary
from dlscale.reporting.tables import markdown_table
from dlscale.scaling.collectives import layout_seconds
from dlscale.scaling.layouts import group_placement
from dlscale.scaling.projection import BACKWARD_SHARE
from dlscale.scaling.sites import Site
from dlscale.scaling.slowdown import OVERLAP_SLOWDOWN, slowdown_seconds

#: DDP's default bucket_cap_mb, in bytes: the all-reduce goes out in buckets this size, each paying the latency.
DDP_BUCKET_BYTES = 25 * 2**20


class PlanError(DlscaleError, ValueError):
    """A sweep that cannot be planned from; the message says why and what to run."""


def cost_rows(paths: list[str | Path], target_r2: float) -> list[dict]:
    """``dlscale report``'s rows, each with its hours to the target, node-hours, GPU-hours, samples to the target
    and gradient bytes (None where the run never reached the target)."""
    rows = collect(paths, target_r2)
    for row in rows:
        seconds = row["time_to_target_s"]
        summary = read_summary(Path(row["path"]))
        parallel = summary.get("parallel") if isinstance(summary.get("parallel"), dict) else {}
        # (the whole gradient; a summary from before it was recorded: rank 0's parameters, whole under DDP)
        row["gradient_bytes"] = parallel.get("gradient_bytes") or (summary.get("memory_per_rank") or [{}])[0].get(
            "parameters"
        )
        row["data_parallel"] = parallel.get("data_parallel", "ddp")
        row["tensor_parallel"] = int(parallel.get("tensor_parallel") or 1)
        row["pipeline_parallel"] = int(parallel.get("pipeline_parallel") or 1)
        row["noise_scale"] = summary.get("noise_scale")
        row["hours_to_target"] = None if seconds is None else seconds / 3600
        row["node_hours"] = None if seconds is None else row["nodes"] * seconds / 3600
        row["gpu_hours"] = None if seconds is None else row["ranks"] * seconds / 3600
        row["samples_to_target"] = None if seconds is None else seconds * row["samples_per_s"]
    return rows


def recommend(rows: list[dict], deadline_hours: float | None = None, budget_node_hours: float | None = None) -> dict:
    """The cheapest run (fewest node-hours) that reached the target within the deadline and the budget.

    Returns ``{"run": name or None, "why": one sentence}``; ties in node-hours go to the faster run.
    """
    reached = [r for r in rows if r["hours_to_target"] is not None]
    if not reached:
        return {"run": None, "why": "no run reached the target: train longer, or lower the target"}
    on_time = [r for r in reached if deadline_hours is None or r["hours_to_target"] <= deadline_hours]
    affordable = [r for r in on_time if budget_node_hours is None or r["node_hours"] <= budget_node_hours]
    if not on_time:
        fastest = min(reached, key=lambda r: r["hours_to_target"])
        return {
            "run": None,
            "why": f"no run meets the deadline of {deadline_hours:g} h: the fastest, {fastest['run']}, "
            f"took {fastest['hours_to_target']:.3g} h; ask for more nodes or a later deadline",
        }
    if not affordable:
        cheapest = min(on_time, key=lambda r: r["node_hours"])
        return {
            "run": None,
            "why": f"no run within the deadline fits {budget_node_hours:g} node-hours: the cheapest, "
            f"{cheapest['run']}, used {cheapest['node_hours']:.3g}; ask for a larger budget",
        }
    best = min(affordable, key=lambda r: (r["node_hours"], r["hours_to_target"]))
    fastest = min(reached, key=lambda r: r["hours_to_target"])
    also = (
        ""
        if best is fastest
        else (
            f"; the fastest, {fastest['run']}, would cost "
            f"{fastest['node_hours'] / best['node_hours']:.2g}× the node-hours"
        )
    )
    return {
        "run": best["run"],
        "why": f"{best['run']} ({best['nodes']} node(s), global batch "
        f"{best['global_batch_size']}) is the cheapest that meets "
        f"{'the deadline' if deadline_hours else 'the target'}: "
        f"{best['hours_to_target']:.3g} h, {best['node_hours']:.3g} node-hours{also}",
    }


def links_for(
    rows: list[dict], allreduce: str | Path | None = None, site: str | None = None
) -> tuple[Site | None, float]:
    """The links a prediction uses, and how far their model missed: α and β fitted to a ``dlscale bench allreduce``
    result (``allreduce.json``; the miss measured on every other size, held out of a first fit), or a site's
    published links (miss 1: unknown until measured), or None."""
    from dlscale.scaling.fit import fit_link, predict_allreduce, read_allreduce, worst_ratio
    from dlscale.scaling.sites import SITES, site_from_link

    if allreduce:
        measured = read_allreduce(allreduce)
        # (one rank's rows time no link: the model gives them 0 s, and the fit leaves them out too)
        linked = [r for r in measured if r["world_size"] > 1]
        first, held = linked[::2], linked[1::2]
        held_out = 1.0
        if held and len({r["bytes"] for r in first}) >= 2:
            held_out = worst_ratio(predict_allreduce(fit_link(first), held))
        return site_from_link(fit_link(measured), max(r["ranks"] // r["nodes"] for r in rows)), held_out
    if site:
        return SITES[site], 1.0
    return None, 1.0


def save_plan(rows: list[dict], recommendation: dict, prediction: dict | None, out_dir: str | Path) -> Path:
    """``plan.json`` (the runs, the recommendation, the prediction) and ``plan.png`` (fastest against cheapest)."""
    from dlscale.reporting.plots import cost_to_solution

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.json").write_text(
        json.dumps({"runs": rows, "recommendation": recommendation, "prediction": prediction}, indent=1, default=str)
        + "\n"
    )
    cost_to_solution(rows, recommendation["run"]).savefig(out_dir / "plan.png", dpi=120)
    return out_dir


def samples_factor(batch: float, next_batch: float, noise_scale: float | None) -> float:
    """How many times the samples to a target grow from ``batch`` to ``next_batch``: (1 + B'/B_noise)/(1 +
    B/B_noise)."""
    if not noise_scale:
        return 1.0
    return (1 + next_batch / noise_scale) / (1 + batch / noise_scale)


def _communication_growth(
    last: dict, per_node: int, nodes: int, site: Site, overlap: float, step: float
) -> tuple[str, int, int, float, float]:
    """(layout, tensor-parallel size, pipeline stages, the communication's growth from ``last``'s nodes to ``nodes``,
    its exposed part), priced as dlscale project prices it: 25 MiB buckets, each with NCCL's own choice on a site that
    runs NCCL (the cheapest textbook algorithm between nodes elsewhere, as on a link fitted here);
    FSDP's all-gathers and reduce-scatter on two levels; tensor parallelism splits each layer inside the node and a
    pipeline cuts the layers into stages, so the data-parallel ranks send 1/(tp·pp) of the gradient each, in groups
    placed as the kit's mesh places them (:func:`~dlscale.scaling.layouts.group_placement`; TP's own activations and
    the pipeline's sends and bubble are in the measured step, and do not change: each rank keeps its micro-batches).
    The overlap hides at most the backward pass (as dlscale project bounds it), and what it hides still slows the
    backward pass by the published factor (:data:`~dlscale.scaling.slowdown.OVERLAP_SLOWDOWN`). DDP's own cost does
    not grow with the nodes (its buckets and bytes stay the same): the measured step holds it already."""
    layout = "fsdp" if last.get("data_parallel") == "fsdp" else "ddp"
    tp = max(1, int(last.get("tensor_parallel") or 1))
    pp = max(1, int(last.get("pipeline_parallel") or 1))
    gradient = (last["gradient_bytes"] or 0) / (tp * pp)

    def seconds(n: int) -> float:
        members, groups = group_placement(max(1, n * per_node // (tp * pp)), tp, per_node)
        return layout_seconds(
            layout, gradient, members, groups, site.inside, site.between, "auto", DDP_BUCKET_BYTES, site.nccl
        )

    now, then = seconds(last["nodes"]), seconds(nodes)
    backward = BACKWARD_SHARE * step

    def exposed_of(comm: float) -> float:
        hidden = min(overlap * comm, backward)
        return comm - hidden + slowdown_seconds(hidden, OVERLAP_SLOWDOWN)

    return layout, tp, pp, then - now, exposed_of(then) - exposed_of(now)


def predict_next(
    rows: list[dict],
    site: Site,
    overlap: float = 0.0,
    noise_scale: float | None = None,
    model_error: float = 1.0,
    group: str | None = None,
) -> dict:
    """The next size up of a sweep's series (``group``, default the weak one): twice the nodes of its largest run.

    ``site`` gives the α–β links inside and between nodes (:func:`~dlscale.scaling.sites.here` for a
    link fitted on this machine, or a site's published one), ``overlap`` the share of the
    communication the breakdown saw hidden, ``noise_scale`` B_noise (default: what the largest run
    measured, if it did), ``model_error`` the link fit's worst miss (:func:`~dlscale.scaling.fit.worst_ratio`).
    Returns the prediction with its low and high ends and the lines it rests on.
    """
    check_range("overlap (the share of communication hidden)", overlap, 0, 1)
    series = [r for r in rows if r["group"] == (group or _weak_group(rows)) and r["hours_to_target"] is not None]
    if not series:
        raise PlanError(
            "no run of the series reached the target R²: there is nothing to predict from. Lower "
            "--target-r2 (dlscale report shows each run's R²) or train the runs longer"
        )
    last = max(series, key=lambda r: (r["nodes"], r["ranks"]))
    if not last["samples_per_s"] > 0:
        raise PlanError(
            f"{last['run']} trained no step (0 samples/s): a finished run resumed in its own folder trains "
            f"nothing. Train it again in a fresh folder (remove {last['path']}), then plan"
        )
    per_node = last["ranks"] // last["nodes"]
    weak = len({r["global_batch_size"] / r["ranks"] for r in series}) == 1
    nodes, ranks = 2 * last["nodes"], 2 * last["ranks"]
    batch = last["global_batch_size"] * (2 if weak else 1)
    noise_scale = noise_scale or last.get("noise_scale")
    if not (noise_scale and math.isfinite(noise_scale) and noise_scale > 0):
        noise_scale = None  # (an estimate from a short run can come out negative or infinite: unknown, then)
    step = last["global_batch_size"] / last["samples_per_s"]  # a rank's seconds per step
    if not weak:
        step /= 2  # (strong scaling: each rank's share of the batch halves, and its compute with it)
    layout, tp, pp, grow, exposed = _communication_growth(last, per_node, nodes, site, overlap, step)

    def time_to_target(step_growth: float, factor: float) -> float:
        samples = last["samples_to_target"] * factor
        return samples / (batch / (step + step_growth)) / 3600

    central = samples_factor(last["global_batch_size"], batch, noise_scale)
    low_factor = samples_factor(last["global_batch_size"], batch, noise_scale * 2 if noise_scale else None)
    high_factor = samples_factor(last["global_batch_size"], batch, noise_scale / 2 if noise_scale else None)
    hours = time_to_target(exposed, central)
    low, high = time_to_target(exposed / model_error, low_factor), time_to_target(exposed * model_error, high_factor)
    return {
        "nodes": nodes,
        "ranks": ranks,
        "global_batch_size": batch,
        "from_run": last["run"],
        "samples_per_s": batch / (step + exposed),
        "hours_to_target": hours,
        "node_hours": nodes * hours,
        "range_hours": (low, high),
        "range_node_hours": (nodes * low, nodes * high),
        "assumptions": [
            f"from {last['run']}: {last['nodes']} node(s), {last['ranks']} ranks, {step * 1e3:.3g} ms per step, "
            f"{last['samples_to_target']:,.0f} samples to the target; "
            f"{'weak scaling: each rank keeps its batch' if weak else 'strong scaling: the step halves'}",
            f"{layout.upper()}{f' with tensor parallelism over {tp}' if tp > 1 else ''}"
            f"{f' and a pipeline of {pp} stages' if pp > 1 else ''}: the communication of "
            f"{(last['gradient_bytes'] or 0) / 2**20:.3g} MiB of gradients grows by {grow * 1e3:.3g} ms per step "
            f"(between nodes {site.between.describe()}); {overlap:.0%} of it hidden, at most the backward pass "
            f"({BACKWARD_SHARE:.0%} of the step), each second hidden slowing it by {OVERLAP_SLOWDOWN:.3g} s",
            (
                f"B_noise {noise_scale:,.0f}: the samples to the target grow {central:.2f}× (range: B_noise "
                f"halved or doubled)"
                if noise_scale
                else "no gradient noise scale measured: the samples to the target are taken as unchanged (optimistic)"
            ),
            f"the link fit's worst miss, {model_error:.2f}×, widens the range",
        ],
    }


def _weak_group(rows: list[dict]) -> str:
    groups = sorted({r["group"] for r in rows})
    return next((g for g in groups if "weak" in g), groups[0])


def compare_with_measured(prediction: dict, measured: dict) -> str:
    """One sentence: the measured run of the predicted size against the prediction and its range."""
    hours = measured["hours_to_target"]
    if not measured.get("samples_per_s", 1) > 0:
        return (
            f"{measured['run']} trained no step (0 samples/s): it resumed a finished run of the same folder, so "
            f"there is nothing to compare. Run it in a fresh folder."
        )
    if hours is None:
        return f"{measured['run']} did not reach the target, which the prediction did not expect."
    low, high = prediction["range_hours"]
    where = "inside" if low <= hours <= high else "below" if hours < low else "above"
    why = {
        "inside": "",
        "above": " Something grew that the model has no term for: the breakdown's 'rest' (ranks "
        "sharing cores or memory bandwidth, stragglers) is the usual suspect, then a target "
        "reached an epoch later than the noise scale said.",
        "below": " The step hid more of the all-reduce than the overlap said, or the target came an epoch early.",
    }
    return (
        f"{measured['run']}: {hours * 3600:.3g} s to the target against {prediction['hours_to_target'] * 3600:.3g} s "
        f"predicted ({hours / prediction['hours_to_target']:.2f}×), {where} the predicted range "
        f"{low * 3600:.3g}-{high * 3600:.3g} s.{why[where]}"
    )


def format_plan(rows: list[dict], recommendation: dict | None = None, prediction: dict | None = None) -> str:
    """The cost table, the recommendation and the prediction, as Markdown."""

    def hours(value: float | None, scale: float = 1.0, unit: str = "") -> str:
        return "not reached" if value is None else f"{value * scale:.3g}{unit}"

    table = markdown_table(
        ["run", "nodes", "ranks", "global batch", "samples/s", "time to target", "node-hours", "GPU-hours"],
        [
            (
                r["run"],
                r["nodes"],
                r["ranks"],
                r["global_batch_size"],
                f"{r['samples_per_s']:,.0f}",
                hours(r["hours_to_target"], 3600, " s"),
                hours(r["node_hours"]),
                hours(r["gpu_hours"]),
            )
            for r in rows
        ],
    )
    parts = [table]
    if recommendation:
        parts.append(f"**Recommendation:** {recommendation['why']}.")
    if prediction:
        low, high = prediction["range_hours"]
        parts.append(
            f"**Next size up, predicted:** {prediction['nodes']} nodes ({prediction['ranks']} ranks, global "
            f"batch {prediction['global_batch_size']}): {prediction['hours_to_target'] * 3600:.3g} s to the "
            f"target (range {low * 3600:.3g}-{high * 3600:.3g} s), {prediction['node_hours']:.3g} node-hours. "
            f"Assumptions: " + "; ".join(prediction["assumptions"]) + "."
        )
    return "\n\n".join(parts)


def allocation_request(row: dict, config: dict, margin: float = 1.5) -> str:
    """The request a chosen run becomes: nodes, ranks per node, global batch, LR recipe, wall time and node-hours.

    ``config`` is the run's config (``config.yaml``); the wall time asked for is the time to the
    target times ``margin`` (for startup, validation, checkpoints and a slower day), in whole minutes.
    """
    minutes = max(1, round(row["hours_to_target"] * 60 * margin + 0.5))
    warmup = (
        f"{config.get('warmup_epochs')} epochs"
        if config.get("warmup_epochs")
        else f"{config.get('warmup_steps', 0)} steps"
    )
    return "\n".join(
        [
            f"- nodes: {row['nodes']} ({row['ranks'] // row['nodes']} rank(s) per node, {row['ranks']} in all)",
            f"- global batch: {row['global_batch_size']} ({row['global_batch_size'] // row['ranks']} per rank)",
            f"- LR recipe: {config.get('optimizer')} at lr {config.get('lr')} for batch {config.get('base_batch')}, "
            f"{config.get('lr_scaling')} scaling, warmup {warmup}, {config.get('decay')} decay",
            f"- wall time: {minutes // 60:02d}:{minutes % 60:02d}:00 (the {row['hours_to_target'] * 60:.3g} min to the "
            f"target × {margin:g})",
            f"- node-hours: {row['nodes'] * minutes / 60:.3g} asked for, {row['node_hours']:.3g} used to the target",
        ]
    )
