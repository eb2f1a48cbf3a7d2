"""``KMeans``: distributed K-Means that scikit-learn accepts as one of its own.

The class is built on scikit-learn's ``BaseEstimator``, ``ClusterMixin`` and
``TransformerMixin``, so ``clone``, ``Pipeline``, ``GridSearchCV`` and ``check_estimator``
work on it, and its input checks are scikit-learn's (``validate_data``). The fitting is
done by one of two engines: :mod:`~dlscale.kmeans.lloyd` (torch, CPUs and GPUs, one process
or a ``torch.distributed`` job) or :mod:`~dlscale.kmeans.daal` (oneDAL's SPMD K-Means under
``mpirun``). Scikit-learn is the ``kmeans`` extra: without it this module raises one
:class:`~dlscale.kmeans.KMeansError` naming the extra, and the rest of the package imports.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Iterator
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from dlscale import distributed
from dlscale.distributed import group_size
from dlscale.errors import import_optional
from dlscale.kmeans import daal, sparse_input
from dlscale.kmeans.backend import BACKENDS, resolve_backend
from dlscale.kmeans.compiled_scoring import free_cpus_for_a_fit
from dlscale.kmeans.errors import KMeansError
from dlscale.kmeans.initialization import kmeans_parallel, kmeans_plusplus, random_init
from dlscale.kmeans.lloyd import centred, default_chunk_size, global_mean, lloyd, mean_variance, say_on_first_rank
from dlscale.kmeans.result import KMeansFit, timings
from dlscale.kmeans.scoring import assign
from dlscale.runtime.devices import resolve_device

import_optional("sklearn", "kmeans", "dlscale.kmeans.KMeans", KMeansError)

from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.utils import check_random_state  # noqa: E402
from sklearn.utils._param_validation import Interval, StrOptions  # noqa: E402
from sklearn.utils.validation import _check_sample_weight, check_array, check_is_fitted, validate_data  # noqa: E402

__all__ = ["KMeans", "EXPECTED_FAILED_CHECKS", "resolve_backend"]

#: scikit-learn has no public check of sample weights; its helper gained ``allow_all_zero_weights`` in 1.8, and
#: before that accepted all-zero weights without a word (checked on 1.6.0, 1.7.2 and 1.9.1).
_CHECKS_ZERO_WEIGHTS = "allow_all_zero_weights" in inspect.signature(_check_sample_weight).parameters

#: The scikit-learn estimator checks this estimator fails on purpose, with the reason
#: (pass it to ``check_estimator(..., expected_failed_checks=...)``). scikit-learn's own
#: ``KMeans`` declares the same one.
EXPECTED_FAILED_CHECKS = {
    "check_sample_weight_equivalence_on_dense_data": (
        "a weight of 2 is not the same as a repeated row for the random initialisation: the seeding draws "
        "from n rows instead of n + 1, so the initial centres differ (scikit-learn's KMeans declares the same); "
        "from the same initial centres the weighted fit is exact (tests/unit/test_kmeans.py)"
    ),
    "check_sample_weight_equivalence_on_sparse_data": (
        "the same check on a sparse copy of the data, which is made dense and fitted as above (scikit-learn's "
        "KMeans declares it too)"
    ),
}


class KMeans(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """K-Means clustering, in one process or data-parallel over the ranks of a job.

    Lloyd's algorithm with scikit-learn's semantics and interface. When ``torch.distributed``
    is initialised (``torchrun``, ``srun``), each rank passes **its own shard** of the data
    and every rank ends with the same centres; under ``mpirun`` without a process group the
    daal4py engine joins the ranks through MPI.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters (centres).
    init : {"k-means++", "k-means||", "random"}, callable or array-like of shape (n_clusters, n_features), \
