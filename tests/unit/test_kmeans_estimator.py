"""KMeans as a scikit-learn estimator: check_estimator, clone/Pipeline/GridSearchCV, input validation,
sample weights exact against scikit-learn, weighted seeding, the bounds that skip rows, and the extra."""

import doctest
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.cluster import KMeans as SklearnKMeans
from sklearn.datasets import make_blobs
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from dlscale.kmeans import KMeans, KMeansError
from dlscale.kmeans.initialization import kmeans_parallel, kmeans_plusplus, random_init
from dlscale.kmeans.lloyd import lloyd
from dlscale.kmeans.scoring import assign as _assign


def _blobs(n=3000, d=5, k=6, seed=0, dtype=np.float64):
    x, y = make_blobs(n, n_features=d, centers=k, random_state=seed)
    return x.astype(dtype), y


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sample_weight_matches_scikit_learn_from_the_same_initial_centres(dtype):
    x, _ = _blobs(4000, 6, 7, dtype=dtype)
    rng = np.random.default_rng(3)
    weights = rng.uniform(0.2, 3.0, len(x))
    weights[rng.choice(len(x), 300, replace=False)] = 0.0  # zero weights count for nothing
    init = x[rng.choice(len(x), 9, replace=False)]
    reference = SklearnKMeans(9, init=init, n_init=1, algorithm="lloyd").fit(x, sample_weight=weights)
    untouched = x.copy()
    ours = KMeans(9, init=init, backend="torch", device="cpu").fit(x, sample_weight=weights)
    assert np.array_equal(x, untouched)  # the caller's data is never changed
    assert ours.n_iter_ == reference.n_iter_
    assert np.array_equal(ours.labels_, reference.labels_)
    tolerance = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(
        ours.cluster_centers_, reference.cluster_centers_, rtol=tolerance, atol=tolerance * np.abs(x).max()
    )
    assert ours.inertia_ == pytest.approx(reference.inertia_, rel=1e-9 if dtype == np.float64 else 1e-5)
    assert ours.score(x, sample_weight=weights) == pytest.approx(reference.score(x, sample_weight=weights), rel=1e-5)
    unweighted = KMeans(9, init=init, backend="torch", device="cpu").fit(x)
    assert abs(unweighted.inertia_ - ours.inertia_) > 1e-3 * ours.inertia_  # the weights did change the fit


def test_integer_weights_equal_repeated_rows_from_the_same_start():
    x, _ = _blobs(2000, 4, 5, seed=1)
    counts = np.random.default_rng(0).integers(0, 4, len(x))
    init = x[counts > 0][:5]
    weighted = KMeans(5, init=init, backend="torch", device="cpu").fit(x, sample_weight=counts)
    repeated = KMeans(5, init=init, backend="torch", device="cpu").fit(np.repeat(x, counts, axis=0))
    assert weighted.n_iter_ == repeated.n_iter_
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, rtol=1e-12, atol=1e-12)
    assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=1e-12)


def test_weighted_seeding_never_picks_a_zero_weight_row_and_follows_the_weights():
    x = torch.from_numpy(_blobs(3000, 3, 6, seed=2)[0])
    weights = torch.zeros(len(x), dtype=torch.float64)
    weights[::3] = 1.0  # only every third row may be a centre
    allowed = {tuple(row) for row in x[::3].tolist()}
    for seed in range(3):
        for centers in (
            kmeans_plusplus(x, 6, torch.Generator().manual_seed(seed), weights=weights),
            kmeans_parallel(x, 6, torch.Generator().manual_seed(seed), 512, weights=weights),
            random_init(x, 6, torch.Generator().manual_seed(seed), weights),
        ):
            assert {tuple(row) for row in centers.tolist()} <= allowed
            assert len({tuple(row) for row in centers.tolist()}) == 6  # distinct rows
    # all the weight on one blob: random seeding draws its 6 centres from that blob
    _, y = _blobs(3000, 3, 6, seed=2)
    heavy = torch.from_numpy(np.where(y == 0, 1000.0, 1.0))
    chosen = random_init(x, 6, torch.Generator().manual_seed(0), heavy)
    members = {tuple(row) for row in x[torch.from_numpy(y == 0)].tolist()}
    assert sum(tuple(row) in members for row in chosen.tolist()) >= 5


