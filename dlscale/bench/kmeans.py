"""``dlscale bench kmeans``: the K-Means engines side by side on several kinds of data, and their scaling.

Every engine fits the same data from the same initial centres, in one run, so the ratios to
scikit-learn are measured under the same conditions. Each kind of data people cluster is
measured, because what pays differs between them (:data:`KINDS`):

- **blobs**: well-separated clusters, where after a few iterations most rows keep their cluster
  (and the torch engine's bounds skip them);
- **noise**: isotropic Gaussian noise, no cluster structure: rows keep changing cluster;
- **a photo's colours** (scikit-learn's ``china.jpg`` and ``flower.jpg``, each twice, as lesson
  08 quantizes them): 3 features, many repeated values;
- **mixture**: 128 features, 40 overlapping Gaussian clusters, 0.12 ``n`` rows: where BLAS's blocked GEMM
  is at its best and a loop over features at its worst.

and in two phases:

- **the first iterations**: a fixed number of Lloyd iterations (``tol=0``) from the start, where
  the centres still move far and most rows change cluster;
- **to convergence**: ``tol=1e-4`` (scikit-learn's default).

Each row gives the fit's seconds, its iterations and inertia, the time per iteration, and both
ratios to scikit-learn on the same data: per iteration, and for the whole fit (what a user waits
for; iterations can differ). Then the distributed backends run the fixed iterations at each
process count under ``torchrun`` (torch) and ``mpirun`` (daal4py), on the first kind of data.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from dlscale.errors import importable
from dlscale.reporting.tables import markdown_table

#: The kinds of data the benchmark can fit, in the order it fits them.
KINDS = ("blobs", "noise", "china", "flower", "mixture")


#: The scaling runs' launchers: torchrun runs the torch backend, mpirun daal4py's
LAUNCHERS = ("torchrun", "mpirun")


def make_blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """``n`` float32 samples around ``k`` random centres (unit noise, centres spread over ±5)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-5, 5, size=(k, d)).astype(np.float32)
    data = centres[rng.integers(0, k, size=n)]
    data += rng.standard_normal((n, d), dtype=np.float32)
    return data


