"""Distributed K-Means: the tests that launch ranks, engines or runs beside them (tests/unit/test_kmeans.py
has the rest)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans as SklearnKMeans
from sklearn.datasets import make_blobs

from ..conftest import run_cli

# -- several processes, through the CLI ---------------------------------------------------------


def _launcher_env():
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


def _prepare(tmp_path, n=6000, k=6):
    x, _ = make_blobs(n, n_features=5, centers=k, random_state=5)
    np.save(tmp_path / "data.npy", x)
    np.save(tmp_path / "init.npy", x[np.random.default_rng(0).choice(n, k, replace=False)])
    return x


def _kmeans_args(tmp_path, out, backend, k=6):
    # tol=0: run to strict convergence, because oneDAL's SPMD mode does not stop on its accuracy threshold
    return [
        "dlscale",
        "kmeans",
        "--input",
        str(tmp_path / "data.npy"),
        "--k",
        str(k),
        "--init",
        str(tmp_path / "init.npy"),
        "--backend",
        backend,
        "--device",
        "cpu",
        "--out",
        str(tmp_path / out),
        "--tol",
        "0",
        "--max-iter",
        "100",
    ]


def test_two_gloo_ranks_on_a_split_data_set_equal_one_process(in_tmp):
    from dlscale.jobs.local_ranks import torchrun_command

    x = _prepare(in_tmp)
    single = subprocess.run(
        [sys.executable, "-m", *_kmeans_args(in_tmp, "one", "torch")], capture_output=True, text=True, timeout=300
    )
    assert single.returncode == 0, single.stderr[-2000:]
    two = subprocess.run(
        torchrun_command(2, _kmeans_args(in_tmp, "two", "torch")),
        capture_output=True,
        text=True,
        timeout=300,
        env=_launcher_env(),
    )
    assert two.returncode == 0, two.stderr[-2000:]
    one_summary = json.loads((in_tmp / "one/summary.json").read_text())
    two_summary = json.loads((in_tmp / "two/summary.json").read_text())
    assert two_summary["ranks"] == 2 and two_summary["n_iter"] == one_summary["n_iter"]
    np.testing.assert_allclose(np.load(in_tmp / "two/centers.npy"), np.load(in_tmp / "one/centers.npy"), rtol=1e-9)
    assert two_summary["inertia"] == pytest.approx(one_summary["inertia"], rel=1e-9)
    labels = np.concatenate([np.load(in_tmp / f"two/labels_rank{r}.npy") for r in range(2)])
    assert np.array_equal(labels, np.load(in_tmp / "one/labels.npy")) and len(labels) == len(x)


def test_two_ranks_with_kmeans_parallel_init_agree_on_the_centres(in_tmp):
    from dlscale.jobs.local_ranks import torchrun_command

    _prepare(in_tmp)
    args = _kmeans_args(in_tmp, "par", "torch")
    args[args.index("--init") + 1] = "k-means||"
    done = subprocess.run(torchrun_command(2, args), capture_output=True, text=True, timeout=300, env=_launcher_env())
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((in_tmp / "par/summary.json").read_text())
    reference = SklearnKMeans(6, n_init=5, random_state=0).fit(np.load(in_tmp / "data.npy"))
    assert summary["inertia"] < 1.05 * reference.inertia_  # a good clustering, found by two ranks together


@pytest.mark.extras  # (daal4py and Intel MPI)
def test_daal4py_under_mpirun_equals_one_process_and_the_torch_backend(in_tmp):
    bin_dir = os.path.dirname(sys.executable)
    _prepare(in_tmp)
    one = subprocess.run(
        [sys.executable, "-m", *_kmeans_args(in_tmp, "one", "daal4py")], capture_output=True, text=True, timeout=300
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [os.path.join(bin_dir, "mpirun"), "-n", "2", sys.executable, "-m", *_kmeans_args(in_tmp, "mpi", "auto")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_launcher_env(),
    )
    assert two.returncode == 0, (two.stdout[-2000:], two.stderr[-2000:])
    summary = json.loads((in_tmp / "mpi/summary.json").read_text())
    assert summary["backend"] == "daal4py" and summary["ranks"] == 2  # auto picks daal4py under MPI
    np.testing.assert_allclose(np.load(in_tmp / "mpi/centers.npy"), np.load(in_tmp / "one/centers.npy"), rtol=1e-9)
    torch_run = subprocess.run(
        [sys.executable, "-m", *_kmeans_args(in_tmp, "torch", "torch")], capture_output=True, text=True, timeout=300
    )
    assert torch_run.returncode == 0
    np.testing.assert_allclose(
        np.sort(np.load(in_tmp / "mpi/centers.npy"), axis=0),
        np.sort(np.load(in_tmp / "torch/centers.npy"), axis=0),
        rtol=1e-5,
    )


def test_cli_quantizes_the_sample_image(in_tmp):
    done = run_cli(
        "kmeans", "--image", "sample", "--k", "8", "--backend", "torch", "--device", "cpu", "--out", "quant", cwd=in_tmp
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from matplotlib import image as mpimg

    quantized = mpimg.imread(in_tmp / "quant/quantized.png")[..., :3]
    assert quantized.shape[:2] == (427, 640)
    assert len(np.unique(quantized.reshape(-1, 3), axis=0)) <= 8
    summary = json.loads((in_tmp / "quant/summary.json").read_text())
    assert summary["n_clusters"] == 8 and summary["inertia"] > 0 and summary["n_iter"] >= 1
    assert (in_tmp / "quant/comparison.png").stat().st_size > 10_000


def test_cli_reads_one_npy_file_per_rank_and_reports_missing_files(in_tmp):
    x = _prepare(in_tmp)
    np.save(in_tmp / "part_0.npy", x)
    done = run_cli(
        "kmeans",
        "--input",
        "part_{rank}.npy",
        "--k",
        "6",
        "--backend",
        "torch",
        "--device",
        "cpu",
        "--out",
        "parts",
        cwd=in_tmp,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.load(in_tmp / "parts/labels.npy").shape == (len(x),)
    missing = run_cli("kmeans", "--input", "nothing_{rank}.npy", "--k", "3", cwd=in_tmp)
    assert missing.returncode == 2 and "no such input file: nothing_0.npy" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.extras  # (ipyparallel)
def test_the_centre_update_check_rejects_a_mean_of_means_and_two_all_reduces():
    from dlscale.lessons.lesson08 import check_centre_update

    def mean_of_means(x_local, labels_local, previous):
        import torch.distributed as dist

        means = torch.stack(
            [
                x_local[labels_local == c].mean(0) if (labels_local == c).any() else previous[c]
                for c in range(previous.shape[0])
            ]
        ).double()
        dist.all_reduce(means)
        return means / dist.get_world_size()

    def two_messages(x_local, labels_local, previous):
        import torch.distributed as dist

        k = previous.shape[0]
        sums = torch.zeros(k, x_local.shape[1], dtype=torch.float64).index_add_(0, labels_local, x_local.double())
        counts = torch.bincount(labels_local, minlength=k).double()
        dist.all_reduce(sums)
        dist.all_reduce(counts)
        return torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], previous)

    with pytest.raises(AssertionError, match="mean of the ranks' means"):
        check_centre_update(mean_of_means)
    with pytest.raises(AssertionError, match="all-reduce it once"):
        check_centre_update(two_messages)


def test_two_ranks_cover_every_distinct_point_once_each(in_tmp):
    """The relocation over ranks: a point both ranks hold copies of is taken once, by both ranks alike."""
    from dlscale.jobs.local_ranks import torchrun_command
    from tests.unit.test_kmeans import duplicated_points

    points, x = duplicated_points()
    np.save(in_tmp / "data.npy", x)
    np.save(in_tmp / "init.npy", x[:60])
    args = _kmeans_args(in_tmp, "two", "torch", k=60)
    done = subprocess.run(torchrun_command(2, args), capture_output=True, text=True, timeout=300, env=_launcher_env())
    assert done.returncode == 0, done.stderr[-2000:]
    centers = np.load(in_tmp / "two/centers.npy")
    nearest = np.sqrt(((points[:, None, :] - centers[None]) ** 2).sum(-1)).min(1)
    assert nearest.max() < 1e-5 and json.loads((in_tmp / "two/summary.json").read_text())["inertia"] < 1e-6
