"""A search space: which config keys a study varies, over what ranges, from which base config.

Spaces are YAML files beside the configs (``dlscale/config/configs/search/``) or anywhere::

    name: tiny-search
    base: tiny                 # the config every trial starts from
    metric: r2                 # a validation column; the study maximizes it (direction: minimize for mse)
    fixed: {epochs: 4}         # overrides every trial shares
    parameters:
      lr: {low: 1.0e-4, high: 3.0e-2, log: true}
      warmup_steps: {low: 0, high: 40}
      optimizer: {choices: [adamw, lamb, lars]}

The kind of each parameter follows its config key's type: a float key gets a float range
(``log: true`` for log-uniform), an int key an int range (``step`` optional), any key a list
of ``choices``. Everything is checked when the space is loaded, before a trial runs: a key that
is not a config key, an empty or inverted range, a log range through zero, and a value the
config itself refuses each get one message naming the parameter.
"""

from __future__ import annotations

import difflib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dlscale.config import CONFIG_DIR, FIELDS, ConfigError, TrainConfig, load_config

#: Where the shipped search spaces live.
SEARCH_DIR = CONFIG_DIR / "search"
#: Keys a worker sets for each trial itself.
RESERVED = ("name", "run_dir", "resume", "progress", "plot")
_SPACE_KEYS = {"name", "base", "metric", "direction", "fixed", "parameters"}
_PARAMETER_KEYS = {"low", "high", "log", "step", "choices"}
_HINTS = typing.get_type_hints(TrainConfig)
#: Validation columns a study can optimize (those dlscale.metrics.evaluation writes).
METRICS = ("r2", "mse", "r2_log_amplitude", "r2_spectral_index", "r2_blur")


class SearchSpaceError(ConfigError):
    """A search space that cannot be searched: the message names the file and the parameter."""


@dataclass(frozen=True)
class Parameter:
    """One config key a study varies: a range (float or int) or a list of choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | None = None
    choices: tuple = ()

    @property
    def kind(self) -> Literal["float", "int", "categorical"]:
        if self.choices:
            return "categorical"
        return "int" if _HINTS[self.key] is int else "float"

    @property
    def categories(self) -> list:
        """The choices as Optuna holds them: as they are, or all as JSON text where one is not a plain value (a
        list, as ``profile_steps`` takes), which Optuna's storage, table and plots cannot handle."""
        if all(c is None or isinstance(c, (bool, int, float, str)) for c in self.choices):
            return list(self.choices)
        return [json.dumps(c) for c in self.choices]

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws for this key."""
        if self.kind == "categorical":
            drawn = trial.suggest_categorical(self.key, self.categories)
            return self.choices[self.categories.index(drawn)]
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=self.step or 1, log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.log)

    def grid(self, points: int) -> list:
        """``points`` values across the range (log-spaced for a log range), or the choices: a grid search's axis."""
        if self.kind == "categorical":
            return self.categories
        import numpy as np

        values = (np.geomspace if self.log else np.linspace)(float(self.low), float(self.high), points)
        if self.kind == "int":
            return sorted({int(round(v)) for v in values})
        return [float(f"{v:.3g}") for v in values]