def test_clone_pipeline_and_grid_search_accept_it():
    x, y = _blobs(1500, 4, 7, seed=4)
    model = KMeans(7, random_state=0, device="cpu", chunk_size=256)
    twin = clone(model)
    assert twin is not model and twin.get_params() == model.get_params()
    assert twin.set_params(n_clusters=3).n_clusters == 3 and model.n_clusters == 7

    pipeline = make_pipeline(StandardScaler(), KMeans(7, random_state=0, device="cpu")).fit(x)
    scaled = StandardScaler().fit_transform(x)
    alone = KMeans(7, random_state=0, device="cpu").fit(scaled)
    assert np.array_equal(pipeline.predict(x), alone.labels_)
    assert pipeline.transform(x).shape == (len(x), 7)
    assert list(pipeline.get_feature_names_out()) == [f"kmeans{i}" for i in range(7)]

    # KMeans as a feature step: the distances to 7 centres separate the 7 blobs, 1 centre cannot
    search = GridSearchCV(
        make_pipeline(StandardScaler(), KMeans(random_state=0, device="cpu"), LogisticRegression(max_iter=500)),
        {"kmeans__n_clusters": [1, 7]},
        cv=3,
    ).fit(x, y)
    assert search.best_params_ == {"kmeans__n_clusters": 7}
    assert search.best_score_ > 0.9 > search.cv_results_["mean_test_score"][0]


def test_inputs_are_validated_as_scikit_learn_does():
    pandas = pytest.importorskip("pandas")  # the dev extra installs it; CI fails on a skip
    x, _ = _blobs(600, 3, 4, seed=5)
    assert KMeans(4, device="cpu", random_state=0).fit(x.astype(np.float32)).cluster_centers_.dtype == np.float32
    assert KMeans(4, device="cpu", random_state=0).fit(x).transform(x[:5].astype(np.float32)).dtype == np.float64
    from_list = KMeans(4, device="cpu", random_state=0).fit(x.tolist())
    assert from_list.cluster_centers_.dtype == np.float64 and from_list.n_features_in_ == 3
    frame = pandas.DataFrame(x, columns=["red", "green", "blue"])
    fitted = KMeans(4, device="cpu", random_state=0).fit(frame)
    assert list(fitted.feature_names_in_) == ["red", "green", "blue"]
    with pytest.warns(UserWarning, match="feature names"):
        fitted.predict(x)  # fitted with names, given none: scikit-learn's warning
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        KMeans(4, device="cpu").fit(bad)
    with pytest.raises(ValueError, match="X has 2 features, but KMeans is expecting 3 features"):
        from_list.predict(x[:, :2])
    with pytest.raises(KMeansError, match="NaN or infinity"):
        KMeans(4, device="cpu").fit(torch.from_numpy(bad))


def test_doctest_example_runs():
    from dlscale.kmeans import estimator

    outcome = doctest.testmod(estimator, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert outcome.attempted >= 6 and outcome.failed == 0


def test_package_imports_without_scikit_learn_and_the_estimator_names_the_extra():
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "import dlscale, dlscale.kmeans\n"
        "from dlscale.kmeans import resolve_backend\n"
        "try:\n    dlscale.kmeans.KMeans\nexcept dlscale.kmeans.KMeansError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "dlscale.kmeans.KMeans needs sklearn" in done.stdout
        and "pip install -e '.[kmeans]' in the dlscale folder" in done.stdout
    )


# -- the bounds that skip rows ------------------------------------------------------------------------


def test_skipping_rows_gives_the_labels_of_full_rescoring_and_skips_most_of_them():
    x = torch.from_numpy(make_blobs(20_000, n_features=8, centers=12, cluster_std=1.5, random_state=6)[0])
    init = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:12]].clone()
    skipping = lloyd(x, None, init.clone(), 100, 0.0, 1024, skip_rows=True, cpu_pass="compiled")
    full = lloyd(x, None, init.clone(), 100, 0.0, 1024, skip_rows=False)  # the GPU path, run on the CPU
    assert skipping.n_iter == full.n_iter > 5
    assert torch.equal(skipping.labels, full.labels)
    torch.testing.assert_close(skipping.centers, full.centers, rtol=1e-12, atol=1e-12)
    assert full.rows_scored == len(x) * full.n_iter  # strict convergence: no final pass
    assert skipping.rows_scored < 0.5 * full.rows_scored  # the bounds did skip rows


