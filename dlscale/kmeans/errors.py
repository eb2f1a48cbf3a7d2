"""The K-Means estimator's error: a bad argument, or an engine that cannot run here.

The kit's other errors around K-Means are its own: ``dlscale kmeans`` refuses a missing or unreadable
input with :class:`dlscale.kmeans.command.InputError`, and starting ranks fails with
:class:`dlscale.jobs.local_ranks.LaunchError`. All three are :class:`dlscale.errors.DlscaleError`, which the
command line prints as one line.
"""

from dlscale.errors import DlscaleError


class KMeansError(DlscaleError, ValueError):
    """A bad argument, or a backend that cannot run here; the message says what to do.

    It is also a ``ValueError``, the error scikit-learn's own estimators raise for bad input,
    so code (and ``check_estimator``) written against scikit-learn catches it.
    """
