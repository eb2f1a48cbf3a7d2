"""What the commands share: argparse types that range-check a number (a bad value is one line, never a
traceback), the ``[CONFIG] [key=value ...]`` arguments, and a config name told from its overrides."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from dlscale.errors import RangeError, check_range


def name_and_overrides(name: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """An optional NAME before KEY=VALUE overrides: `dlscale train epochs=2` names no config, only an override."""
    if name is not None and "=" in name and not Path(name).exists():
        return None, [name, *overrides]
    return name, list(overrides)


def number(kind: type, low: float | None = None, high: float | None = None, above: bool = False) -> Any:
    """An argparse type: a number of ``kind`` in its range, else argparse's one line naming the argument
    ("argument --batch: must be at least 1, not -64")."""

    def parse(text: str) -> float:
        try:
            value = _whole(text) if kind is int and _WHOLE_IN_FLOAT.fullmatch(text.strip()) else kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(
                f"{'a whole number' if kind is int else 'a number'} is needed, not {text!r}"
            ) from None
        try:
            return check_range("it", value, low, high, above=above)
        except RangeError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("it ")) from None

    return parse


def number_or(word: str, kind: type, low: float | None = None, high: float | None = None) -> Any:
    """An argparse type: ``word`` itself (``auto``), or a number of ``kind`` in its range, else one line."""
    parse_number = number(kind, low, high)

    def parse(text: str) -> Any:
        if text.strip().lower() == word:
            return word
        try:
            return parse_number(text)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} (or {word})") from None

    return parse


#: A whole number written as a float (25.6e6, 1e9): taken as an int where it is whole.
_WHOLE_IN_FLOAT = re.compile(r"[+-]?\d+(\.\d*)?[eE][+]?\d+")


def _whole(text: str) -> int:
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


def sizes(text: str) -> list[int]:
    """``--sizes 1,2,4``: whole numbers of ranks or nodes, each at least 1."""
    return [number(int, 1)(part) for part in text.split(",")]


def counts_or_none(text: str) -> list[int]:
    """``--procs 1,2`` (process counts, each at least 1), or ``''`` for none."""
    return sizes(text) if text.strip() else []


def positive_list(text: str) -> list[float]:
    """``--buckets 1,25``: numbers above 0 (an empty entry is skipped)."""
    return [number(float, above=True, low=0)(part) for part in text.split(",") if part.strip()]


#: A measured stretch needs steps after the 5 that warm up (and the profiled window's own).
MIN_MEASURED_STEPS = 10


def config_arguments(parser: argparse.ArgumentParser, default: str | None = "demo") -> None:
    """The ``[CONFIG] [key=value ...]`` arguments that every training-based command takes."""
    parser.add_argument(
        "config",
        nargs="?",
        default=default,
        help="config name or YAML path" + (f" (default {default})" if default else ""),
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
