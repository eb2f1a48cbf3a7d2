"""``dlscale bench kmeans``: the K-Means engines side by side, and their scaling over processes.

Every engine fits the same data from the same initial centres, in one run, so the ratios to
scikit-learn are measured under the same conditions, in two phases:

- **the first iterations**: a fixed number of Lloyd iterations (``tol=0``) from the start, where
  the centres still move far and most rows change cluster;
- **to convergence**: ``tol=1e-4`` (scikit-learn's default), where most rows keep their
  cluster, which the torch engine's bounds skip.

The time per iteration is the whole fit divided by its iterations (each engine's set-up,
validation and final assignment included). Then the distributed backends run the fixed
iterations at each process count under ``torchrun`` (torch) and ``mpirun`` (daal4py).
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


def make_blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """``n`` float32 samples around ``k`` random centres (unit noise, centres spread over ±5)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-5, 5, size=(k, d)).astype(np.float32)
    data = centres[rng.integers(0, k, size=n)]
    data += rng.standard_normal((n, d), dtype=np.float32)
    return data


def _time_fit(fit) -> tuple[float, int]:
    """Seconds and iterations of one fit. Timed by hand, once per round (round-robin over the engines):
    a fit lasts seconds, and torch.utils.benchmark.Timer's warm-up runs would triple the benchmark."""
    started = time.perf_counter()
    iterations = fit()
    return time.perf_counter() - started, iterations


#: The two phases: (name, max_iter or None for the fixed iterations, tol).
PHASES = (("first iterations", None, 0.0), ("to convergence", 300, 1e-4))


def _engines(x: np.ndarray, init: np.ndarray, iterations: int, tol: float = 0.0) -> dict:
    from dlscale.kmeans.backend import resolve_backend
    from dlscale.kmeans.estimator import KMeans
    from dlscale.kmeans.daal import available as daal_available

    k = len(init)

    def ours(backend: str, device: str = "cpu"):
        def fit() -> int:
            return KMeans(k, init=init, max_iter=iterations, tol=tol, backend=backend, device=device).fit(x).n_iter_
        return fit

    engines = {}
    if importable("sklearn.cluster"):  # the kmeans extra; the comparison is left out without it
        from sklearn.cluster import KMeans as SklearnKMeans

        engines["scikit-learn"] = lambda: SklearnKMeans(k, init=init, n_init=1, max_iter=iterations, tol=tol,
                                                        algorithm="lloyd").fit(x).n_iter_
    engines["dlscale torch (cpu)"] = ours("torch")
    if daal_available():
        engines["daal4py"] = ours("daal4py")
    engines[f"dlscale auto (= {resolve_backend('auto', torch.device('cpu'))})"] = ours("auto")
    if torch.cuda.is_available():
        engines["dlscale torch (cuda)"] = ours("torch", "cuda")
    return engines


def _scaling_run(launcher: str, procs: int, data: Path, init: Path, k: int, iterations: int, out: Path,
                 threads: int) -> dict:
    from dlscale.kmeans.launch import launch_kmeans

    return launch_kmeans(data, k, out, procs, launcher, "torch" if launcher == "torchrun" else "daal4py", init,
                         iterations, 0.0, threads)


def _scaling(x: np.ndarray, init: np.ndarray, procs: list[int], iterations: int, out_dir: Path,
             seed: int) -> list[dict]:
    """Strong scaling (the same data over more ranks) and weak scaling (each rank keeps its share's size)."""
    from dlscale.kmeans.daal import available as daal_available

    from dlscale.runtime.threads import fair_threads

    rows = []
    threads = fair_threads(max(procs))  # every run, the single process included, gets the same threads per rank
    np.save(out_dir / "init.npy", init)
    for mode in ("strong", "weak"):
        for count in procs:
            data = out_dir / f"data-{mode}-{count}.npy"
            size = len(x) * (count if mode == "weak" else 1)
            np.save(data, x if size == len(x) else make_blobs(size, x.shape[1], len(init), seed))
            for launcher in ["torchrun"] + (["mpirun"] if daal_available() else []):
                summary = _scaling_run(launcher, count, data, out_dir / "init.npy", len(init), iterations,
                                       out_dir / f"{launcher}-{mode}-{count}", threads)
                rows.append({"engine": f"{summary['backend']} via {launcher}", "kind": "scaling", "mode": mode,
                             "processes": count, "threads_per_process": summary["threads"]["count"],
                             "samples": size, "seconds": summary["seconds"],
                             "iterations": summary["n_iter"],
                             "seconds_per_iteration": summary["seconds_per_iteration"],
                             "samples_per_s": size / summary["seconds_per_iteration"]})
            data.unlink()
    for row in rows:  # efficiency against the same engine and mode at the smallest count
        first = min((r for r in rows if r["engine"] == row["engine"] and r["mode"] == row["mode"]),
                    key=lambda r: r["processes"])
        work = row["processes"] / first["processes"] if row["mode"] == "strong" else 1.0
        row["efficiency"] = first["seconds_per_iteration"] / (work * row["seconds_per_iteration"])
    return rows


def _phase_rows(phase: str, engines: dict, rounds: int) -> list[dict]:
    """Each engine's median round of one phase, and its time per iteration against scikit-learn's."""
    # Rounds go round-robin over the engines, so a slow spell of this shared machine hits all of them.
    timings: dict[str, list[tuple[float, int]]] = {engine: [] for engine in engines}
    for _ in range(rounds):
        for engine, fit in engines.items():
            timings[engine].append(_time_fit(fit))
    rows = []
    for engine, runs in timings.items():
        seconds, done = sorted(runs)[len(runs) // 2]  # the median round
        rows.append({"engine": engine, "kind": "engine", "phase": phase, "processes": 1,
                     "threads_per_process": torch.get_num_threads(), "seconds": seconds, "iterations": done,
                     "seconds_per_iteration": seconds / max(done, 1), "rounds": rounds})
    reference = next((r["seconds_per_iteration"] for r in rows if r["engine"] == "scikit-learn"), None)
    for row in rows:
        row["ratio_to_sklearn"] = row["seconds_per_iteration"] / reference if reference else None
    return rows


def bench_kmeans(n: int = 1_000_000, d: int = 32, k: int = 64, iterations: int = 10, procs: list[int] | None = None,
                 out_dir: str | Path = "runs/bench_kmeans", seed: int = 0, rounds: int = 3) -> list[dict]:
    """Rows ``{engine, seconds_per_iteration, iterations, ratio_to_sklearn, ...}``; also writes JSON and a plot.

    Each engine's figure is the median of ``rounds`` fits.
    """
    from dlscale.reporting.plots import kmeans_timings

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    x = make_blobs(n, d, k, seed)
    init = x[np.random.default_rng(seed + 1).choice(n, k, replace=False)].copy()
    rows = []
    warnings.filterwarnings("ignore", message="Number of distinct clusters")  # an empty cluster, re-seeded
    for fit_small in _engines(x[:10 * k], init, 1).values():  # first-call costs (library loading) out of the timing
        fit_small()
    for phase, max_iter, tol in PHASES:
        rows += _phase_rows(phase, _engines(x, init, max_iter or iterations, tol), rounds)
    if procs:
        rows += _scaling(x, init, procs, iterations, out_dir, seed)
    (out_dir / "kmeans.json").write_text(json.dumps({"n": n, "d": d, "k": k, "rows": rows}, indent=1) + "\n")
    kmeans_timings([r for r in rows if r["kind"] == "engine"]).savefig(out_dir / "kmeans.png", dpi=120)
    return rows


def format_kmeans(rows: list[dict]) -> str:
    return markdown_table(
        ["engine", "phase or scaling", "processes", "threads each", "iterations", "s per iteration",
         "vs scikit-learn", "efficiency"],
        [(row["engine"], row.get("phase") or row.get("mode", ""), row["processes"], row["threads_per_process"],
          row["iterations"],
          f"{row['seconds_per_iteration']:.3f}",
          f"{row['ratio_to_sklearn']:.2f}×" if row.get("ratio_to_sklearn") else "",
          f"{row['efficiency']:.0%}" if row.get("efficiency") else "") for row in rows])
