"""dlscale: deep learning at scale on HPC systems, for teaching and for real runs.

One engine behind the notebooks, the CLI and the Slurm scripts. The public API:

- ``from dlscale.train import train, train_quietly, Result``: ``train(cfg) -> Result``, the one
  training loop; ``python -m dlscale.train [CONFIG] [key=value ...]`` runs it from a batch script;
- ``dlscale.kmeans.KMeans``: K-Means as a scikit-learn estimator, on one process or many ranks;
- the ``dlscale`` command (``python -m dlscale``);
- the config keys of ``dlscale.config.TrainConfig`` and the shipped configs (``load_config``).

Everything else lives in subpackages in six tiers, each importing only from the tiers below it
(import-linter's contract in ``pyproject.toml``; ``docs/architecture.md`` says what each owns):

1. ways in: ``lab`` ``__main__`` ``train`` ``cli``
2. the lessons: ``lessons``
3. studies and jobs: ``bench`` ``scaling`` ``hpo`` ``kmeans`` ``jobs``
4. the engine: ``training`` ``reporting`` ``profiling``
5. the parts: ``metrics`` ``checkpoint`` ``optim`` ``models`` ``data`` ``distributed``
6. the base: ``runtime`` ``config`` ``errors``

Submodules are imported on use, so ``import dlscale`` stays quick and needs none of the
optional extras.
"""

__version__ = "0.1.0"
