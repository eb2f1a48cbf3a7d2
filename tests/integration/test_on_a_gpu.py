"""On a CUDA GPU, the paths the faked-device tests (test_gpu_paths.py) can only stand in for.

Marked ``gpu``: without CUDA each skips with one reason, counted in the run's last line
(tests/plugins/skips.py: NO_GPU), and CI accepts that skip. On a GPU node, ``pytest -m gpu`` runs them.
"""

import math

import pytest

from dlscale.lessons.stage_check import STAGE_TOLERANCE
from dlscale.training.loop import train_quietly

pytestmark = pytest.mark.gpu


def _losses(tmp_path, device: str, **overrides) -> list[float]:
    result = train_quietly(
        "tiny", device=device, epochs=1, run_dir=str(tmp_path / device), progress=False, plot=False, **overrides
    )
    return [row["loss"] for row in result.steps]


def test_the_gpu_trains_what_the_cpu_trains_within_the_stated_tolerance(tmp_path):
    # the tolerance the lessons' stage checks state for a GPU (cuDNN's algorithms, TF32): it must hold here
    cpu, gpu = _losses(tmp_path, "cpu", precision="fp32"), _losses(tmp_path, "cuda", precision="fp32")
    assert len(cpu) == len(gpu)
    for step, (a, b) in enumerate(zip(cpu, gpu)):
        assert abs(a - b) <= STAGE_TOLERANCE["cuda"] * max(1.0, abs(a)), (step, a, b)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_the_gpu(tmp_path, precision):
    losses = _losses(tmp_path, "cuda", precision=precision)
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kmeans_on_the_gpu_ends_where_the_cpu_ends(dtype):
    # The GPU scores every row by a GEMM, the CPU by its compiled pass or BLAS: the rounding differs, so equality
    # is stated on well-separated blobs, where no row lies near a boundary, and the centres within float32's rounding.
    import numpy as np

    from dlscale.bench.kmeans import make_blobs
    from dlscale.kmeans.estimator import KMeans

    x = make_blobs(200_000, 16, 24, seed=3).astype(dtype)
    init = x[np.random.default_rng(4).choice(len(x), 24, replace=False)]
    cpu, gpu = (
        KMeans(24, init=init, max_iter=50, tol=0.0, device=device, backend="torch").fit(x) for device in ("cpu", "cuda")
    )
    assert gpu.pass_ == "gemm" and gpu.n_iter_ == cpu.n_iter_
    assert (gpu.labels_ == cpu.labels_).mean() >= 0.9999
    assert np.allclose(gpu.cluster_centers_, cpu.cluster_centers_, rtol=0, atol=1e-4)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-5)