@dataclass(frozen=True)
class SearchSpace:
    """What a study searches: a base config, shared overrides, the parameters and the metric."""

    name: str
    base: str
    parameters: tuple[Parameter, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    metric: str = "r2"
    direction: Literal["maximize", "minimize"] = "maximize"

    def overrides(self, trial: Any) -> dict[str, Any]:
        """The config overrides of one trial: the fixed ones, then each parameter's draw."""
        return {**self.fixed, **{p.key: p.suggest(trial) for p in self.parameters}}

    def grid(self, points: int = 3) -> dict[str, list]:
        """Every parameter's axis, for Optuna's ``GridSampler`` (lesson 07's kind of sweep)."""
        return {p.key: p.grid(points) for p in self.parameters}

    def config(self, values: dict[str, Any], **extra: Any) -> TrainConfig:
        """The training config of a trial with these parameter values."""
        return load_config(self.base, {**self.fixed, **values, **extra})

    def to_dict(self) -> dict[str, Any]:
        """The space as YAML would hold it (what a study records so its workers all search the same one)."""
        parameters = {}
        for p in self.parameters:
            entry: dict[str, Any] = {"choices": list(p.choices)} if p.choices else {"low": p.low, "high": p.high}
            if p.log:
                entry["log"] = True
            if p.step:
                entry["step"] = p.step
            parameters[p.key] = entry
        return {
            "name": self.name,
            "base": self.base,
            "metric": self.metric,
            "direction": self.direction,
            "fixed": dict(self.fixed),
            "parameters": parameters,
        }


def space_names() -> list[str]:
    """The shipped search spaces."""
    return sorted(p.stem for p in SEARCH_DIR.glob("*.yaml"))


def load_space(source: str | Path | dict[str, Any]) -> SearchSpace:
    """A checked :class:`SearchSpace` from a shipped name, a YAML path or a mapping."""
    if isinstance(source, dict):
        where, data = "search space", source
    else:
        path = Path(source)
        if not path.is_file():
            path = SEARCH_DIR / f"{source}.yaml"
        if not path.is_file():
            raise SearchSpaceError(
                f"no search space '{source}': not a file, and not one of the shipped spaces "
                f"({', '.join(space_names())})"
            )
        where = str(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise SearchSpaceError(f"{where} is not valid YAML text (UTF-8): {err}") from None
    if not isinstance(data, dict):
        raise SearchSpaceError(f"{where} must be a mapping with base, parameters (and fixed, metric)")
    return _checked(where, data)


def _checked(where: str, data: dict[str, Any]) -> SearchSpace:
    unknown = sorted(set(data) - _SPACE_KEYS)
    if unknown:
        raise SearchSpaceError(f"{where}: unknown entry {unknown[0]!r}; a space has {', '.join(sorted(_SPACE_KEYS))}")
    base = str(data.get("base") or "demo")
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise SearchSpaceError(f"{where}: 'fixed' must map config keys to values (key: value), got {fixed!r}")
    fixed = dict(fixed)
    metric = str(data.get("metric", "r2"))
    direction = str(data.get("direction", "minimize" if metric == "mse" else "maximize"))
    if metric not in METRICS:
        raise SearchSpaceError(f"{where}: metric {metric!r} is not a validation column ({', '.join(METRICS)})")
    if direction not in ("maximize", "minimize"):
        raise SearchSpaceError(f"{where}: direction must be maximize or minimize, got {direction!r}")
    for key in fixed:
        _check_key(where, "fixed", key)
    try:
        load_config(base, fixed)
    except ConfigError as err:
        raise SearchSpaceError(f"{where}: base {base!r} with fixed {fixed}: {err}") from None
    raw = data.get("parameters") or {}
    if not isinstance(raw, dict) or not raw:
        raise SearchSpaceError(
            f"{where}: 'parameters' is empty; name at least one config key to search, "
            f"e.g. lr: {{low: 1.0e-4, high: 1.0e-2, log: true}}"
        )
    parameters = tuple(_parameter(where, base, fixed, key, spec) for key, spec in raw.items())
    return SearchSpace(str(data.get("name") or Path(where).stem), base, parameters, fixed, metric, direction)  # type: ignore[arg-type]


def _check_key(where: str, section: str, key: str) -> None:
    if key not in FIELDS:
        close = difflib.get_close_matches(key, FIELDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise SearchSpaceError(
            f"{where}: {section} names {key!r}, which is not a config key{hint}; `dlscale train --help` lists every key"
        )
    if key in RESERVED:
        raise SearchSpaceError(f"{where}: {section} names {key!r}, which each trial sets itself")


def _parameter(where: str, base: str, fixed: dict[str, Any], key: str, spec: Any) -> Parameter:
    _check_key(where, "parameters", key)
    at = f"{where}: parameter {key!r}"
    if isinstance(spec, list):
        spec = {"choices": spec}
    if not isinstance(spec, dict):
        raise SearchSpaceError(f"{at}: give a range {{low: .., high: ..}} or {{choices: [..]}}, got {spec!r}")
    unknown = sorted(set(spec) - _PARAMETER_KEYS)
    if unknown:
        raise SearchSpaceError(f"{at}: unknown setting {unknown[0]!r} (low, high, log, step or choices)")
    hint = _HINTS[key]
    if "choices" in spec:
        if not isinstance(spec["choices"], list):  # (a bare string would be split into its letters)
            raise SearchSpaceError(
                f"{at}: choices must be a list, e.g. choices: [{spec['choices']!r}], got {spec['choices']!r}"
            )
        choices = tuple(spec["choices"])
        if not choices:
            raise SearchSpaceError(f"{at}: the list of choices is empty")
        if set(spec) - {"choices"}:
            raise SearchSpaceError(f"{at}: give either choices or a range, not both")
        values = choices
        parameter = Parameter(key, choices=choices)
    else:
        if hint not in (int, float):
            raise SearchSpaceError(f"{at}: {key} is not a number ({_type_name(hint)}); give choices: [..] instead")
        if "low" not in spec or "high" not in spec:
            raise SearchSpaceError(f"{at}: a range needs both low and high")
        low, high = spec["low"], spec["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise SearchSpaceError(f"{at}: low and high must be numbers, got {low!r} and {high!r}")
        if not all(math.isfinite(v) for v in (low, high)):  # (YAML reads .nan and .inf as numbers)
            raise SearchSpaceError(f"{at}: low and high must be finite numbers, got {low!r} and {high!r}")
        if hint is int and not all(float(v).is_integer() for v in (low, high)):
            raise SearchSpaceError(f"{at}: {key} is an integer key; low and high must be whole numbers")
        if low == high:
            raise SearchSpaceError(f"{at}: the range [{low}, {high}] is empty; widen it, or move {key} to fixed")
        if low > high:
            raise SearchSpaceError(f"{at}: the range is inverted (low {low} > high {high}); swap them")
        log = spec.get("log", False)
        if not isinstance(log, bool):  # (bool("false") is True)
            raise SearchSpaceError(f"{at}: log must be true or false, got {log!r}")
        if log and low <= 0:
            raise SearchSpaceError(f"{at}: a log range must stay above zero, got low {low}")
        step = spec.get("step")
        if step is not None and (hint is not int or isinstance(step, bool) or not isinstance(step, int) or step < 1):
            raise SearchSpaceError(
                f"{at}: step applies to integer keys and must be a whole number of at least 1, got {step!r}"
            )
        values = (low, high)
        parameter = Parameter(key, low=low, high=high, log=log, step=int(step) if step else None)
    for value in values:  # the config's own checks, with the parameter named
        try:
            load_config(base, {**fixed, key: value})
        except ConfigError as err:
            raise SearchSpaceError(f"{at}: the value {value!r} is refused: {err}") from None
    return parameter


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    return getattr(hint, "__name__", str(hint))
