"""The calls into Optuna that its public API does not promise, in one place, at the supported floor (4.0) and today.

A worker that finds a dead worker's trial must change that trial from outside it: record why, mark
it failed (only if it is still running, so that two workers never both claim it) and queue its
settings again. Optuna's ``Study`` has no public call for the first two; its storage does, behind
``study._storage`` and ``trial._trial_id``. Every such use is here, so that an Optuna release that
moves them breaks one module, which ``tests/unit/test_hpo.py`` runs at the floor (the oldest-Python
run) and at the newest version.

The retry is Optuna's own callback: ``RetryFailedTrialCallback`` up to 4.8, renamed
``RetryHeartbeatStaleTrialCallback`` in 4.9 (the old name warns, and goes in 6.0).
"""

from __future__ import annotations

from typing import Any


def retry_callback(max_retry: int) -> Any:
    """Optuna's callback that queues a failed trial's settings again, by its current name."""
    import warnings

    from optuna import storages
    from optuna.exceptions import ExperimentalWarning

    callback = getattr(storages, "RetryHeartbeatStaleTrialCallback", None) or storages.RetryFailedTrialCallback
    with warnings.catch_warnings():  # (experimental since 2.8, and what Optuna itself points to: said once, here)
        warnings.simplefilter("ignore", ExperimentalWarning)
        return callback(max_retry=max_retry)


def record(study: Any, trial: Any, key: str, value: Any) -> None:
    """Set a user attribute of any trial of ``study`` (a :class:`FrozenTrial` another worker runs, too)."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)


def claim_failed(study: Any, trial: Any) -> bool:
    """Mark a running trial FAIL; False when another worker changed it first (the storage's update is atomic)."""
    from optuna.trial import TrialState

    return bool(study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL))


def frozen(study: Any, trial: Any) -> Any:
    """The stored :class:`FrozenTrial` of ``trial`` (a live trial, or a frozen one that may have changed since)."""
    return study._storage.get_trial(trial._trial_id)


def retry(study: Any, trial: Any, max_retry: int) -> None:
    """Queue ``trial``'s settings again as a new trial (at most ``max_retry`` times over its retries)."""
    retry_callback(max_retry)(study, frozen(study, trial))
