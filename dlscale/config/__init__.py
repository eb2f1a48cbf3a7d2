"""The training configuration: :class:`TrainConfig`, the shipped YAML configs (``configs/``), overrides.

``load_config("demo", ["epochs=2"])`` is how the CLI, a notebook and a Slurm script all
build a config (:mod:`~dlscale.config.train_config`). The config keys are public API.
"""

from dlscale.config.train_config import (
    CONFIG_DIR,
    FIELDS,
    ConfigError,
    TrainConfig,
    config_names,
    describe_field,
    load_config,
    parse_overrides,
)

__all__ = ["CONFIG_DIR", "FIELDS", "ConfigError", "TrainConfig", "config_names", "describe_field", "load_config",
           "parse_overrides"]
