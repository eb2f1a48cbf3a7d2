"""The base of every error dlscale raises on purpose.

Each one carries a message that names the bad key, file or device and says what to do,
so the CLI prints it alone, without a traceback.
"""


class DlscaleError(Exception):
    """A problem the user can fix: a bad config, missing data, an unavailable device..."""


def import_optional(module: str, error: type[DlscaleError], hint: str):
    """``module`` imported, or ``error`` with ``hint`` (which extra to install) instead of an ImportError.

    The package imports without its optional extras (horovod, daal4py, nvtx, wandb); the
    modules that need one import it here, where it is used.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise error(f"{hint} ({err})") from None


def importable(module: str) -> bool:
    """Whether ``module`` imports here (for optional paths, tests and benchmarks)."""
    try:
        import_optional(module, DlscaleError, "")
    except DlscaleError:
        return False
    return True
