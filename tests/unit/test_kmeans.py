"""Distributed K-Means: scikit-learn's semantics and estimator checks, weights, the bounds that skip rows,
chunking, empty clusters, init, ranks, daal4py, CLI."""

import json
import re
import sys

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans as SklearnKMeans
from sklearn.datasets import make_blobs, make_circles, make_moons
from sklearn.exceptions import NotFittedError

from dlscale.kmeans import KMeans, KMeansError
from dlscale.kmeans.initialization import kmeans_parallel, kmeans_plusplus
from dlscale.kmeans.scoring import assign as _assign


def _datasets():
    blobs, _ = make_blobs(4000, n_features=6, centers=7, random_state=0)
    anisotropic = blobs @ np.array(
        [
            [0.6, -0.6, 0, 0, 0, 0],
            [-0.4, 0.8, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ]
    )
    moons, _ = make_moons(3000, noise=0.1, random_state=0)
    circles, _ = make_circles(3000, noise=0.05, factor=0.4, random_state=0)
    uniform = np.random.default_rng(0).uniform(size=(3000, 3))
    return {"blobs": blobs, "anisotropic": anisotropic, "moons": moons, "circles": circles, "uniform": uniform}


@pytest.mark.parametrize("name", sorted(_datasets()))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matches_scikit_learn_from_the_same_initial_centres(name, dtype):
    x = _datasets()[name].astype(dtype)
    init = x[np.random.default_rng(1).choice(len(x), 9, replace=False)]
    reference = SklearnKMeans(9, init=init, n_init=1, algorithm="lloyd").fit(x)
    ours = KMeans(9, init=init, backend="torch", device="cpu").fit(x)
    assert ours.n_iter_ == reference.n_iter_
    assert np.array_equal(ours.labels_, reference.labels_)
    scale = np.abs(reference.cluster_centers_).max()
    np.testing.assert_allclose(ours.cluster_centers_, reference.cluster_centers_, rtol=1e-4, atol=1e-4 * scale)
    assert ours.inertia_ == pytest.approx(reference.inertia_, rel=1e-6 if dtype == np.float64 else 1e-5)
    assert np.array_equal(ours.predict(x), ours.labels_)  # final labels belong to the returned centres


def test_empty_clusters_are_reseeded_like_scikit_learn_never_nan():
    # 3 natural groups of duplicated points, 5 clusters, two starting centres far from everything
    points = np.repeat(np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]), [40, 30, 20], axis=0)
    points = points + np.random.default_rng(0).normal(scale=0.01, size=points.shape)
    init = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [100.0, 100.0], [-100.0, 50.0]])
    reference = SklearnKMeans(5, init=init, n_init=1, algorithm="lloyd").fit(points)
    ours = KMeans(5, init=init, backend="torch", device="cpu").fit(points)
    assert np.isfinite(ours.cluster_centers_).all()
    assert not np.any(np.all(ours.cluster_centers_ == 0, axis=1))  # no cluster parked at the origin
    assert len(set(ours.labels_.tolist())) == 5  # every cluster got points
    assert ours.inertia_ == pytest.approx(reference.inertia_, rel=1e-6)
    np.testing.assert_allclose(
        np.sort(ours.cluster_centers_, axis=0), np.sort(reference.cluster_centers_, axis=0), atol=1e-6
    )


def test_results_do_not_depend_on_the_chunk_size():
    x, _ = make_blobs(5000, n_features=4, centers=6, random_state=2)
    runs = [
        KMeans(6, random_state=0, backend="torch", device="cpu", chunk_size=size).fit(x) for size in (7, 1000, None)
    ]
    for run in runs[1:]:
        assert np.array_equal(run.labels_, runs[0].labels_)
        np.testing.assert_allclose(run.cluster_centers_, runs[0].cluster_centers_, rtol=1e-10)
        assert run.n_iter_ == runs[0].n_iter_


@pytest.mark.parametrize("compiled", [False, True], ids=["one GEMM per chunk", "compiled tiles"])
def test_no_allocation_is_as_large_as_the_full_distance_matrix(compiled):
    from torch.profiler import ProfilerActivity, profile

    n, k, chunk = 40_000, 64, 1024
    x = torch.randn(n, 8)
    centers = x[:k].clone()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _assign(x, centers, chunk, compiled=compiled)
    largest = max(event.cpu_memory_usage for event in prof.events())
    if not compiled:
        assert largest >= chunk * k * 4  # the profiler did see the chunk's distance block
    assert largest < n * k * 4 / 10  # far below an n × k matrix


