"""Hyperparameter search on the one engine, with Optuna (the ``hpo`` extra).

- :mod:`~dlscale.hpo.space`: the search space in YAML, checked before any trial runs;
- :mod:`~dlscale.hpo.study`: a study's folder, its settings and its shared storage (a journal file by default);
- :mod:`~dlscale.hpo.worker`: ask, train (with pruning through the engine's stop path), tell;
- :mod:`~dlscale.hpo.heartbeat`: a dead worker's trial failed and retried;
- :mod:`~dlscale.hpo.local_search`, :mod:`~dlscale.hpo.results`: workers on this machine; tables and plots.

Optuna is imported only when a study is opened, so the package imports without it.
"""

from dlscale.hpo.space import Parameter, SearchSpace, SearchSpaceError, load_space, space_names
from dlscale.hpo.study import StudyError, StudySettings, create_study, open_study, read_settings

__all__ = [
    "Parameter",
    "SearchSpace",
    "SearchSpaceError",
    "StudyError",
    "StudySettings",
    "create_study",
    "load_space",
    "open_study",
    "read_settings",
    "space_names",
]
