"""dlscale: deep learning at scale on HPC systems, for teaching and for real runs.

One engine behind the notebooks, the CLI and the Slurm scripts. Submodules are imported
on use (``dlscale.train``, ``dlscale.data``, ...), so ``import dlscale`` stays quick and
needs none of the optional extras.
"""

__version__ = "0.1.0"