def test_kmeans_parallel_init_is_about_as_good_as_kmeans_plusplus():
    x = torch.from_numpy(make_blobs(6000, n_features=5, centers=20, cluster_std=0.5, random_state=3)[0])
    costs = {"++": [], "||": [], "random": []}
    for seed in range(5):
        generator = lambda: torch.Generator().manual_seed(seed)  # noqa: E731
        for name, centers in (
            ("++", kmeans_plusplus(x, 20, generator())),
            ("||", kmeans_parallel(x, 20, generator(), chunk=2048)),
            ("random", x[torch.randperm(len(x), generator=generator())[:20]]),
        ):
            costs[name].append(_assign(x, centers, 4096)[1])
    assert np.mean(costs["||"]) < 2.0 * np.mean(costs["++"])
    assert np.mean(costs["||"]) < np.mean(costs["random"])  # and it is a real seeding, not luck


def test_bad_arguments_get_clear_errors():
    x = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(KMeansError, match="n_samples=10 should be >= n_clusters=20"):
        KMeans(20, backend="torch", device="cpu").fit(x)
    with pytest.raises(KMeansError, match="number of features of the data 2"):
        KMeans(3, init=np.zeros((3, 5)), backend="torch", device="cpu").fit(x)
    with pytest.raises(NotFittedError, match="not fitted"):
        KMeans(3).predict(x)
    with pytest.raises(ValueError, match="Expected 2D array"):
        KMeans(3, backend="torch", device="cpu").fit(np.zeros(10))
    with pytest.raises(ValueError, match="n_clusters' parameter of KMeans must be an int in the range"):
        KMeans(0).fit(x)
    with pytest.raises(ValueError, match="Negative values in data passed to .sample_weight"):
        KMeans(2, device="cpu").fit(x, sample_weight=-np.ones(10))
    with pytest.raises(KMeansError, match="daal4py' takes no sample_weight"):
        KMeans(2, backend="daal4py").fit(x, sample_weight=np.ones(10))


def test_a_missing_daal4py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "daal4py", None)
    with pytest.raises(KMeansError, match=r"pip install -e '\.\[kmeans\]' in the dlscale folder"):
        KMeans(3, backend="daal4py").fit(np.zeros((10, 2)))


@pytest.mark.extras  # (daal4py)
def test_daal4py_in_one_process_agrees_with_the_torch_backend():
    x, _ = make_blobs(3000, n_features=4, centers=5, random_state=4)
    init = x[:5].copy()
    daal = KMeans(5, init=init, backend="daal4py", tol=0.0, max_iter=50).fit(x)
    ours = KMeans(5, init=init, backend="torch", device="cpu", tol=0.0, max_iter=50).fit(x)
    assert daal.backend_ == "daal4py"
    np.testing.assert_allclose(
        np.sort(daal.cluster_centers_, axis=0), np.sort(ours.cluster_centers_, axis=0), rtol=1e-6
    )
    assert daal.inertia_ == pytest.approx(ours.inertia_, rel=1e-6)


