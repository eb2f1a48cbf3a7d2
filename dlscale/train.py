"""The training entry point: ``from dlscale.train import train, train_quietly`` and ``python -m dlscale.train``.

``train(cfg) -> Result`` is the one training loop (:mod:`dlscale.training`); every lesson,
benchmark and batch script runs it. ``python -m dlscale.train [CONFIG] [key=value ...]`` is
``dlscale train`` (what every Slurm script runs).
"""

from dlscale.training.loop import train, train_quietly
from dlscale.training.result import Result

__all__ = ["Result", "train", "train_quietly"]

if __name__ == "__main__":
    import sys

    from dlscale.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
