"""The K-Means estimator's error for a bad argument or an engine that cannot run here (launching ranks fails with
dlscale.cluster.launch.LaunchError, and the command line with its own one-line errors)."""

from dlscale.errors import DlscaleError


class KMeansError(DlscaleError, ValueError):
    """A bad argument, or a backend that cannot run here; the message says what to do.

    It is also a ``ValueError``, the error scikit-learn's own estimators raise for bad input,
    so code (and ``check_estimator``) written against scikit-learn catches it.
    """
