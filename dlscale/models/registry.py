"""Which model a config's ``model`` names, and how to build it: the kit's two and any added with :func:`register_model`.

A model brings everything the rest of the kit needs to know about it, so that adding one touches
``models/`` alone (or the user's own module):

- a ``build(model, input_shape, num_outputs, seed)`` function, registered here under its config name. It is given
  the config's model section only (``cfg.sections.model``: ``model``, ``width``, ``depth``...), the shape of one
  sample (channels, height, width) and the run's seed;
- on the model class, optionally, ``parallel_units()``: the submodules that FSDP shards one at a
  time and tensor parallelism splits (a transformer's blocks), and ``tensor_parallel_plan``: for
  each submodule path inside a unit, ``"colwise"`` or ``"rowwise"``. ``distributed/`` reads these
  and knows no attribute name of any model;
- ``meta_init``: whether a sharded run may build it on the meta device, shard it, then allocate
  its shards (``to_empty``) and initialise them with its ``init_weights(seed)``, as the ViT does;
- for pipeline parallelism, ``pipeline_stage(blocks, first, last)``: a module of those units (with the input
  layers if ``first``, the output layers if ``last``) whose parameters keep the whole model's names and whose
  ``init_weights(seed)`` draws the whole model's values, and ``together(stages)`` on its class (a rank's stages as
  one module), as the ViT's ``ViTStage`` gives (:mod:`dlscale.distributed.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from dlscale.config import ConfigError
from dlscale.config.train_config import MODEL_NAMES, ModelSection


@dataclass(frozen=True)
class ModelSpec:
    """A model the config can name: how to build it, and whether a sharded run may build it on the meta device."""

    name: str
    #: (the model section, one sample's (channels, height, width), outputs, seed) -> the model, on the CPU
    build: Callable[[ModelSection, tuple[int, int, int], int, int], nn.Module]
    meta_init: bool = False


MODELS: dict[str, ModelSpec] = {}


def register_model(
    name: str, build: Callable[[ModelSection, tuple[int, int, int], int, int], nn.Module], meta_init: bool = False
) -> ModelSpec:
    """Make ``model=NAME`` build ``build(model_section, input_shape, num_outputs, seed)`` in every config, run and
    command."""
    if not name.isidentifier():
        raise ConfigError(f"a model's name must be a word (letters, digits, _), not {name!r}")
    MODELS[name] = spec = ModelSpec(name, build, meta_init)
    if name not in MODEL_NAMES:
        MODEL_NAMES.append(name)
    return spec


def model_spec(name: str) -> ModelSpec:
    """The registered model named ``name`` (the config has checked the name already)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"no model named {name!r}: the models are {', '.join(MODELS)}") from None
