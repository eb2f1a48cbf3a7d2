"""KMeans as a scikit-learn estimator: the tests that launch ranks, engines or runs beside them
(tests/unit/test_kmeans_estimator.py
has the rest)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.cluster import KMeans as SklearnKMeans

from tests.unit.test_kmeans_estimator import _blobs

from ..conftest import run_cli

CHECKS = """
import json, warnings
from sklearn.utils.estimator_checks import check_estimator
from dlscale.kmeans import KMeans
from dlscale.kmeans.estimator import EXPECTED_FAILED_CHECKS
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    results = check_estimator(KMeans(device="cpu"), on_fail=None, expected_failed_checks=EXPECTED_FAILED_CHECKS)
print(json.dumps([{"check": r["check_name"], "status": r["status"], "error": repr(r["exception"])[:500]}
                  for r in results]))
"""


def test_check_estimator_passes_every_check_but_the_declared_ones():
    # A fresh process: SCIPY_ARRAY_API must be set before scipy is imported, or the array-API check is skipped.
    done = subprocess.run(
        [sys.executable, "-c", CHECKS],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SCIPY_ARRAY_API": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    from dlscale.kmeans.estimator import EXPECTED_FAILED_CHECKS

    assert len(results) >= 50  # the whole list ran: API, legacy, clustering, transformer and array-API checks
    unexpected = [r for r in results if r["status"] not in ("passed", "xfail")]
    assert not unexpected, unexpected  # no failure and no skip
    declared = {r["check"]: r["status"] for r in results if r["check"] in EXPECTED_FAILED_CHECKS}
    # every declared failure is real (a check that started passing would leave a stale declaration)
    assert declared == {name: "xfail" for name in EXPECTED_FAILED_CHECKS}


def test_without_numba_the_cpu_rescores_every_row_and_asking_for_bounds_names_the_extra():
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import torch\n"
        "from dlscale.kmeans.lloyd import lloyd\n"
        "from dlscale.kmeans.errors import KMeansError\n"
        "x = torch.randn(3000, 4, generator=torch.Generator().manual_seed(0))\n"
        "fit = lloyd(x, None, x[:5].clone(), 50, 0.0, 512)\n"
        "print(fit.rows_scored == len(x) * (fit.n_iter + 1) or fit.rows_scored == len(x) * fit.n_iter)\n"
        "try:\n    lloyd(x, None, x[:5].clone(), 50, 0.0, 512, skip_rows=True)\n"
        "except KMeansError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    every_row, message = done.stdout.splitlines()
    assert every_row == "True"
    assert "Hamerly's bounds needs numba" in message and "pip install -e '.[kmeans]' in the dlscale folder" in message


def test_two_gloo_ranks_with_weights_equal_one_process(in_tmp):
    from dlscale.jobs.local_ranks import torchrun_command

    x, _ = _blobs(4000, 5, 6, seed=8)
    weights = np.random.default_rng(1).uniform(0, 2, len(x))
    np.save(in_tmp / "data.npy", x)
    np.save(in_tmp / "weights.npy", weights)
    np.save(in_tmp / "init.npy", x[:6])
    args = [
        "kmeans",
        "--input",
        "data.npy",
        "--sample-weight",
        "weights.npy",
        "--k",
        "6",
        "--init",
        "init.npy",
        "--backend",
        "torch",
        "--device",
        "cpu",
        "--tol",
        "0",
    ]
    one = run_cli(*args, "--out", "one", cwd=in_tmp)
    assert one.returncode == 0, one.stderr[-2000:]
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    two = subprocess.run(
        torchrun_command(2, ["dlscale", *args, "--out", "two"]),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=in_tmp,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    reference = SklearnKMeans(6, init=x[:6], n_init=1, tol=0).fit(x, sample_weight=weights)
    np.testing.assert_allclose(np.load(in_tmp / "two/centers.npy"), reference.cluster_centers_, rtol=1e-9, atol=1e-9)
    labels = np.concatenate([np.load(in_tmp / f"two/labels_rank{r}.npy") for r in range(2)])
    assert np.array_equal(labels, reference.labels_)
    summary = json.loads((in_tmp / "two/summary.json").read_text())
    assert summary["inertia"] == pytest.approx(reference.inertia_, rel=1e-9)
    wrong = run_cli(
        "kmeans", "--input", "data.npy", "--sample-weight", "init.npy", "--k", "6", "--out", "bad", cwd=in_tmp
    )
    assert wrong.returncode == 2 and "one weight per sample" in wrong.stderr and "Traceback" not in wrong.stderr


UNLIKE_COMPILE_AHEAD = """
import numpy as np, scipy.sparse
from dlscale.kmeans import KMeans, compiled
rng = np.random.default_rng(1)
photo = rng.integers(0, 256, size=(30000, 3)).astype(np.uint8)  # a photo's colours, as lesson 08 fits them
model = KMeans(16, random_state=0).fit(photo)
model.predict(photo.astype(np.float64)), model.transform(photo[:10]), model.score(photo)
wide = rng.normal(size=(3000, 128))
KMeans(40, n_init=2, random_state=0).fit(wide, sample_weight=rng.random(3000)).fit_predict(wide)
KMeans(5, init="random", random_state=0, max_iter=50).fit(scipy.sparse.random(500, 20, density=0.1, format="csr",
                                                                             random_state=0))
print(sum(sum(f.stats.cache_misses.values()) for f in vars(compiled).values() if hasattr(f, "stats")))
"""


def test_after_compile_ahead_a_fit_of_any_kind_compiles_nothing():
    """`make setup-dev` compiles the loops once (python -m dlscale.kmeans.compile_ahead): every later process loads
    them from numba's cache, whatever its data (a photo's colours, 128 features weighted, sparse), instead of
    spending ~20 s compiling."""
    ahead = subprocess.run(
        [sys.executable, "-m", "dlscale.kmeans.compile_ahead"], capture_output=True, text=True, timeout=600
    )
    assert ahead.returncode == 0 and "in numba's cache" in ahead.stdout, ahead.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", UNLIKE_COMPILE_AHEAD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "0"  # no loop compiled in this process
