"""Figures shared by the notebooks and the reports, built with matplotlib's object API.

Functions return a :class:`matplotlib.figure.Figure` without touching pyplot's global
state, so they work the same in a notebook, in a batch job with no display, and inside
the training loop that saves ``loss_curve.png``. The figures render themselves as PNG
in Jupyter, so a notebook needs no ``%matplotlib`` magic to show them.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dlscale.metrics.tracking import TRAIN_FILE, VAL_FILE, read_rows


class NotebookFigure(Figure):
    """A Figure that Jupyter displays as a PNG when it is the value of a cell."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_curves(run_dir: str | Path, title: str | None = None) -> NotebookFigure:
    """Training loss per step (raw and smoothed) with validation MSE, and validation R² per epoch."""
    run_dir = Path(run_dir)
    train, val = read_rows(run_dir / TRAIN_FILE), read_rows(run_dir / VAL_FILE)
    fig = NotebookFigure(figsize=(10, 4), layout="constrained")
    loss_ax, r2_ax = fig.subplots(1, 2)
    if train:
        steps, losses = [r["step"] for r in train], [r["loss"] for r in train]
        loss_ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="train (per step)")
        loss_ax.plot(steps, _smooth(losses, max(1, len(losses) // 50)), color="tab:blue", label="train (smoothed)")
    if val:
        loss_ax.plot([r["step"] for r in val], [r["mse"] for r in val], "o-", color="tab:orange", label="validation")
        r2_ax.plot([r["epoch"] for r in val], [r["r2"] for r in val], "o-", color="tab:green", label="mean")
        for key in (k for k in val[0] if k.startswith("r2_")):
            r2_ax.plot([r["epoch"] for r in val], [r[key] for r in val], ".--", alpha=0.7, label=key[3:])
    loss_ax.set(xlabel="optimizer step", ylabel="MSE (normalised targets)", yscale="log", title="loss")
    r2_ax.set(
        xlabel="epoch", ylabel="R²", title="validation R²", ylim=(min(0.0, *(r["r2"] for r in val)) if val else 0, 1)
    )
    for ax in (loss_ax, r2_ax):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    fig.suptitle(title or run_dir.name)
    return fig


def predictions_vs_truth(pred, target, names: list[str] | None = None) -> NotebookFigure:
    """One scatter per target of predicted against true value, with the ideal diagonal."""
    pred, target = np.asarray(pred), np.asarray(target)
    count = target.shape[1]
    fig = NotebookFigure(figsize=(4.5 * count, 4), layout="constrained")
    for index, ax in enumerate(np.atleast_1d(fig.subplots(1, count))):
        ax.scatter(target[:, index], pred[:, index], s=4, alpha=0.4)
        low, high = target[:, index].min(), target[:, index].max()
        ax.plot([low, high], [low, high], color="black", linewidth=1, label="perfect")
        ax.set(xlabel="true (normalised)", ylabel="predicted", title=(names or [f"target {index}"] * count)[index])
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def _bars(labels: list, values: list[float], **bar_options) -> tuple[NotebookFigure, object, object]:
    """A figure sized for ``labels``, its axes, and blue bars with their values written on them."""
    fig = NotebookFigure(figsize=(1.2 * len(labels) + 3, 3.5), layout="constrained")
    ax = fig.subplots()
    bars = ax.bar([textwrap.fill(str(label), 16) for label in labels], values, color="tab:blue", **bar_options)
    ax.grid(axis="y", alpha=0.3)
    return fig, ax, bars


def _value_labels(values: list[float]) -> list[str]:
    return [f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values]


def bar_chart(labels: list, values: list[float], ylabel: str, title: str = "", xlabel: str = "") -> NotebookFigure:
    """Labelled bars with their values written on top (throughput comparisons and the like)."""
    fig, ax, bars = _bars(labels, values)
    ax.bar_label(bars, labels=_value_labels(values), padding=2)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.margins(y=0.15)
    return fig


def spread_chart(
    spreads: dict, ylabel: str, title: str = "", xlabel: str = "", log: bool | None = None
) -> NotebookFigure:
    """Bars at the median of each measurement with a line from its lowest to its highest round.

    ``log=None`` picks a log scale when the medians differ by more than 20×.
    """
    medians = [s.median for s in spreads.values()]
    errors = [
        [m - s.low for m, s in zip(medians, spreads.values())],
        [s.high - m for m, s in zip(medians, spreads.values())],
    ]
    fig, ax, bars = _bars(list(spreads), medians, yerr=errors, capsize=4, ecolor="black")
    ax.bar_label(bars, labels=_value_labels(medians), padding=2, label_type="center", color="white", fontsize=8)
    if log if log is not None else max(medians) > 20 * max(min(medians), 1e-12):
        ax.set_yscale("log")
    rounds = min(len(s.values) for s in spreads.values())
    ax.set(xlabel=xlabel, ylabel=f"{ylabel} (median of {rounds})", title=title)
    return fig


#: The phases the training loop marks in every step, and their colours on a timeline.
PHASE_COLOURS = {"data": "tab:orange", "forward": "tab:blue", "backward": "tab:green", "optimizer": "tab:red"}


def trace_events(trace_path: str | Path) -> list[dict]:
    """The complete events (a start and a duration) of a ``trace.json`` that torch.profiler wrote."""
    import json

    data = json.loads(Path(trace_path).read_text())
    return [e for e in (data["traceEvents"] if isinstance(data, dict) else data) if e.get("ph") == "X"]


def loop_ranges(events: list[dict]) -> list[dict]:
    """The loop's own named ranges among ``events``: the engine's phases, or those a stage marked; not torch's own
    (``Class.method#...``, ``ProfilerStep#N``)."""
    return [
        e
        for e in events
        if e.get("cat") == "user_annotation" and "#" not in e["name"] and not e["name"].startswith("ProfilerStep")
    ]


def trace_timeline(trace_path: str | Path, title: str = "timeline of the profiled steps") -> NotebookFigure:
    """The profiled steps as a timeline: the loop's phases on the CPU row and, on a GPU, its kernels.

    Rendered from the ``trace.json`` that ``profile_steps`` writes (the file Perfetto opens), so
    the notebook shows the same picture without leaving the page: gaps on the device row are
    time the device waited.
    """
    events = trace_events(trace_path)
    phases = loop_ranges(events)
    names = list(dict.fromkeys(e["name"] for e in phases))
    palette = {
        **{n: c for n, c in zip(names, ("tab:blue", "tab:green", "tab:red", "tab:orange", "tab:purple", "tab:brown"))},
        **{n: PHASE_COLOURS[n] for n in names if n in PHASE_COLOURS},
    }
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    start = min(e["ts"] for e in phases + kernels)
    rows = [("CPU: the loop's phases", phases)] + ([("GPU: kernels and copies", kernels)] if kernels else [])
    fig = NotebookFigure(figsize=(10, 1.2 + 0.8 * len(rows)), layout="constrained")
    ax = fig.subplots()
    for y, (_, items) in enumerate(rows):
        colours = [palette.get(e["name"], "tab:grey") for e in items]
        ax.broken_barh([((e["ts"] - start) / 1000, e["dur"] / 1000) for e in items], (y - 0.4, 0.8), facecolors=colours)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set(xlabel="ms since the first profiled step", title=title)
    handles = [Patch(color=c, label=n) for n, c in palette.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(handles), frameon=False)
    return fig


def map_gallery(maps, params, names: tuple[str, ...] = ("log A", "n", "blur")) -> NotebookFigure:
    """A row of maps, each titled with its parameters (lesson 00's look at the data)."""
    maps, params = np.asarray(maps), np.asarray(params)
    fig = NotebookFigure(figsize=(2.2 * len(maps), 2.9), layout="constrained")
    for ax, image, values in zip(np.atleast_1d(fig.subplots(1, len(maps))), maps, params):
        ax.imshow(image.squeeze(), cmap="magma")
        ax.set_title("\n".join(f"{name} {value:.2f}" for name, value in zip(names, values)), fontsize=9)
        ax.axis("off")
    return fig


def trust_ratios(run_dir: str | Path, min_ndim_names: tuple[str, ...] = ("weight",)) -> NotebookFigure:
    """Trust ratio of each weight tensor over training, from a run's ``trust_ratios.csv`` (log scale)."""
    from dlscale.metrics.tracking import TRUST_FILE

    rows = read_rows(Path(run_dir) / TRUST_FILE)
    fig = NotebookFigure(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    if rows:
        steps = [r["step"] for r in rows]
        layers = [k for k in rows[0] if k != "step" and k.endswith(min_ndim_names)]
        for name in layers:
            values = [r[name] for r in rows]
            if any(v != 1.0 for v in values):  # tensors that never adapt (biases, norms) stay at 1
                ax.plot(steps, values, label=name)
        ax.set_yscale("log")
    ax.set(xlabel="optimizer step", ylabel="trust ratio", title="per-layer trust ratio")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize=7, ncol=2)
    return fig


def noise_scale_curve(run_dir: str | Path) -> NotebookFigure:
    """The running estimate of B_simple over training, from a run's ``noise_scale.csv``."""
    from dlscale.metrics.tracking import NOISE_FILE

    rows = [r for r in read_rows(Path(run_dir) / NOISE_FILE) if np.isfinite(r["b_simple"]) and r["b_simple"] > 0]
    fig = NotebookFigure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    if rows:
        ax.plot([r["step"] for r in rows], [r["b_simple"] for r in rows], ".-")
        ax.set_yscale("log")
    ax.set(xlabel="optimizer step", ylabel="B_simple (running estimate)", title="gradient noise scale")
    ax.grid(alpha=0.3)
    return fig


def scaling_curves(rows: list[dict]) -> NotebookFigure:
    """Throughput and parallel efficiency against the number of processes (or GPUs), weak and strong."""
    fig = NotebookFigure(figsize=(10, 4), layout="constrained")
    rate_ax, eff_ax = fig.subplots(1, 2)
    # One line per mode, and per engine when the rows compare several (K-Means: torch and daal4py).
    for engine, mode in dict.fromkeys((r.get("engine", ""), r["mode"]) for r in rows):
        points = sorted(
            (r["processes"], r["samples_per_s"], r["efficiency"])
            for r in rows
            if r["mode"] == mode and r.get("engine", "") == engine
        )
        procs = [p[0] for p in points]
        label = f"{engine}, {mode} scaling" if engine else f"{mode} scaling"
        rate_ax.plot(procs, [p[1] for p in points], "o-", label=label)
        eff_ax.plot(procs, [100 * p[2] for p in points], "o-", label=label)
    counts = sorted({r["processes"] for r in rows})
    first = min(rows, key=lambda r: r["processes"])
    rate_ax.plot(counts, [first["samples_per_s"] * c / counts[0] for c in counts], "k--", linewidth=1, label="ideal")
    rate_ax.set(xlabel="processes", ylabel="samples / s", title="throughput", xticks=counts)
    eff_ax.axhline(100, color="black", linestyle="--", linewidth=1)
    eff_ax.set(xlabel="processes", ylabel="efficiency (%)", title="parallel efficiency", xticks=counts, ylim=(0, 110))
    for ax in (rate_ax, eff_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def allreduce_bandwidth(*row_sets: list[dict]) -> NotebookFigure:
    """Bus bandwidth of all-reduce against message size (log-log), one line per set of rows (backend)."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for rows in row_sets:
        ax.plot(
            [r["bytes"] for r in rows],
            [r["busbw_gbs"] for r in rows],
            "o-",
            label=f"{rows[0]['backend']}, {rows[0]['world_size']} ranks",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="message size (bytes)",
        ylabel="bus bandwidth (GB/s)",
        title="all-reduce bus bandwidth",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return fig


def quantized_images(original, quantized: dict) -> NotebookFigure:
    """The original picture beside each quantized version (titles are the dict's keys)."""
    fig = NotebookFigure(figsize=(4.2 * (1 + len(quantized)), 3.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, 1 + len(quantized)))
    for ax, (title, image) in zip(axes, {"original": original, **quantized}.items()):
        ax.imshow(np.asarray(image).clip(0, 1))
        ax.set_title(title)
        ax.axis("off")
    return fig


def kmeans_ratios(rows: list[dict]) -> NotebookFigure:
    """Each dlscale engine's whole-fit time over scikit-learn's on the same data, per data set and phase
    (``dlscale bench kmeans`` rows): below the line at 1 it is faster."""
    ours = [r for r in rows if r["engine"].startswith("dlscale") and r.get("time_ratio_to_sklearn")]
    data = list(dict.fromkeys(r["data"] for r in ours))
    series = list(dict.fromkeys((r["engine"], r["phase"]) for r in ours))
    fig = NotebookFigure(figsize=(8, 1.5 + 0.45 * len(data) * len(series) / 2), layout="constrained")
    ax = fig.subplots()
    height = 0.8 / max(1, len(series))
    for index, (engine, phase) in enumerate(series):
        values = [
            next(
                (
                    r["time_ratio_to_sklearn"]
                    for r in ours
                    if (r["data"], r["engine"], r["phase"]) == (label, engine, phase)
                ),
                0.0,
            )
            for label in data
        ]
        bars = ax.barh(np.arange(len(data)) + index * height, values, height, label=f"{engine}, {phase}")
        ax.bar_label(bars, labels=[f"{v:.2f}×" for v in values], padding=2, fontsize="small")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set(
        yticks=np.arange(len(data)) + height * (len(series) - 1) / 2,
        yticklabels=data,
        xlabel="whole fit, time over scikit-learn's (the same data, the same initial centres)",
        title="K-Means: dlscale against scikit-learn",
    )
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="lower right")
    return fig


def memory_chart(rows: list[dict], title: str = "what each rank holds") -> NotebookFigure:
    """Stacked bars per layout: parameter, gradient and optimizer-state MiB of the largest rank (``bench memory``)."""
    labels = [r["layout"] for r in rows]
    fig, ax, _ = _bars(labels, [0.0] * len(rows))
    bottom = [0.0] * len(rows)
    for key, colour in (("parameters", "tab:blue"), ("gradients", "tab:orange"), ("optimizer_state", "tab:green")):
        values = [r[key] / 2**20 for r in rows]
        ax.bar(
            [textwrap.fill(str(label), 16) for label in labels],
            values,
            bottom=bottom,
            color=colour,
            label=key.replace("_", " "),
        )
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar_label(ax.containers[-1], labels=[f"{b:.2f}" for b in bottom], padding=2)
    ax.set(ylabel="MiB per rank", title=title)
    ax.margins(y=0.15)
    ax.legend()
    return fig


_PART_COLOURS = {"io": "tab:orange", "communication": "tab:red", "rest": "tab:gray"}
_PART_LABELS = {"io": "exposed I/O", "communication": "exposed communication", "rest": "the rest"}


def breakdown_bars(result: dict) -> NotebookFigure:
    """Stacked bars: each size's efficiency and the lost efficiency split into its parts (``bench breakdown``).

    A part below zero (a cost that shrank, or noise) is drawn below the axis, so each bar still
    reaches 100% minus the other parts: efficiency plus the parts is 100% at every size."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    rows = result["rows"]
    labels = [
        f"{r['size']} node{'s' if r['size'] > 1 else ''}\n({r['ranks']} ranks)"
        if result["unit"] == "nodes"
        else f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"
        for r in rows
    ]
    x = np.arange(len(rows))
    ax.bar(x, [100 * r["efficiency"] for r in rows], color="tab:green", label="efficiency")
    up = np.array([100 * r["efficiency"] for r in rows])
    down = np.zeros(len(rows))
    for part in ("io", "communication", "rest"):
        values = np.array([100 * r[part] for r in rows])
        ax.bar(x, values, bottom=np.where(values >= 0, up, down), color=_PART_COLOURS[part], label=_PART_LABELS[part])
        up = up + np.clip(values, 0, None)
        down = down + np.clip(values, None, 0)
    ax.axhline(100, color="black", linestyle="--", linewidth=1)
    ax.set(
        xticks=x,
        xticklabels=labels,
        ylabel="% of the step time",
        title=f"where the efficiency goes ({result['layout']}, per-rank batch {result['per_rank_batch']})",
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="lower left", fontsize="small")
    return fig


def efficiency_projection(curves: dict[str, list[dict]], assumptions: str = "") -> NotebookFigure:
    """Predicted efficiency against nodes (log scale), one line per model or layout, the assumptions beside it."""
    fig = NotebookFigure(figsize=(10, 4), layout="constrained")
    ax, text_ax = fig.subplots(1, 2, width_ratios=(3, 2))
    for label, points in curves.items():
        ax.plot([p["nodes"] for p in points], [100 * p["efficiency"] for p in points], "o-", markersize=3, label=label)
    ax.set(
        xscale="log",
        xlabel="nodes",
        ylabel="predicted efficiency (%)",
        ylim=(0, 105),
        title="predicted weak-scaling efficiency",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    text_ax.axis("off")
    text_ax.text(
        0,
        1,
        "\n".join(textwrap.fill(line, 48) for line in assumptions.splitlines()),
        va="top",
        fontsize="small",
        family="monospace",
    )
    return fig


def cost_to_solution(rows: list[dict], chosen: str | None = None) -> NotebookFigure:
    """Wall time to the target against node-hours, one point per run: the fastest and the cheapest are corners."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    reached = [r for r in rows if r.get("hours_to_target") is not None]
    # (minutes for a real sweep; seconds for the few-second runs of a laptop)
    scale, unit = (
        (60, "minutes") if max((r["hours_to_target"] for r in reached), default=1) > 1 / 30 else (3600, "seconds")
    )
    for row in reached:
        marker = "*" if row["run"] == chosen else "o"
        ax.plot(
            row["hours_to_target"] * scale,
            row["node_hours"],
            marker,
            markersize=14 if marker == "*" else 7,
            color="tab:red" if marker == "*" else "tab:blue",
        )
        ax.annotate(
            f"{row['run']} ({row['nodes']} node{'s' if row['nodes'] > 1 else ''})",
            (row["hours_to_target"] * scale, row["node_hours"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize="small",
        )
    ax.set(
        xlabel=f"wall time to the target ({unit})",
        ylabel="node-hours to the target",
        title="fastest against cheapest" + (f" (★ {chosen})" if chosen else ""),
    )
    ax.grid(alpha=0.3)
    return fig


def allreduce_fit(measured: list[dict], predicted: list[dict], fitted_sizes: set[int]) -> NotebookFigure:
    """All-reduce time against message size (log-log): measured points (filled: fitted on; open: held out) and
    the α–β model's prediction, one colour per rank count."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for index, ranks in enumerate(sorted({r["world_size"] for r in measured})):
        colour = f"C{index}"
        rows = [r for r in measured if r["world_size"] == ranks]
        model = sorted((p["bytes"], p["predicted_ms"]) for p in predicted if p["ranks"] == ranks)
        ax.plot([b for b, _ in model], [ms for _, ms in model], "-", color=colour, label=f"model, {ranks} ranks")
        for row in rows:
            fitted = (row["bytes"], ranks) in fitted_sizes
            ax.plot(row["bytes"], row["ms"], "o", color=colour, markerfacecolor=colour if fitted else "white")
    ax.plot([], [], "ko", label="measured, fitted on")
    ax.plot([], [], "o", color="black", markerfacecolor="white", label="measured, held out")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="message size (bytes)",
        ylabel="all-reduce time (ms)",
        title="the α–β model against the measurement",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def search_progress(ways: dict[str, list], baseline: float | None = None, metric: str = "R²") -> NotebookFigure:
    """Best value so far against node-hours spent, one colour per way of searching (a grid, random, TPE...) and, where
    a way was repeated over seeds (a list of studies' points), one line per seed."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for colour, (name, points) in enumerate(ways.items()):
        studies = points if points and isinstance(points[0], list) else [points]
        for seed, study in enumerate(studies):
            shown = [(x * 3600, y) for x, y in study if math.isfinite(y)]  # (node-seconds: the trials are short)
            ax.step(
                [x for x, _ in shown],
                [y for _, y in shown],
                where="post",
                marker="o",
                markersize=3,
                color=f"C{colour}",
                alpha=0.8 if len(studies) == 1 else 0.55,
                label=name if seed == 0 else None,
            )
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", label="the config's defaults")
    ax.set(
        xlabel="node-seconds spent", ylabel=f"best validation {metric} so far", title="what each search found per cost"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def trial_curves(curves: dict[int, tuple[list[int], list[float], str]], metric: str = "R²") -> NotebookFigure:
    """Every trial's validation metric by epoch; pruned trials end in a cross where the pruner stopped them."""
    fig = NotebookFigure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for number, (epochs, values, state) in sorted(curves.items()):
        pruned = state == "pruned"
        ax.plot(epochs, values, "-", color="tab:red" if pruned else "tab:blue", alpha=0.45 if pruned else 0.8)
        if pruned:
            ax.plot(epochs[-1], values[-1], "x", color="tab:red")
    ax.plot([], [], "-", color="tab:blue", label="ran to the end")
    ax.plot([], [], "-x", color="tab:red", label="pruned")
    ax.set(xlabel="epoch", ylabel=f"validation {metric}", title="each trial's curve, and where pruning cut it")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig
