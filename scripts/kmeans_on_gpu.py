"""K-Means on the GPU at the sizes people fit, against the CPU engine and scikit-learn (scripts/gpu_checks.sh).

    python3 scripts/kmeans_on_gpu.py            (from the repository root, on a machine with CUDA)

For each size: the seconds of a fixed number of Lloyd iterations from the same centres on the GPU, on the
CPU engine and with scikit-learn (every thread of the machine), the largest difference between the GPU's
centres and the CPU engine's, and the GPU memory the fit took beyond its data, against the chunk's budget
(``lloyd.GPU_CHUNK_BUDGET``: the blocks of one chunk; the fit also holds the data's centred copy).
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dlscale.bench.kmeans import make_blobs  # noqa: E402
from dlscale.kmeans.estimator import KMeans  # noqa: E402
from dlscale.kmeans.lloyd import GPU_CHUNK_BUDGET  # noqa: E402

SIZES = ((1_000_000, 3, 16), (1_000_000, 32, 64), (200_000, 784, 64))
ITERATIONS = 20


def timed(fit) -> tuple[float, object]:
    started = time.perf_counter()
    model = fit()
    return time.perf_counter() - started, model


def main() -> None:
    from sklearn.cluster import KMeans as SklearnKMeans

    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads; "
        f"{ITERATIONS} iterations from the same centres; chunk budget {GPU_CHUNK_BUDGET / 2**20:.0f} MiB"
    )
    print("| n × d, k | GPU s | CPU engine s | scikit-learn s | max |centre GPU − CPU| | GPU memory beyond the data |")
    print("|---|---|---|---|---|---|")
    for n, d, k in SIZES:
        x = make_blobs(n, d, k, seed=0)
        init = x[np.random.default_rng(1).choice(n, k, replace=False)].copy()
        on_gpu = torch.from_numpy(x).cuda()

        def ours(data, device):
            return lambda: KMeans(k, init=init, max_iter=ITERATIONS, tol=0.0, backend="torch", device=device).fit(data)

        ours(on_gpu[: 10 * k], "cuda")()  # first-call costs (CUDA's and cuBLAS's, numba's cache) out of the timing
        ours(x[: 10 * k], "cpu")()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        gpu_s, gpu = timed(ours(on_gpu, "cuda"))
        extra = torch.cuda.max_memory_allocated() - before
        cpu_s, cpu = timed(ours(x, "cpu"))
        sk_s, _ = timed(lambda: SklearnKMeans(k, init=init, n_init=1, max_iter=ITERATIONS, tol=0.0).fit(x))
        gap = float(np.abs(gpu.cluster_centers_ - cpu.cluster_centers_).max())
        print(
            f"| {n:,} × {d}, {k} | {gpu_s:.3f} | {cpu_s:.3f} | {sk_s:.3f} | {gap:.2e} | "
            f"{extra / 2**20:.0f} MiB (data {x.nbytes / 2**20:.0f} MiB) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
