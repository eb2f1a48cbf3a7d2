"""Optimizers and learning-rate schedules.

- :mod:`~dlscale.optim.factory`: parameter groups with the usual weight-decay exemptions, and
  ``build_optimizer`` (the ``optimizer=`` config key);
- :mod:`~dlscale.optim.layerwise`: LARS (with LARC as its clip mode) and LAMB, correct where
  ranks hold shards;
- :mod:`~dlscale.optim.schedules`: LR scaling rules and warmup (lesson 07).
"""

from dlscale.optim.layerwise import LAMB, LARS

__all__ = ["LAMB", "LARS"]