@pytest.mark.extras  # (daal4py)
def test_auto_picks_torch_in_one_process_and_daal4py_for_mpi_ranks(monkeypatch):
    from dlscale.kmeans import resolve_backend

    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu) == "torch"  # measured faster than daal4py on CPUs (docs/benchmarks.md)
    assert resolve_backend("auto", torch.device("cuda")) == "torch"
    for name, value in {"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    assert resolve_backend("auto", cpu) == "daal4py"  # ranks from mpirun, no torch process group
    with pytest.raises(KMeansError, match="auto, torch or daal4py"):
        resolve_backend("sklearn", cpu)


def test_the_benchmark_fits_each_kind_of_data_in_both_phases_beside_scikit_learn(tmp_path):
    from dlscale.bench.kmeans import FLOAT64_REFERENCE, bench_kmeans, format_kmeans

    rows = bench_kmeans(
        n=4000,
        d=8,
        k=6,
        iterations=3,
        rounds=1,
        kinds=("blobs", "noise", "china", "mixture"),
        photo_k=(4,),
        photo_copies=1,
        out_dir=tmp_path,
    )
    by = {(r["data"], r["phase"], r["engine"]): r for r in rows}
    data = list(dict.fromkeys(r["data"] for r in rows))
    assert data == [
        "blobs 4,000 × 8, k=6",
        "noise 1,600 × 8, k=6",
        "china.jpg colours 273,280 × 3, k=4",
        "mixture 480 × 128, k=40",
    ]
    for label in data:
        for phase in ("first iterations", "to convergence"):
            ours, theirs = by[label, phase, "dlscale torch (cpu)"], by[label, phase, "scikit-learn"]
            assert theirs["time_ratio_to_sklearn"] == 1.0
            assert ours["time_ratio_to_sklearn"] == pytest.approx(ours["seconds"] / theirs["seconds"])
            assert ours["inertia"] == pytest.approx(theirs["inertia"], rel=1e-3)  # the same clustering, roughly
            if phase == "first iterations":
                assert ours["iterations"] == theirs["iterations"] == 3
    # a photo's many repeated colours: scikit-learn on the same data in float64, for the spread of its iterations
    assert (data[2], "to convergence", FLOAT64_REFERENCE) in by and (
        data[0],
        "to convergence",
        FLOAT64_REFERENCE,
    ) not in by
    table = format_kmeans(rows)
    # (the pass that ran most: chosen by time, so either, on a busy machine)
    assert re.search(
        r"\| china.jpg colours 273,280 × 3, k=4 \| to convergence \| dlscale torch \(cpu\) \| (compiled|blas) \|", table
    )
    assert re.search(r"^CPU: .+, \d+ CPUs, SIMD \w+", table)  # the CPU and its SIMD: ratios depend on them
    assert by[data[0], "to convergence", "scikit-learn"]["pass"] == "lloyd"
    assert (tmp_path / "kmeans.png").stat().st_size > 10_000


def test_the_scaling_runs_launch_each_process_count_once_for_strong_and_weak(tmp_path, monkeypatch):
    """One launch per process count fits both modes, strong then weak (a process start costs more than the fit); one
    process holds all the data in both modes: the same fit, so it is fitted once and given to both."""
    import dlscale.bench.kmeans as bench

    launched = []

    def fake_run(launcher, procs, data, init, k, iterations, out, threads):
        launched.append((launcher, out.name, [len(np.load(path)) for path in data]))
        return [
            {
                "backend": "torch",
                "threads": {"count": threads},
                "seconds": 1.0,
                "n_iter": iterations,
                "seconds_per_iteration": 0.5 * procs if "weak" in path.name else 0.5 / procs,
            }
            for path in data
        ]

    monkeypatch.setattr(bench, "_scaling_run", fake_run)
    monkeypatch.setattr("dlscale.kmeans.daal.available", lambda: False)
    x = np.zeros((10, 3), dtype=np.float32)
    rows = bench._scaling(x, x[:2], [1, 2], 3, tmp_path, 0)
    assert launched == [("torchrun", "torchrun-1", [10]), ("torchrun", "torchrun-2", [10, 20])]
    assert [(r["mode"], r["processes"], r["samples"]) for r in rows] == [
        ("strong", 1, 10),
        ("strong", 2, 10),
        ("weak", 1, 10),
        ("weak", 2, 20),
    ]
    assert [r["efficiency"] for r in rows] == [1.0, 1.0, 1.0, 0.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.npy"]  # (the data sets removed after their runs)


def test_the_command_fits_several_inputs_in_one_launch_after_a_warm_up(in_tmp, capfd):
    """`dlscale kmeans --input a --input b --warm-up`: each input fitted in turn, its outputs in OUT/0, OUT/1 (what the
    benchmark's scaling runs use: one process start for strong and weak scaling); weights go with one input only."""
    from dlscale.cli import main

    x, _ = make_blobs(600, n_features=3, centers=4, random_state=0)
    np.save("a.npy", x.astype(np.float32))
    np.save("b.npy", np.tile(x, (2, 1)).astype(np.float32))
    args = ["kmeans", "--input", "a.npy", "--input", "b.npy", "--k", "4", "--backend", "torch", "--device", "cpu"]
    assert main([*args, "--warm-up", "--out", "both"]) == 0
    summaries = [json.loads((in_tmp / f"both/{n}/summary.json").read_text()) for n in (0, 1)]
    assert [s["n_samples_rank0"] for s in summaries] == [600, 1200]
    assert np.load(in_tmp / "both/1/labels.npy").shape == (1200,)
    np.save("w.npy", np.ones(600))
    assert main([*args, "--sample-weight", "w.npy", "--out", "weighted"]) == 2
    refused = capfd.readouterr().err.strip().splitlines()[-1]
    assert refused.endswith("--sample-weight goes with one --input (one weight per sample of that file)"), refused
    assert not (in_tmp / "weighted").exists()  # (refused before any fit)


def test_the_gpu_chunk_counts_the_float64_copy_of_its_rows():
    """The GPU pass adds each chunk's rows in float64 too: without them, 784 features overran the budget ~35 times."""
    from dlscale.kmeans.lloyd import GPU_CHUNK_BUDGET, default_chunk_size

    rows = default_chunk_size(16, 4, "cuda", n_features=784)
    assert rows * (16 * (4 + 8) + 784 * 8) <= GPU_CHUNK_BUDGET
    assert default_chunk_size(16, 4, "cuda") * 784 * 8 > 30 * GPU_CHUNK_BUDGET  # what the old count allowed
    assert default_chunk_size(16, 4, "cpu", n_features=784) == default_chunk_size(16, 4, "cpu")  # CPUs: unchanged


def test_the_gpu_path_holds_no_temporary_of_the_datas_size_but_its_centred_copy(monkeypatch):
    """The GPU's pass, mean and relocation of empty clusters go chunk by chunk. Run here by the same code (no
    bounds, no compiled loops), every tensor an operation returns is recorded: only the centred copy of the data is
    as large as the data. On an H200, 200k × 784 took 1.8 GiB beyond its data when the relocation squared every
    row's difference at once (docs/benchmarks.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dlscale.kmeans import compiled_scoring, estimator, lloyd

    class Sizes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            given = {
                t.untyped_storage().data_ptr() for t in [*args, *(kwargs or {}).values()] if isinstance(t, torch.Tensor)
            }
            self.largest += [
                t.numel()
                for t in (out if isinstance(out, (tuple, list)) else [out])  # (not views)
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given
            ]
            return out

    monkeypatch.setattr(lloyd, "_use_bounds", lambda device, skip_rows: False)
    monkeypatch.setattr(compiled_scoring, "available", lambda: False)
    monkeypatch.setattr(estimator, "centred", lambda x, mean: x - mean)  # (as on a GPU: on CPUs numpy's buffer)
    _, x = duplicated_points(np.float32)  # (60 clusters, 40 distinct points: empty clusters to relocate)
    with Sizes() as sizes:
        fit = KMeans(60, init=x[:60], n_init=1, chunk_size=100).fit(torch.from_numpy(x))
    assert fit.pass_ == "gemm" and fit.inertia_ < 1e-6
    assert sum(size >= x.size for size in sizes.largest) == 1  # x - mean
    assert sorted(sizes.largest)[-2] <= 100 * 60  # then a chunk's distance block


def duplicated_points(dtype=np.float64):
    """40 distinct points, each copied 50 times, shuffled; 60 initial centres from the first rows (so many copies of
    a few points, and at the first pass many empty clusters). Before the relocation took distinct rows, this fit
    ended with 38 distinct centres and an inertia of 51."""
    rng = np.random.default_rng(22)
    points = rng.normal(size=(40, 5))
    x = np.repeat(points, 50, axis=0)
    rng.shuffle(x)
    return points, x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_distinct_point_becomes_a_centre_when_there_are_clusters_enough(dtype):
    points, x = duplicated_points(dtype)
    fit = KMeans(60, init=x[:60], n_init=1).fit(x)
    nearest = np.sqrt(((points[:, None, :] - fit.cluster_centers_[None]) ** 2).sum(-1)).min(1)
    assert nearest.max() < 1e-5  # each of the 40 points is a centre
    assert fit.inertia_ < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_centred_copy_in_numpys_buffer_is_torchs_subtraction_bit_for_bit(dtype):
    from dlscale.kmeans.lloyd import centred

    x = torch.randn(300, 7, generator=torch.Generator().manual_seed(0), dtype=dtype) * 1e3
    mean = x.double().mean(0).to(dtype)
    for rows in (x, x[::2]):  # (and rows with a stride)
        copy = centred(rows, mean)
        assert copy.dtype == dtype and torch.equal(copy, rows - mean)
        assert copy.untyped_storage().data_ptr() != rows.untyped_storage().data_ptr()
