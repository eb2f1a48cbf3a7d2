"""The one error the K-Means package raises on purpose (a bad argument, or an engine that cannot run here)."""

from ..errors import DlscaleError


class KMeansError(DlscaleError):
    """A bad argument, or a backend that cannot run here; the message says what to do."""