default="k-means++"
        How the initial centres are chosen. ``"k-means++"`` is scikit-learn's greedy
        k-means++ in one process and runs as its distributed form, k-means|| (Bahmani et al.
        2012), over several ranks. ``"random"`` draws rows. All three follow ``sample_weight``.
        A callable is called as scikit-learn calls it, ``init(X, n_clusters, random_state)``, with the data
        centred on its mean (on the first rank's shard over several ranks, whose centres every rank then takes).
    n_init : "auto" or int, default="auto"
        Runs from different initial centres; the one of lowest inertia is kept. ``"auto"`` is
        1 for ``"k-means++"``, ``"k-means||"`` and an array, and 10 for ``"random"`` and a callable.
    max_iter : int, default=300
        Lloyd iterations at most, per run.
    tol : float, default=1e-4
        Stop when the squared shift of the centres is at most ``tol`` times the mean variance
        of the features (over all ranks' data). With ``tol=0`` only a pass that changes no
        label stops it.
    verbose : int, default=0
        With 1 or more, print "Initialization complete", each iteration's inertia and why the fit stopped, as
        scikit-learn does (on the first rank; each printed inertia costs one more scoring pass).
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation (the same seed gives the same centres on every rank).
    copy_x : bool, default=True
        scikit-learn's: whether the data may be centred in place. The data are never changed here (the engine
        centres a copy it needs anyway for the device), so ``False`` is accepted and changes nothing.
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        scikit-learn's choice of iteration. Both run Lloyd's iterations and give its results, as scikit-learn's
        two do; on CPUs each pass skips the rows whose centre cannot have changed by Hamerly's bounds (one lower
        bound per row, where Elkan keeps k), and on GPUs each pass scores every row.
    backend : {"auto", "torch", "daal4py"}, default="auto"
        The engine. ``"auto"`` takes daal4py for ranks started by ``mpirun`` without a torch
        process group, and torch everywhere else.
    device : str or None, default=None
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` for the torch engine; None picks CUDA when present.
    chunk_size : int or None, default=None
        Rows scored at a time; None sizes the chunk's distance block for the cache (CPUs) or
        to 256 MiB (GPUs). Results do not depend on it.
    n_local_trials : int or None, default=None
        Candidates per step of k-means++ (None: ``2 + log(n_clusters)``, as scikit-learn).
    oversampling : float or None, default=None
        Candidates drawn per round of k-means|| (None: ``2 * n_clusters``).
    rounds : int, default=5
        Rounds of k-means||.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        The centres, identical on every rank, in the dtype of the data (float32 or float64).
    labels_ : ndarray of shape (n_samples,)
        The cluster of each of this rank's samples.
    inertia_ : float
        Weighted sum of squared distances of the samples to their centres, over all ranks.
    n_iter_ : int
        Lloyd iterations of the kept run.
    n_features_in_ : int
        Number of features seen in ``fit``.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names, when ``X`` had string column names (a DataFrame).
    backend_ : str
        The engine that ran (``"torch"`` or ``"daal4py"``).
    timings_ : dict
        Seconds of the kept fit: ``init``, ``iterations``, ``per_iteration`` and ``total``.
    pass_ : str
        The pass the fit ran (on CPUs with numba, chosen per pass from counted work; the one that ran most passes):
        ``"compiled"`` (Hamerly's bounds, scoring and sums in one compiled loop), ``"blas"`` (every row scored by
        a GEMM, with the compiled pass's labels and sums: faster at many features on many CPUs), ``"gemm"`` (every
        row scored by a GEMM, the sums by a one-hot GEMM: GPUs, or CPUs without numba) or ``"daal4py"``. The
        choice never changes the result.
    threads_ : int
        torch's threads during the fit, which the compiled loops and the BLAS pass follow: on a CPU, one for each CPU
        of the process free at the fit's start (``OMP_NUM_THREADS``, Slurm's CPUs per task and a lower
        ``torch.set_num_threads`` stand); torch's count is put back after. The compiled loops' sums are split in the
        same parts whatever the count.

    See Also
    --------
    sklearn.cluster.KMeans : the single-process estimator whose results this one reproduces.

    Notes
    -----
    From the same initial centres (and weights) the torch engine returns scikit-learn's labels,
    centres (to float rounding), inertia and number of iterations. On CPUs it skips the rows
    whose centre cannot have changed (Hamerly's bounds, with a margin for rounding), so the
    labels are those of a full argmin. The daal4py engine takes no ``sample_weight`` (oneDAL's
    K-Means has no weights input) and stops on oneDAL's own criterion.

    ``check_estimator`` passes except for :data:`EXPECTED_FAILED_CHECKS`:
    ``check_sample_weight_equivalence_on_dense_data`` and ``..._on_sparse_data``, which scikit-learn's ``KMeans``
    also declares (a weight of 2 changes the random draw of the initial centres, not the fit). A sparse (CSR)
    ``X`` is made dense once (n × d in its dtype, held twice while fitting), when that fits in the memory free: every
    pass reads whole rows (:mod:`~dlscale.kmeans.sparse_input` says why).

    Examples
    --------
    >>> import numpy as np
    >>> from dlscale.kmeans import KMeans
    >>> X = np.array([[1.0, 2.0], [1.0, 4.0], [1.0, 0.0], [10.0, 2.0], [10.0, 4.0], [10.0, 0.0]])
    >>> model = KMeans(n_clusters=2, random_state=0, device="cpu").fit(X)
    >>> sorted(model.cluster_centers_.tolist())
    [[1.0, 2.0], [10.0, 2.0]]
    >>> bool(model.predict([[0.0, 0.0]])[0] == model.predict([[2.0, 3.0]])[0])
    True
    >>> float(model.inertia_)
    16.0
    >>> weighted = KMeans(n_clusters=2, random_state=0, device="cpu").fit(X, sample_weight=[1, 2, 1, 1, 1, 1])
    >>> sorted(weighted.cluster_centers_.tolist())[0]
    [1.0, 2.5]
    """

    _parameter_constraints: dict = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "init": [StrOptions({"k-means++", "k-means||", "random"}), callable, "array-like"],
        "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "copy_x": ["boolean"],
        "algorithm": [StrOptions({"lloyd", "elkan"})],
        "backend": [StrOptions(set(BACKENDS))],
        "device": [str, torch.device, None],
        "chunk_size": [Interval(Integral, 1, None, closed="left"), None],
        "n_local_trials": [Interval(Integral, 1, None, closed="left"), None],
        "oversampling": [Interval(Real, 0, None, closed="neither"), None],
        "rounds": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: str | Any = "k-means++",
        n_init: str | int = "auto",
        max_iter: int = 300,
        tol: float = 1e-4,
        verbose: int = 0,
        random_state: Any = None,
        copy_x: bool = True,
        algorithm: str = "lloyd",
        backend: str = "auto",
        device: str | None = None,
        chunk_size: int | None = None,
        n_local_trials: int | None = None,
        oversampling: float | None = None,
        rounds: int = 5,
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.backend = backend
        self.device = device
        self.chunk_size = chunk_size
        self.n_local_trials = n_local_trials
        self.oversampling = oversampling
        self.rounds = rounds

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.sparse = True  # (CSR, made dense once)
        return tags

    # -- fitting ----------------------------------------------------------------------------------

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Cluster ``X`` (this rank's shard when a process group exists).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            float32 and float64 are kept; other numbers become float64. A tensor is used
            where it is (a CUDA tensor is not copied to the host).
        y : ignored
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weight of each sample (None: all 1).

        Returns
        -------
        self : KMeans
        """
        self._validate_params()
        device = resolve_device(self.device, KMeansError)
        self.backend_ = resolve_backend(self.backend, device)
        x = self._check_data(X, device, reset=True)
        weights = self._check_weights(sample_weight, X, x)
        if weights is not None and self.backend_ == "daal4py":
            raise KMeansError(
                "backend='daal4py' takes no sample_weight (oneDAL's K-Means has no weights input): "
                "use backend='torch' (under torchrun or srun for several ranks)"
            )
        if callable(self.init) and self.backend_ == "daal4py":
            raise KMeansError(
                "backend='daal4py' takes no callable init (oneDAL seeds itself or takes an array): "
                "pass its centres as an array, or use backend='torch'"
            )
        rows = torch.tensor([float(len(x))], dtype=torch.float64, device=x.device)
        n_total = int(distributed.all_reduce_sum(rows)[0])
        if n_total < self.n_clusters:
            raise KMeansError(
                f"n_samples={n_total} should be >= n_clusters={self.n_clusters}: ask for fewer "
                "clusters or give more samples"
            )
        if group_size() > 1 and len(x) == 0:
            raise KMeansError("this rank's shard is empty: give every rank at least one sample")
        if self.algorithm == "elkan" and self.n_clusters == 1:
            warnings.warn(
                "algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._n_init = self._n_runs()  # (scikit-learn's name for it, which its own tests read)
        init, seeds = self._checked_init(x), self._seeds(self._n_init)
        with free_cpus_for_a_fit(x.device) as self.threads_:
            runs = (
                self._runs_daal4py(x, init, seeds)
                if self.backend_ == "daal4py"
                else self._runs_torch(x, weights, init, seeds, n_total)
            )
            best = min(runs, key=lambda run: run.inertia)  # the first of equals, as scikit-learn keeps
        self.cluster_centers_, self.labels_ = best.cluster_centers, best.labels
        self.inertia_, self.n_iter_, self.timings_, self.pass_ = best.inertia, best.n_iter, best.timings, best.pass_name
        self._n_features_out = self.n_clusters
        distinct = int(np.count_nonzero(np.bincount(self.labels_, minlength=self.n_clusters)))
        if group_size() <= 1 and distinct < self.n_clusters:
            warnings.warn(
                f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                f"({self.n_clusters}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit, and return the cluster of each sample (``labels_``)."""
        return self.fit(X, sample_weight=sample_weight).labels_

    # -- using the centres (local: no communication) ----------------------------------------------

    def predict(self, X: Any) -> np.ndarray:
        """The closest centre of each row of ``X``."""
        x, centers = self._fitted_inputs(X)
        labels, _ = assign(x, centers, self._chunk(x))
        return labels.cpu().numpy()

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distances from each row of ``X`` to every centre (n × k: use on modest ``X``)."""
        x, centers = self._fitted_inputs(X)
        return torch.cdist(x, centers).cpu().numpy()

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Minus the (weighted) inertia of ``X`` against the fitted centres (scikit-learn's convention)."""
        x, centers = self._fitted_inputs(X)
        weights = self._check_weights(sample_weight, X, x)
        _, inertia = assign(x, centers, self._chunk(x), weights)
        return -inertia

    # -- internals --------------------------------------------------------------------------------

    def _check_data(self, X: Any, device: torch.device, reset: bool) -> torch.Tensor:
        """scikit-learn's validation for arrays, lists and DataFrames; the same rules for a tensor, in place."""
        if not isinstance(X, torch.Tensor):
            array = validate_data(
                self,
                X,
                reset=reset,
                dtype=[np.float64, np.float32],
                order="C",
                accept_sparse="csr",
                ensure_min_samples=0 if group_size() > 1 else 1,
            )
            if hasattr(array, "toarray"):  # sparse: made dense once, if it fits (sparse_input says why)
                array = sparse_input.dense(array)
            return torch.from_numpy(array).to(device)
        x = X.detach().to(device)
        if x.ndim != 2:
            raise KMeansError(f"Expected 2D array, got a tensor of shape {tuple(x.shape)}: pass samples × features")
        if x.dtype not in (torch.float32, torch.float64):
            x = x.double()
        # (the smallest and largest values are NaN or infinite if any is: no temporary of the data's size)
        if x.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):
            raise KMeansError("Input X contains NaN or infinity: drop or impute those rows first")
        if reset:
            self.n_features_in_ = x.shape[1]
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        elif x.shape[1] != self.n_features_in_:
            raise KMeansError(
                f"X has {x.shape[1]} features, but KMeans is expecting {self.n_features_in_} features as input."
            )
        return x.contiguous()

    def _check_weights(self, sample_weight: Any, X: Any, x: torch.Tensor) -> torch.Tensor | None:
        """float64 weights on ``x``'s device, or None when all are 1."""
        if sample_weight is None:
            return None
        if isinstance(X, torch.Tensor):  # scikit-learn's check only needs the number of rows from X
            X = np.empty((len(x), 0))
        shard = group_size() > 1  # (one rank's shard may weigh nothing at all; the whole data set may not)
        weights = _check_sample_weight(
            sample_weight,
            X,
            dtype=np.float64,
            ensure_non_negative=True,
            **({"allow_all_zero_weights": shard} if _CHECKS_ZERO_WEIGHTS else {}),
        )
        if not shard and not weights.any():  # (what scikit-learn >= 1.8 says; before, its helper let it through)
            raise ValueError("Sample weights must contain at least one non-zero number.")
        return torch.from_numpy(weights).to(x.device)

    def _fitted_inputs(self, X: Any) -> tuple[torch.Tensor, torch.Tensor]:
        check_is_fitted(self)
        centers = torch.from_numpy(self.cluster_centers_).to(resolve_device(self.device, KMeansError))
        return self._check_data(X, centers.device, reset=False).to(centers.dtype), centers

    def _chunk(self, x: torch.Tensor) -> int:
        return self.chunk_size or default_chunk_size(self.n_clusters, x.element_size(), x.device, x.shape[1])

    def _n_runs(self) -> int:
        explicit = not isinstance(self.init, str) and not callable(self.init)
        if self.n_init == "auto":  # (as scikit-learn: one run from a good seeding or given centres, else 10)
            return 1 if explicit or self.init in ("k-means++", "k-means||") else 10
        if explicit and self.n_init != 1:
            warnings.warn(
                f"Explicit initial center position passed: performing only one init in KMeans instead "
                f"of n_init={self.n_init}.",
                RuntimeWarning,
                stacklevel=3,
            )
            return 1
        return self.n_init

    def _seeds(self, runs: int) -> list[int]:
        """One seed per run, drawn from ``random_state`` on rank 0 and the same on every rank."""
        rng = check_random_state(self.random_state)
        seeds = [int(rng.randint(np.iinfo(np.int32).max)) for _ in range(runs)]
        return distributed.broadcast_object(seeds) if group_size() > 1 else seeds

    def _checked_init(self, x: torch.Tensor) -> str | np.ndarray:
        """``init`` as given, or as an array of the data's dtype whose shape fits ``n_clusters`` and ``x``."""
        if isinstance(self.init, str) or callable(self.init):
            return self.init
        return self._checked_centers(self.init, x)

    def _checked_centers(self, given: Any, x: torch.Tensor) -> np.ndarray:
        """Initial centres given as an array or returned by a callable ``init``, in the data's dtype, of the right
        shape."""
        centers = check_array(given, dtype=np.float32 if x.dtype == torch.float32 else np.float64, copy=True)
        if centers.shape[0] != self.n_clusters:
            raise KMeansError(
                f"The shape of the initial centers {centers.shape} does not match the number "
                f"of clusters {self.n_clusters}."
            )
        if centers.shape[1] != x.shape[1]:
            raise KMeansError(
                f"The shape of the initial centers {centers.shape} does not match the number "
                f"of features of the data {x.shape[1]}."
            )
        return centers

    def _initial_centers(
        self, x: torch.Tensor, weights: torch.Tensor | None, init: str | np.ndarray | Any, seed: int, mean: torch.Tensor
    ) -> torch.Tensor:
        """Starting centres for the mean-centred rows ``x`` (an explicit ``init`` is centred the same way)."""
        k = self.n_clusters
        if callable(init):
            return self._called_init(init, x, seed)
        if not isinstance(init, str):
            return torch.from_numpy(init).to(device=x.device, dtype=x.dtype) - mean
        generator = torch.Generator().manual_seed(seed)
        if init == "random":
            return random_init(x, k, generator, weights)
        if init == "k-means||" or group_size() > 1:
            return kmeans_parallel(
                x, k, generator, self._chunk(x), oversampling=self.oversampling, rounds=self.rounds, weights=weights
            )
        return kmeans_plusplus(x, k, generator, self.n_local_trials, weights)

    def _called_init(self, init: Any, x: torch.Tensor, seed: int) -> torch.Tensor:
        """A callable ``init``'s centres for the centred rows ``x``: the first rank's, on every rank."""
        centers: np.ndarray | str | None = None
        failure = None
        if distributed.rank() == 0:
            try:
                called = init(x.cpu().numpy(), self.n_clusters, random_state=np.random.RandomState(seed))
                centers = self._checked_centers(called, x)
            except Exception as err:  # (said to the other ranks before it is raised, so that none waits for it)
                failure, centers = err, f"{type(err).__name__}: {err}"
        if group_size() > 1:
            centers = distributed.broadcast_object(centers)
        if failure is not None:
            raise failure
        if isinstance(centers, str):
            raise KMeansError(f"the callable init failed on the first rank ({centers}): fix it there")
        return torch.from_numpy(centers).to(device=x.device, dtype=x.dtype)

    def _runs_torch(
        self, x: torch.Tensor, weights: torch.Tensor | None, init: str | np.ndarray, seeds: list[int], n_total: int
    ) -> Iterator[KMeansFit]:
        """One torch fit per seed."""
        chunk = self._chunk(x)
        mean = global_mean(x, n_total, chunk)
        threshold = self.tol * mean_variance(x, mean, n_total, chunk) if self.tol > 0 else 0.0
        # As scikit-learn: subtract the mean, so that ‖x‖² − 2·x·c + ‖c‖² loses fewer digits.
        mean = mean.to(x.dtype)
        x = centred(x, mean)
        for seed in seeds:
            started = time.perf_counter()
            centers = self._initial_centers(x, weights, init, seed, mean)
            init_seconds = time.perf_counter() - started
            if self.verbose:
                say_on_first_rank("Initialization complete")
            run = lloyd(x, weights, centers, self.max_iter, threshold, chunk, verbose=bool(self.verbose))
            yield KMeansFit(
                (run.centers + mean).cpu().numpy(),
                run.labels.cpu().numpy(),
                run.inertia,
                run.n_iter,
                timings(init_seconds, run.seconds, run.n_iter),
                run.pass_name,
            )

    def _runs_daal4py(self, x: torch.Tensor, init: str | np.ndarray, seeds: list[int]) -> Iterator[KMeansFit]:
        """One oneDAL fit per seed."""
        for seed in seeds:
            yield daal.fit_daal4py(x.cpu().numpy(), self.n_clusters, init, self.max_iter, self.tol, seed)
