"""The base of every error dlscale raises on purpose.

Each one carries a message that names the bad key, file or device and says what to do,
so the CLI prints it alone, without a traceback.
"""

import importlib
import math
from types import ModuleType


class DlscaleError(Exception):
    """A problem the user can fix: a bad config, missing data, an unavailable device..."""


class RangeError(DlscaleError, ValueError):
    """A number outside the values it can take; the message names it and its range."""


def check_range(
    name: str, value: float, low: float | None = None, high: float | None = None, *, above: bool = False
) -> float:
    """``value`` if it is a finite number in [low, high] (``above``: strictly above ``low``), else a :class:`RangeError`
    naming ``name`` ("--batch must be at least 1, not -64")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RangeError(f"{name} must be a finite number, not {value!r}")
    if low is not None and (value <= low if above else value < low):
        raise RangeError(f"{name} must be {'above' if above else 'at least'} {low:g}, not {value:g}")
    if high is not None and value > high:
        raise RangeError(f"{name} must be at most {high:g}, not {value:g}")
    return value


def import_optional(
    module: str, extra: str, purpose: str, error: type[DlscaleError] = DlscaleError, alternative: str = ""
) -> ModuleType:
    """``module`` imported, or ``error`` naming the extra that installs it, instead of an ImportError.

    The package imports without its optional extras (horovod, daal4py, mpi4py, nvtx, wandb,
    ipyparallel, scikit-learn); every module that needs one imports it here, where it is used,
    so the message reads the same everywhere::

        tracking=wandb needs wandb, which is not installed here: pip install -e '.[tracking]' in the dlscale folder
        (or set tracking=csv)
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        instead = f" ({alternative})" if alternative else ""
        raise error(
            f"{purpose} needs {module.split('.')[0]}, which is not installed here: "
            f"pip install -e '.[{extra}]' in the dlscale folder{instead} [{err}]"
        ) from None


def importable(module: str) -> bool:
    """Whether ``module`` imports here (for optional paths, tests and benchmarks)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