def make_noise(n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` float32 samples of isotropic Gaussian noise: no cluster structure at all."""
    return np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)


def make_mixture(n: int, d: int = 128, k: int = 40, seed: int = 0) -> np.ndarray:
    """``n`` float32 samples of ``k`` Gaussian clusters in ``d`` dimensions that overlap (centres drawn from N(0, 1),
    unit noise): a high-dimensional case."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d), dtype=np.float32)
    return centres[rng.integers(0, k, size=n)] + rng.standard_normal((n, d), dtype=np.float32)


def photo_colours(name: str, copies: int = 2) -> np.ndarray:
    """The pixels of one of scikit-learn's photos as float32 RGB rows in [0, 1], the image ``copies`` times."""
    from dlscale.kmeans.command import load_sample_image

    return np.tile(load_sample_image(f"{name}.jpg").reshape(-1, 3), (copies, 1))


def benchmark_data(
    kinds: tuple[str, ...] = KINDS,
    n: int = 1_000_000,
    d: int = 32,
    k: int = 64,
    photo_k: tuple[int, ...] = (16, 64),
    seed: int = 0,
    photo_copies: int = 2,
) -> list[tuple[str, np.ndarray, int]]:
    """(label, data, k) for each kind: blobs of ``n`` × ``d``, noise of 0.4 ``n`` × ``d`` (both with ``k``), and each
    photo's colours (``photo_copies`` times) with each of ``photo_k``."""
    out = []
    for kind in kinds:
        if kind == "blobs":
            out.append((f"blobs {n:,} × {d}, k={k}", make_blobs(n, d, k, seed), k))
        elif kind == "noise":
            out.append((f"noise {2 * n // 5:,} × {d}, k={k}", make_noise(2 * n // 5, d, seed), k))
        elif kind == "mixture":
            rows = 12 * n // 100
            out.append((f"mixture {rows:,} × 128, k=40", make_mixture(rows, seed=seed), 40))
        elif kind in ("china", "flower"):
            x = photo_colours(kind, photo_copies)
            out += [(f"{kind}.jpg colours {len(x):,} × 3, k={kk}", x, kk) for kk in photo_k]
        else:
            raise ValueError(f"unknown kind of data {kind!r}: choose from {', '.join(KINDS)}")
    return out


def _time_fit(fit) -> tuple[float, int, float, str, int]:
    """Seconds, iterations, inertia, pass and threads of one fit. Timed by hand, once per round (round-robin over the
    engines): a fit lasts seconds, and torch.utils.benchmark.Timer's warm-up runs would triple the benchmark."""
    started = time.perf_counter()
    iterations, inertia, pass_name, threads = fit()
    return time.perf_counter() - started, iterations, inertia, pass_name, threads


def openmp_threads() -> int:
    """The threads scikit-learn's OpenMP loops run on (threadpoolctl's count; scikit-learn imported first)."""
    from threadpoolctl import threadpool_info

    return max((info["num_threads"] for info in threadpool_info() if info["user_api"] == "openmp"), default=1)


def cpu_description() -> str:
    """The CPU's model, the CPUs this process may use (each fit's threads are in the table) and the widest SIMD
    torch's kernels use on it (AVX2, AVX512, SVE256...; DEFAULT is none of them, as on most Arm CPUs without SVE,
    where NEON is the baseline)."""
    from dlscale.runtime.devices import cpu_name
    from dlscale.runtime.threads import affinity_cpus

    return f"{cpu_name()}, {affinity_cpus()} CPUs, SIMD {torch.backends.cpu.get_cpu_capability()}"


#: The two phases: (name, max_iter or None for the fixed iterations, tol).
PHASES = (("first iterations", None, 0.0), ("to convergence", 300, 1e-4))


def _engines(
    x: np.ndarray, init: np.ndarray, iterations: int, tol: float = 0.0, float64_reference: bool = False
) -> dict:
    """The fits to compare, each returning (iterations, inertia). With ``float64_reference`` also scikit-learn on the
    same data in float64: how much its own iteration count moves with the rounding (many repeated values tie)."""
    from dlscale.kmeans.daal import available as daal_available
    from dlscale.kmeans.estimator import KMeans

    k = len(init)

    def ours(backend: str, device: str = "cpu"):
        def fit() -> tuple[int, float, str, int]:
            model = KMeans(k, init=init, max_iter=iterations, tol=tol, backend=backend, device=device).fit(x)
            return model.n_iter_, model.inertia_, model.pass_, model.threads_

        return fit

    engines = {}
    if importable("sklearn.cluster"):  # the kmeans extra; the comparison is left out without it
        from sklearn.cluster import KMeans as SklearnKMeans

        their_threads = openmp_threads()  # (asked once, outside the timed fits)

        def theirs(data: np.ndarray):
            def fit() -> tuple[int, float, str, int]:
                model = SklearnKMeans(
                    k, init=init.astype(data.dtype), n_init=1, max_iter=iterations, tol=tol, algorithm="lloyd"
                ).fit(data)
                return model.n_iter_, model.inertia_, "lloyd", their_threads

            return fit

        engines["scikit-learn"] = theirs(x)
        if float64_reference:
            engines[FLOAT64_REFERENCE] = theirs(x.astype(np.float64))
    # (No row for backend="auto": in one process on a CPU it is the torch engine, and a second fit of it
    # would only lengthen the benchmark.)
    engines["dlscale torch (cpu)"] = ours("torch")
    if daal_available():
        engines["daal4py"] = ours("daal4py")
    if torch.cuda.is_available():
        engines["dlscale torch (cuda)"] = ours("torch", "cuda")
    return engines


#: scikit-learn on the float64 copy of the data: not an engine to beat, the spread of iteration counts rounding makes.
FLOAT64_REFERENCE = "scikit-learn, the data in float64"


def _scaling_run(
    launcher: str, procs: int, data: list[Path], init: Path, k: int, iterations: int, out: Path, threads: int
) -> list[dict]:
    """One launch of ``procs`` ranks that fits each of ``data`` in turn, after a warm-up fit: one summary each."""
    from dlscale.kmeans.on_ranks import launch_kmeans

    backend = "torch" if launcher == "torchrun" else "daal4py"
    return launch_kmeans(data, k, out, procs, launcher, backend, init, iterations, 0.0, threads, warm_up=True)


def _scaling(
    x: np.ndarray,
    init: np.ndarray,
    procs: list[int],
    iterations: int,
    out_dir: Path,
    seed: int,
    launchers: tuple[str, ...] = LAUNCHERS,
) -> list[dict]:
    """Strong scaling (the same data over more ranks) and weak scaling (each rank keeps its share's size). One launch
    per process count and launcher fits both, strong then weak, each rank warmed up first (no timing holds a
    first-call cost, whichever fit comes first); on one process the two are the same fit."""
    from dlscale.kmeans.daal import available as daal_available
    from dlscale.runtime.threads import fair_threads

    rows = []
    threads = fair_threads(max(procs))  # every run, the single process included, gets the same threads per rank
    np.save(out_dir / "init.npy", init)
    np.save(out_dir / "data-strong.npy", x)
    for count in procs:
        modes = {"strong": out_dir / "data-strong.npy"}
        if count > 1:  # (one process holds all the data either way: strong scaling's fit is weak scaling's too)
            modes["weak"] = out_dir / f"data-weak-{count}.npy"
            np.save(modes["weak"], np.tile(x, (count, 1)))  # (weak: each rank as much as one had)
        for launcher in [name for name in launchers if name != "mpirun" or daal_available()]:
            summaries = _scaling_run(
                launcher,
                count,
                list(modes.values()),
                out_dir / "init.npy",
                len(init),
                iterations,
                out_dir / f"{launcher}-{count}",
                threads,
            )
            for mode, summary in zip(modes, summaries):
                size = len(x) * (count if mode == "weak" else 1)
                rows.append(
                    {
                        "engine": f"{summary['backend']} via {launcher}",
                        "kind": "scaling",
                        "mode": mode,
                        "processes": count,
                        "threads_per_process": summary["threads"]["count"],
                        "samples": size,
                        "seconds": summary["seconds"],
                        "iterations": summary["n_iter"],
                        "seconds_per_iteration": summary["seconds_per_iteration"],
                        "samples_per_s": size / summary["seconds_per_iteration"],
                    }
                )
                if count == 1:
                    rows.append({**rows[-1], "mode": "weak"})
        if count > 1:
            modes["weak"].unlink()
    (out_dir / "data-strong.npy").unlink()
    rows.sort(key=lambda row: row["mode"] == "weak")  # strong first, as the table reads
    for row in rows:  # efficiency against the same engine and mode at the smallest count
        first = min(
            (r for r in rows if r["engine"] == row["engine"] and r["mode"] == row["mode"]), key=lambda r: r["processes"]
        )
        work = row["processes"] / first["processes"] if row["mode"] == "strong" else 1.0
        row["efficiency"] = first["seconds_per_iteration"] / (work * row["seconds_per_iteration"])
    return rows


def _phase_rows(data: str, phase: str, engines: dict, rounds: int) -> list[dict]:
    """Each engine's median round of one phase on one data set, and its times against scikit-learn's."""
    # Rounds go round-robin over the engines, so a slow spell of this shared machine hits all of them.
    timings: dict[str, list[tuple[float, int, float, str, int]]] = {engine: [] for engine in engines}
    for _ in range(rounds):
        for engine, fit in engines.items():
            timings[engine].append(_time_fit(fit))
    rows = []
    for engine, runs in timings.items():
        seconds, done, inertia, pass_name, threads = sorted(runs)[len(runs) // 2]  # the median round
        rows.append(
            {
                "data": data,
                "engine": engine,
                "pass": pass_name,
                "kind": "engine",
                "phase": phase,
                "processes": 1,
                "threads_per_process": threads,
                "seconds": seconds,
                "iterations": done,
                "inertia": float(inertia),
                "seconds_per_iteration": seconds / max(done, 1),
                "rounds": rounds,
            }
        )
    reference = next((r for r in rows if r["engine"] == "scikit-learn"), None)
    for row in rows:
        row["ratio_to_sklearn"] = (
            row["seconds_per_iteration"] / reference["seconds_per_iteration"] if reference else None
        )
        row["time_ratio_to_sklearn"] = row["seconds"] / reference["seconds"] if reference else None
        row["iterations_vs_sklearn"] = row["iterations"] / reference["iterations"] if reference else None
    return rows


def bench_kmeans(
    n: int = 1_000_000,
    d: int = 32,
    k: int = 64,
    iterations: int = 8,
    procs: list[int] | None = None,
    out_dir: str | Path = "runs/bench_kmeans",
    seed: int = 0,
    rounds: int = 3,
    kinds: tuple[str, ...] = KINDS,
    photo_k: tuple[int, ...] = (16, 64),
    photo_copies: int = 2,
    launchers: tuple[str, ...] = LAUNCHERS,
) -> list[dict]:
    """Rows ``{data, engine, phase, seconds, iterations, inertia, ratio_to_sklearn, ...}``; also writes JSON and a plot.

    Each engine's figure is the median of ``rounds`` fits; the data sets are :func:`benchmark_data`'s. The scaling
    runs (``procs``) go through each of ``launchers``: torchrun (the torch backend) and mpirun (daal4py, where it is
    installed).
    """
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown:
        raise ValueError(f"unknown launcher(s) {unknown}: choose from {list(LAUNCHERS)}")
    from dlscale.reporting.plots import kmeans_ratios

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    warnings.filterwarnings("ignore", message="Number of distinct clusters")  # an empty cluster, re-seeded
    sets = benchmark_data(tuple(kinds), n, d, k, tuple(photo_k), seed, photo_copies)
    for label, x, kk in sets:
        init = x[np.random.default_rng(seed + 1).choice(len(x), kk, replace=False)].copy()
        photo = x.shape[1] == 3
        for fit_small in _engines(x[: 10 * kk], init, 1).values():  # first-call costs (loading) out of the timing
            fit_small()
        for phase, max_iter, tol in PHASES:
            rows += _phase_rows(label, phase, _engines(x, init, max_iter or iterations, tol, photo), rounds)
    if procs:
        label, x, kk = sets[0]
        init = x[np.random.default_rng(seed + 1).choice(len(x), kk, replace=False)].copy()
        scaling = _scaling(x, init, procs, iterations, out_dir, seed, tuple(launchers))
        rows += [{"data": label, **row} for row in scaling]
    (out_dir / "kmeans.json").write_text(
        json.dumps({"n": n, "d": d, "k": k, "cpu": cpu_description(), "rows": rows}, indent=1) + "\n"
    )
    kmeans_ratios([r for r in rows if r["kind"] == "engine"]).savefig(out_dir / "kmeans.png", dpi=120)
    return rows


def format_kmeans(rows: list[dict]) -> str:
    """The comparison (per data set and phase: iterations, inertia, seconds, both ratios) and the scaling runs."""

    def ratio(value: float | None) -> str:
        return f"{value:.2f}×" if value else ""

    engines = [r for r in rows if r["kind"] == "engine"]
    table = f"CPU: {cpu_description()}\n\n" + markdown_table(
        [
            "data",
            "phase",
            "engine",
            "pass",
            "threads",
            "iterations",
            "inertia",
            "seconds",
            "s per iteration",
            "per iteration vs sklearn",
            "whole fit vs sklearn",
        ],
        [
            (
                r["data"],
                r["phase"],
                r["engine"],
                r.get("pass", ""),
                r["threads_per_process"],
                r["iterations"],
                f"{r['inertia']:.6g}",
                f"{r['seconds']:.3f}",
                f"{r['seconds_per_iteration']:.4f}",
                ratio(r["ratio_to_sklearn"]),
                ratio(r["time_ratio_to_sklearn"]),
            )
            for r in engines
        ],
    )
    scaling = [r for r in rows if r["kind"] == "scaling"]
    if not scaling:
        return table
    return (
        table
        + "\n\n"
        + markdown_table(
            [
                "engine",
                "scaling",
                "processes",
                "threads each",
                "samples",
                "iterations",
                "s per iteration",
                "efficiency",
            ],
            [
                (
                    r["engine"],
                    r["mode"],
                    r["processes"],
                    r["threads_per_process"],
                    f"{r['samples']:,}",
                    r["iterations"],
                    f"{r['seconds_per_iteration']:.4f}",
                    f"{r['efficiency']:.0%}",
                )
                for r in scaling
            ],
        )
    )