def test_rows_near_a_tie_are_rescored_not_skipped():
    # Points within float32 rounding of the bisector of two centres: only exact scoring can place them.
    rng = np.random.default_rng(7)
    plane = rng.normal(size=(4000, 3)).astype(np.float32)
    plane[:, 0] = rng.normal(scale=1e-6, size=len(plane)).astype(np.float32)  # x ≈ 0: equidistant from ±1
    far = rng.normal(size=(4000, 3)).astype(np.float32) + np.float32([30, 0, 0])
    x = np.concatenate([plane, far, -far])
    init = np.float32([[-1, 0, 0], [1, 0, 0], [30, 0, 0]])
    reference = SklearnKMeans(3, init=init, n_init=1, algorithm="lloyd", max_iter=20).fit(x)
    ours = KMeans(3, init=init, max_iter=20, backend="torch", device="cpu").fit(x)
    xt, centers = torch.from_numpy(x - x.mean(0)), torch.from_numpy(init - x.mean(0))
    skipping = lloyd(xt, None, centers, 20, 0.0, 512, skip_rows=True, cpu_pass="compiled")
    assert torch.equal(skipping.labels, _assign(xt, skipping.centers, 512)[0])  # a full argmin agrees on every row
    assert skipping.rows_scored < 0.6 * len(x) * (skipping.n_iter + 1)  # while the far rows were skipped
    assert ours.inertia_ == pytest.approx(reference.inertia_, rel=1e-5)


