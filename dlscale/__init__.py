"""dlscale: deep learning at scale on HPC systems, for teaching and for real runs.

One engine behind the notebooks, the CLI and the Slurm scripts. The public API:

- ``from dlscale.train import train, train_quietly, Result``: ``train(cfg) -> Result``, the one
  training loop; ``python -m dlscale.train [CONFIG] [key=value ...]`` runs it from a batch script;
- ``dlscale.kmeans.KMeans``: K-Means as a scikit-learn estimator, on one process or many ranks;
- the ``dlscale`` command (``python -m dlscale``);
- the config keys of ``dlscale.config.TrainConfig`` and the shipped configs (``load_config``).

Everything else lives in layered subpackages (``docs/architecture.md``): ``config``,
``runtime``, ``distributed``, ``data``, ``models``, ``optim``, ``checkpoint``, ``metrics``,
``profiling``, ``reporting``, ``training``, ``cluster``, ``bench``, ``kmeans``, ``lessons``.
Submodules are imported on use, so ``import dlscale`` stays quick and needs none of the
optional extras.
"""

__version__ = "0.1.0"
