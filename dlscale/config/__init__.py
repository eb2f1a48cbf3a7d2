"""The training configuration: :class:`TrainConfig`, the shipped YAML configs (``configs/``), overrides.

``load_config("demo", ["epochs=2"])`` is how the CLI, a notebook and a Slurm script all
build a config (:mod:`~dlscale.config.train_config`). The config keys are public API. The keys are
flat on the command line and in the files, and grouped in sections in the code (``cfg.sections.model``,
``SECTION_KEYS``): each builder is given only its own.
"""

from dlscale.config.train_config import (
    CONFIG_DIR,
    FIELDS,
    SECTION_KEYS,
    SECTIONS,
    ConfigError,
    Sections,
    TrainConfig,
    config_names,
    describe_field,
    load_config,
    parse_overrides,
)

__all__ = [
    "CONFIG_DIR",
    "FIELDS",
    "SECTIONS",
    "SECTION_KEYS",
    "ConfigError",
    "Sections",
    "TrainConfig",
    "config_names",
    "describe_field",
    "load_config",
    "parse_overrides",
]