def _pass_shares(x: torch.Tensor, k: int, passes: int) -> list[float]:
    """The share of rows each CPU pass scored, over ``passes`` Lloyd's iterations from the first k rows."""
    from dlscale.kmeans.hamerly import HamerlyPass

    state, centers, previous = HamerlyPass(x, None), x[:k].clone(), None
    labels = torch.full((len(x),), -1, dtype=torch.int64)
    sums, totals = torch.zeros(k, x.shape[1], dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    shares = []
    for _ in range(passes):
        before = state.scored
        state.run(centers, previous, labels, sums, totals)
        shares.append((state.scored - before) / len(x))
        previous, centers = centers, (sums / totals.clamp(min=1)[:, None]).to(x.dtype)
    assert torch.equal(labels, _assign(x, previous, 512)[0])  # skipping or not, the labels of a full argmin
    return shares


def test_the_cpu_pass_tests_the_bounds_only_while_they_skip_enough_rows():
    from dlscale.kmeans.hamerly import HamerlyPass

    # No cluster structure and many centres: the centres keep moving and the bounds skip few rows.
    noise = _pass_shares(torch.rand(20_000, 16, generator=torch.Generator().manual_seed(0)), 48, 10)
    probe = HamerlyPass.PROBE_EVERY
    assert noise[1] > 1 - HamerlyPass.MIN_SKIPPED  # the second pass tested the bounds, which did not pay ...
    assert noise[2 : 1 + probe] == [1.0] * (probe - 1)  # ... so the next passes score every row without testing
    assert noise[1 + probe] < 1.0  # and then test them again
    blobs = _pass_shares(torch.from_numpy(make_blobs(20_000, n_features=16, centers=48, random_state=0)[0]), 48, 10)
    assert max(blobs[1 + probe :]) < 0.5  # where they pay, they are tested every pass


def _mixture(n: int, d: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows about k random means in d dimensions, with exact copies of some rows (ties in every pass)."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(k, d, generator=gen, dtype=torch.float64) * 3
    x = means[torch.randint(0, k, (n,), generator=gen)] + torch.randn(n, d, generator=gen, dtype=torch.float64)
    x[: n // 4] = x[torch.randint(n // 4, n, (n // 4,), generator=gen)]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_blas_and_compiled_passes_give_one_result_bit_for_bit_whichever_runs_when(dtype, monkeypatch):
    from dlscale.kmeans.cpu_pass import CpuPass

    x, k = _mixture(6000, 48, 24, dtype), 24
    weights = torch.rand(len(x), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fits = {choice: lloyd(x, weights, x[:k].clone(), 60, 0.0, 1000, cpu_pass=choice) for choice in ("compiled", "blas")}
    # (the compiled pass by its own rule, and told to test its bounds, as a count of the rows they leave tells it)
    turns = iter([("blas", False), ("compiled", True), ("compiled", False), ("blas", False)] * 100)
    monkeypatch.setattr(CpuPass, "_pick", lambda self, *now: next(turns))
    fits["alternating"] = lloyd(x, weights, x[:k].clone(), 60, 0.0, 1000)
    compiled = fits.pop("compiled")
    assert compiled.pass_name == "compiled" and fits["blas"].pass_name == "blas" and compiled.n_iter > 5
    for fit in fits.values():
        assert fit.n_iter == compiled.n_iter and fit.inertia == compiled.inertia
        assert torch.equal(fit.centers, compiled.centers) and torch.equal(fit.labels, compiled.labels)
    assert torch.equal(fits["blas"].labels, _assign(x, compiled.centers, 1000)[0])  # predict's labels


def test_near_ties_under_the_gemm_are_scored_by_the_compiled_arithmetic():
    from dlscale.kmeans import compiled_scoring
    from dlscale.kmeans.blas_pass import BlasPass
    from dlscale.kmeans.hamerly import HamerlyPass

    # Rows within float32 rounding of the bisector of two centres (u ± v), at 64 features: BLAS's sums and the compiled
    # loop's round them differently, and the nearest centre depends on which one scored them.
    gen = torch.Generator().manual_seed(3)
    v, u = torch.nn.functional.normalize(torch.randn(64, generator=gen), dim=0), torch.randn(64, generator=gen)
    x = torch.randn(20_000, 64, generator=gen)
    x -= ((x - u) @ v)[:, None] * v - torch.randn(len(x), 1, generator=gen) * 1e-6 * v
    centers = torch.stack([u - v, u + v, u + 40 * torch.randn(64, generator=gen)])
    x = torch.cat([x, centers[2] + torch.randn(20_000, 64, generator=gen)])  # and rows near the third, far from any tie
    exact, _ = compiled_scoring.nearest(x, centers)
    by_gemm = torch.addmm((centers * centers).sum(1), x, centers.T, alpha=-2).argmin(1)
    assert not torch.equal(by_gemm, exact)  # (what the rescoring is for)
    blas = BlasPass(HamerlyPass(x, None))
    labels = torch.full((len(x),), -1, dtype=torch.int64)
    sums, totals = torch.zeros(3, 64, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    assert blas.run(centers, labels, sums, totals) == len(x)
    assert torch.equal(labels, exact)
    assert 0 < blas.rescored <= 20_000  # the near ties only
    torch.testing.assert_close(sums, torch.zeros_like(sums).index_add_(0, labels, x.double()), rtol=1e-12, atol=1e-9)


def test_the_blas_pass_runs_the_blas_on_one_thread_inside_each_of_its_own(capfd):
    """Each thread of the BLAS pass calls the GEMM on its own block of rows: a BLAS that started threads of its own
    inside them would oversubscribe the cores, and OpenBLAS says so ("Detect OpenMP Loop and this application may
    hang", at every block, without the limit). 200 centres: a block's GEMM large enough to be threaded."""
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0))
    fit = lloyd(x, None, x[:200].clone(), 2, 0.0, 1000, cpu_pass="blas")
    assert fit.pass_name == "blas"
    assert "OpenBLAS Warning" not in capfd.readouterr().err


def test_without_scipy_or_threadpoolctl_the_compiled_pass_runs_alone(monkeypatch):
    from dlscale.kmeans.cpu_pass import CpuPass

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # (not importable)
    x = torch.randn(512, 4, generator=torch.Generator().manual_seed(0))
    assert CpuPass(x, None).choice == "compiled"
    with pytest.raises(KMeansError, match=r"needs threadpoolctl.*pip install -e '\.\[kmeans\]'"):
        CpuPass(x, None, "blas")


def test_the_rows_counted_for_the_compiled_pass_are_the_rows_it_then_scores():
    """#63: while the GEMM is the faster, each pass counts the rows the compiled pass's bounds would leave; the count
    is that pass's own test, so the time predicted from it is the pass's and not a guess."""
    from dlscale.kmeans.blas_pass import BlasPass
    from dlscale.kmeans.hamerly import HamerlyPass

    x, k = _mixture(6000, 16, 12, torch.float32), 12
    bounds = HamerlyPass(x, None)
    labels = torch.full((len(x),), -1, dtype=torch.int64)
    sums, totals = torch.zeros(k, 16, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    centers, counts, sampled = x[:k].clone(), [], []
    for _ in range(6):  # the GEMM sets every row's bounds afresh; the centres move; count, then run the compiled pass
        BlasPass(bounds).run(centers, labels, sums, totals)
        new = ((sums / totals.clamp(min=1)[:, None]).float() + centers) / 2
        before = (labels.clone(), bounds.upper.clone(), bounds.lower.clone(), bounds.scored)
        count = bounds.rows_to_score(new, centers, labels)
        sampled.append(bounds.rows_to_score(new, centers, labels, every=3))  # (a tile in three, scaled: large data)
        assert torch.equal(labels, before[0]) and torch.equal(bounds.upper, before[1]) and bounds.scored == before[3]
        bounds._passes_scoring_all = 1  # (its own rule would score every row now; the count overrides it)
        bounds.run(new, centers, labels, sums.clone(), totals.clone(), test_bounds=True)
        counts.append(count)
        assert bounds.scored - before[3] == count
        centers = new
    assert len(set(counts)) == len(counts) and 0 < min(counts) < len(x) // 4 < max(counts)  # (not all, not none)
    assert sampled == pytest.approx(counts, rel=0.1, abs=100)


@pytest.mark.parametrize("faster", ["blas", "compiled"])
def test_the_cpu_pass_is_chosen_by_time_and_the_compiled_one_again_when_its_count_says_it_pays(faster, monkeypatch):
    """A fake clock: the GEMM takes 1 s a pass; the compiled pass 3 s for every row it scores (faster="blas": it
    pays once its bounds leave fewer than a third of the rows) or 0.5 s whatever it scores (faster="compiled")."""
    from dlscale.kmeans import cpu_pass

    x = torch.rand(3000, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    clock, ran, counts = [0.0], [], []
    for kind, owner in (("blas", cpu_pass.BlasPass), ("compiled", cpu_pass.HamerlyPass)):

        def timed(self, *args, kind=kind, original=owner.run, **options):
            ran.append(kind)
            before = self.bounds.scored if kind == "blas" else self.scored
            done = original(self, *args, **options)
            scored = (self.bounds.scored if kind == "blas" else self.scored) - before
            clock[0] += 1.0 if kind == "blas" else (0.5 if faster == "compiled" else 3.0 * scored / len(x))
            return done

        monkeypatch.setattr(owner, "run", timed)
    counting = cpu_pass.HamerlyPass.rows_to_score
    monkeypatch.setattr(
        cpu_pass.HamerlyPass,
        "rows_to_score",
        lambda self, *now: counts.append((len(ran), counting(self, *now))) or counts[-1][1],
    )
    monkeypatch.setattr(cpu_pass.time, "perf_counter", lambda: clock[0])
    # numba compiles on the first pass only: that pass's time is not taken
    monkeypatch.setattr(cpu_pass, "_compiled_versions", lambda loops: min(len(ran), 1))
    fit = lloyd(x, None, x[:12].clone(), 40, -1.0, 1000)  # (no tolerance: 40 passes, unless no label changes)
    assert fit.pass_name == "compiled" and fit.n_iter == 40
    assert ran[:3] == ["blas", "blas", "compiled"]  # the GEMM timed again (it compiled), then the compiled loop
    if faster == "compiled":  # the GEMM's time does not fall: never timed again, nothing counted
        assert "blas" not in ran[3:] and counts == []
        return
    # The third pass (every row scored) cost 3 s: per row 3 s / 3,000. From then on, before each pass while the GEMM
    # was the last faster, the rows were counted, and the compiled pass ran exactly when they cost less than 1 s.
    assert counts and counts[0][0] == 3
    for at, rows in counts:
        assert ran[at] == ("compiled" if 3.0 * rows / len(x) < 1.0 else "blas")
    assert any(ran[at] == "blas" for at, _ in counts) and any(ran[at] == "compiled" for at, _ in counts)


@pytest.mark.parametrize("ratio, first", [(10.0, "compiled"), (0.1, "blas")])
def test_the_first_pass_is_the_one_whose_rows_the_probe_found_cheaper(ratio, first, monkeypatch):
    """The probe's ratio (the GEMM's cost per row over the compiled loop's) chooses the first pass; where the compiled
    loop scores every row the faster, the GEMM never runs and nothing is counted."""
    from dlscale.kmeans import cpu_pass

    ran, counted = [], []
    for kind, owner in (("blas", cpu_pass.BlasPass), ("compiled", cpu_pass.HamerlyPass)):

        def recorded(self, *args, kind=kind, original=owner.run, **options):
            ran.append(kind)
            return original(self, *args, **options)

        monkeypatch.setattr(owner, "run", recorded)
    monkeypatch.setattr(cpu_pass.CpuPass, "probe", lambda self, centers, labels: setattr(self, "ratio", ratio))
    counting = cpu_pass.HamerlyPass.rows_to_score
    monkeypatch.setattr(
        cpu_pass.HamerlyPass, "rows_to_score", lambda self, *now: counted.append(1) or counting(self, *now)
    )
    x = torch.rand(3000, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lloyd(x, None, x[:12].clone(), 12, -1.0, 1000)
    assert ran[0] == first
    if first == "compiled":
        assert set(ran) == {"compiled"} and counted == []
    else:  # the GEMM scores every row at a tenth of the compiled loop's cost: the count decides each pass after it
        assert len(counted) >= 1


def _fake_probe(costs: dict, seed: int | None = None, noisy: str = "compiled", burst: float = 5e-3):
    """``timed(kind, rows)`` of a fake clock: 20 µs a call plus ``costs[kind]`` a row; with a ``seed``, a neighbour's
    burst (up to ``burst`` s) lands on half of the ``noisy`` kind's probes, at random."""
    rng = np.random.default_rng(seed)

    def timed(kind, rows):
        hit = seed is not None and kind == noisy and rng.random() < 0.5
        return 2e-5 + rows * costs[kind] + (rng.uniform(0.2, 1.0) * burst if hit else 0.0)

    return timed


@pytest.mark.parametrize("costs", [{"blas": 8e-8, "compiled": 1e-7}, {"blas": 1.2e-7, "compiled": 1e-7}])
@pytest.mark.parametrize("noisy", ["blas", "compiled"])
def test_a_neighbours_bursts_on_one_pass_s_probes_leave_the_ratio_and_the_choice_as_quiet(costs, noisy):
    """#80: beside a busy process one pass's probes were slowed (a neighbour only ever slows one), and the wrong pass
    ran every pass. The probes take turns and the fastest of each counts, with more rounds while the two fastest
    disagree: a fake clock with bursts on half of one pass's probes finds the quiet clock's ratio, so the same choice,
    for close calls either way (the GEMM 0.8× and 1.2× the compiled loop's cost per row)."""
    from dlscale.kmeans.cpu_pass import PROBE_ROUNDS, probe_ratio

    quiet, quiet_rounds = probe_ratio(_fake_probe(costs), 1024)
    assert quiet == pytest.approx(costs["blas"] / costs["compiled"])
    assert all(len(times) == PROBE_ROUNDS for times in quiet_rounds.values())  # (quiet: the fewest rounds)
    for seed in range(20):
        noisy_ratio, rounds = probe_ratio(_fake_probe(costs, seed, noisy), 1024)
        assert noisy_ratio == pytest.approx(quiet), seed
        assert (noisy_ratio >= 1) == (quiet >= 1)  # the same first pass, and the same rule after it


def test_a_fit_beside_a_neighbour_chooses_as_a_quiet_one(monkeypatch):
    """The chooser in a fit, its probes on a fake clock: quiet, and with bursts on the compiled loop's probes (which
    made it look slower), the fit takes the same passes."""
    from dlscale.kmeans import cpu_pass

    x = torch.rand(5 * cpu_pass.SAMPLE_ROWS, 4, generator=torch.Generator().manual_seed(0))
    costs = {"blas": 1.5e-7, "compiled": 1e-7}  # (the compiled loop the faster, as on a photo's colours)
    fits = {}
    for seed in (None, 1, 2, 3):
        monkeypatch.setattr(cpu_pass.CpuPass, "_probe_timer", lambda self, *a, seed=seed: _fake_probe(costs, seed))
        passes = cpu_pass.CpuPass(x, None)
        labels = torch.full((len(x),), -1, dtype=torch.int64)
        kind, _ = passes._pick(x[:8].clone(), None, labels)
        fits[seed] = (kind, round(passes.ratio, 6))
    assert set(fits.values()) == {("compiled", 1.5)}


def test_a_fit_runs_on_the_cpus_free_at_its_start_gives_torch_its_count_back_and_the_same_bits(monkeypatch):
    """Beside a busy process a fit takes one thread fewer (the loops no longer wait at each pass's end for the thread
    that shares a CPU), puts torch's count back, and its centres and labels are those of the fit on all the CPUs."""
    from dlscale.runtime import threads
    from dlscale.runtime.threads import ThreadChoice

    x, _ = make_blobs(n_samples=6000, centers=6, n_features=5, random_state=0)
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        free, seen = {"count": 2}, []
        monkeypatch.setattr(threads, "threads_now", lambda: ThreadChoice(min(free["count"], 2), "test", 2))
        from dlscale.kmeans import estimator

        def watched(*args, **kwargs):
            seen.append(torch.get_num_threads())  # (the compiled loops take numba's count from it)
            return lloyd(*args, **kwargs)

        monkeypatch.setattr(estimator, "lloyd", watched)
        alone = KMeans(6, init="random", n_init=1, random_state=0, max_iter=20).fit(x)
        free["count"] = 1
        beside = KMeans(6, init="random", n_init=1, random_state=0, max_iter=20).fit(x)
        assert (alone.threads_, beside.threads_, torch.get_num_threads(), seen) == (2, 1, 2, [2, 1])
    finally:
        torch.set_num_threads(kept)
    assert beside.n_iter_ == alone.n_iter_  # (the pass each chose by time may differ: the bits may not)
    assert np.array_equal(beside.cluster_centers_, alone.cluster_centers_)
    assert np.array_equal(beside.labels_, alone.labels_) and beside.inertia_ == alone.inertia_


def test_the_probe_scores_scratch_copies_and_too_few_rows_are_not_probed():
    """The probes run the passes' own loops on a block of rows, on copies: no bound, label or count of the fit
    changes. A fit of fewer than 4 × SAMPLE_ROWS rows is not probed (its passes are timed whole)."""
    from dlscale.kmeans.cpu_pass import SAMPLE_ROWS, CpuPass

    x = torch.rand(5 * SAMPLE_ROWS, 16, generator=torch.Generator().manual_seed(1))
    passes = CpuPass(x, None)
    centers, labels = x[:10].clone(), torch.full((len(x),), -1, dtype=torch.int64)
    before = (passes.bounds.upper.clone(), passes.bounds.lower.clone(), passes.bounds.scored)
    ratio = passes.probe(centers, labels)
    assert ratio is None or ratio > 0
    assert passes.probes and all(len(times) >= 2 for times in passes.probes.values())
    assert torch.equal(before[0], passes.bounds.upper) and torch.equal(before[1], passes.bounds.lower)
    assert before[2] == passes.bounds.scored and bool((labels == -1).all())
    assert CpuPass(x[: 3 * SAMPLE_ROWS], None).probe(centers, labels[: 3 * SAMPLE_ROWS]) is None


def test_a_pass_far_slower_than_the_ratio_predicted_probes_the_ratio_again(monkeypatch):
    """The GEMM first (the probe says it is twice as fast per row); a fake clock makes the compiled pass, when the count
    chooses it, take four times what the ratio predicted from the GEMM's pass: the ratio is probed again, once per
    such pass and at most MAX_RECHECKS times a fit."""
    from dlscale.kmeans import cpu_pass

    x = torch.rand(5 * cpu_pass.SAMPLE_ROWS, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    clock, probed = [0.0], []
    for kind, owner in (("blas", cpu_pass.BlasPass), ("compiled", cpu_pass.HamerlyPass)):

        def timed(self, *args, kind=kind, original=owner.run, **options):
            before = self.bounds.scored if kind == "blas" else self.scored
            done = original(self, *args, **options)
            scored = (self.bounds.scored if kind == "blas" else self.scored) - before
            clock[0] += 1.0 if kind == "blas" else 4 * 2.0 * scored / len(x)  # (the ratio says 2 s for every row)
            return done

        monkeypatch.setattr(owner, "run", timed)
    monkeypatch.setattr(cpu_pass.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(cpu_pass, "_compiled_versions", lambda loops: 0)

    def probe(self, centers, labels):
        probed.append(len(probed))
        self.probes.setdefault(("blas", 1), []).append(1.0)
        self.ratio = 0.5
        return self.ratio

    monkeypatch.setattr(cpu_pass.CpuPass, "probe", probe)
    seen, run = [], cpu_pass.CpuPass.run
    monkeypatch.setattr(cpu_pass.CpuPass, "run", lambda self, *now: seen.append(self) or run(self, *now))
    lloyd(x, None, x[:12].clone(), 40, -1.0, 1000)
    passes = seen[0]
    assert passes.passes["blas"] >= 1 and passes.passes["compiled"] >= 1  # (the GEMM first; the count chose the other)
    assert 2 <= len(probed) <= 1 + cpu_pass.MAX_RECHECKS and passes.rechecks == len(probed) - 1


# -- scikit-learn's own parameters ----------------------------------------------------------------------


def test_scikit_learns_parameters_are_accepted_and_do_what_they_say(capsys):
    """algorithm (both run the same iterations), copy_x (the data are never changed), verbose (scikit-learn's
    lines), a callable init (called on the centred data, as scikit-learn calls it)."""
    x, _ = _blobs()
    original = x.copy()
    init = x[:6].copy()
    lloyd = KMeans(6, init=init, n_init=1, algorithm="lloyd").fit(x)
    elkan = KMeans(6, init=init, n_init=1, algorithm="elkan", copy_x=False).fit(x)
    np.testing.assert_array_equal(lloyd.labels_, elkan.labels_)
    np.testing.assert_allclose(lloyd.cluster_centers_, elkan.cluster_centers_)
    assert np.array_equal(x, original)
    with pytest.raises(ValueError, match="algorithm"):
        KMeans(6, algorithm="full").fit(x)

    KMeans(6, init=init, n_init=1, verbose=1, tol=0).fit(x)
    out = capsys.readouterr().out
    assert "Initialization complete" in out and re.search(r"Iteration 0, inertia [\d.e+]+", out)
    assert re.search(r"Converged at iteration \d+: strict convergence", out)
    KMeans(6, init=init, n_init=1, verbose=1, tol=1e-2).fit(x)
    assert re.search(r"center shift [\d.e+-]+ within tolerance", capsys.readouterr().out)

    seen = {}

    def first_rows(data, n_clusters, random_state):
        seen["mean"], seen["state"] = data.mean(0), random_state
        return data[:n_clusters]

    called = KMeans(6, init=first_rows, random_state=0).fit(x)
    np.testing.assert_allclose(seen["mean"], 0, atol=1e-9)  # centred, as scikit-learn passes it
    assert isinstance(seen["state"], np.random.RandomState)
    np.testing.assert_array_equal(called.labels_, lloyd.labels_)  # the same first rows, so the same fit
    with pytest.raises(KMeansError, match="initial centers .* does not match the number of clusters"):
        KMeans(6, init=lambda data, k, random_state: data[: k - 1]).fit(x)


def test_a_sparse_matrix_is_clustered_as_its_dense_twin():
    from scipy import sparse

    x, _ = _blobs()
    x[np.abs(x) < 2] = 0  # (mostly zeros, as sparse data are)
    init = x[:6].copy()
    dense = KMeans(6, init=init, n_init=1).fit(x)
    csr = KMeans(6, init=init, n_init=1).fit(sparse.csr_matrix(x))
    np.testing.assert_array_equal(dense.labels_, csr.labels_)
    np.testing.assert_allclose(dense.cluster_centers_, csr.cluster_centers_)
    np.testing.assert_array_equal(csr.predict(sparse.csr_matrix(x[:50])), dense.predict(x[:50]))


def test_a_sparse_matrix_too_large_to_make_dense_is_refused_in_one_line(monkeypatch):
    from scipy import sparse

    from dlscale.kmeans import sparse_input

    x = sparse.random(10_000, 1_000, density=0.001, format="csr", random_state=0)  # 80 MB dense, twice while fitting
    monkeypatch.setattr(sparse_input, "available_memory", lambda: 100 * 2**20)
    with pytest.raises(KMeansError, match=r"10,000 × 1,000 is made dense .*\(0\.1 GiB .*0\.1 GiB free.*TruncatedSVD"):
        KMeans(4, n_init=1).fit(x)
    monkeypatch.setattr(sparse_input, "available_memory", lambda: 200 * 2**20)
    assert KMeans(4, n_init=1, max_iter=2).fit(x).cluster_centers_.shape == (4, 1_000)
