"""scikit-learn's own K-Means tests, run against dlscale's KMeans with only the import changed.

The installed scikit-learn's ``sklearn/cluster/tests/test_k_means.py`` is copied, its ``from sklearn.cluster import
KMeans`` made to import ``dlscale.kmeans.KMeans``, and run by pytest in a process of its own, with the two fixtures
scikit-learn's conftest gives (``global_random_seed``, ``global_dtype``). MiniBatchKMeans's tests are left out (it is
scikit-learn's own). The tests that fail are exactly the ones declared below, each with why: they read
scikit-learn's private methods, which a drop-in need not copy. (Its ``_n_init``, which two tests read, is kept: it is
one line.)
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

sklearn = pytest.importorskip("sklearn")

SUITE = Path(sklearn.__file__).parent / "cluster" / "tests" / "test_k_means.py"
IMPORT = "from sklearn.cluster import KMeans, MiniBatchKMeans, k_means, kmeans_plusplus"

FIXTURES = """
import numpy as np
import pytest


@pytest.fixture
def global_random_seed():
    return 42


@pytest.fixture(params=[np.float32, np.float64])
def global_dtype(request):
    return request.param
"""

#: The tests of that file this estimator fails on purpose, by name (all their parameters), with the reason.
DECLARED = {
    "test_sample_weight_init": "calls scikit-learn's private KMeans._init_centroids (the seeding is tested here by "
    "test_kmeans.py against scikit-learn's kmeans_plusplus)",
    "test_sample_weight_zero": "calls scikit-learn's private KMeans._init_centroids",
}


@pytest.mark.skipif(not SUITE.is_file(), reason="this scikit-learn was installed without its tests")
def test_scikit_learns_own_kmeans_tests_pass_but_those_declared(tmp_path):
    source = SUITE.read_text()
    assert IMPORT in source, f"{SUITE}: its KMeans import changed; update IMPORT"
    (tmp_path / "test_k_means.py").write_text(
        source.replace(
            IMPORT,
            "from sklearn.cluster import MiniBatchKMeans, k_means, kmeans_plusplus\nfrom dlscale.kmeans import KMeans",
        )
    )
    (tmp_path / "conftest.py").write_text(FIXTURES)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-k",
            "not MiniBatch and not minibatch",
            "-rf",
            "-W",
            "ignore",
            "test_k_means.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    failed = sorted(set(re.findall(r"^FAILED test_k_means.py::(\w+)", done.stdout, re.MULTILINE)))
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) > 150, done.stdout[-3000:]
    assert failed == sorted(DECLARED), done.stdout[-6000:]
