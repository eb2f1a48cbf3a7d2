"""A study on disk: its settings in ``study.json``, its trials in storage many processes share.

The default storage is Optuna's journal on a file in the study's folder: appends under a
file lock, which Optuna recommends on NFS and Lustre, where SQLite's locking is unreliable.
Where a site runs a database, ``storage="postgresql://..."`` (any SQLAlchemy URL) is used instead.
``study.json`` records the space, the sampler, the pruner and the storage, so every worker,
``dlscale hpo show`` and a restarted study all open the same study from the folder alone.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dlscale.config import parse_overrides
from dlscale.errors import DlscaleError, RangeError, check_range, import_optional
from dlscale.hpo.space import SearchSpace, load_space

STUDY_FILE = "study.json"
JOURNAL_FILE = "study.journal"
TRIALS_DIR = "trials"
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("hyperband", "halving", "median", "none")
#: The least grace, in heartbeats, before a silent trial is taken for dead.
GRACE_BEATS = 3


class StudyError(DlscaleError):
    """A study that cannot be created or opened; the message says what to do."""


def load_optuna() -> Any:
    """``optuna``, or one message naming the extra."""
    return import_optional("optuna", "hpo", "hyperparameter search (dlscale hpo)", StudyError)


def finished_trial_error() -> type[Exception]:
    """What Optuna raises when a finished trial is updated: its own class from 4.3, a RuntimeError before."""
    return getattr(load_optuna().exceptions, "UpdateFinishedTrialError", RuntimeError)


@dataclass
class StudySettings:
    """What ``study.json`` holds: everything a worker needs to join the study."""

    name: str
    space: dict[str, Any]
    trials: int
    sampler: str = "tpe"
    pruner: str = "hyperband"
    seed: int = 0
    storage: str = ""  # '' = the journal file in the study folder
    grid_points: int = 3  # per range, for sampler=grid
    heartbeat_s: float = 2.0  # how often a worker says its trial is alive
    grace_s: float = 20.0  # a running trial silent this long is failed and retried
    max_retry: int = 2
    ranks_per_node: int = 1  # ranks (GPUs) per node: a trial costs seconds x its ranks / this, in node-hours
    threads: int = 0  # torch threads per trial (0: what each worker was given); recorded in each config
    extra: list[str] = field(default_factory=list)  # key=value overrides for every trial (device=cuda)

    def __post_init__(self) -> None:
        for key, low in (("heartbeat_s", 0), ("max_retry", 0), ("ranks_per_node", 1), ("threads", 0)):
            try:
                check_range(key, getattr(self, key), low, above=key == "heartbeat_s")
            except RangeError as err:
                raise StudyError(str(err)) from None
        # A beat can come late on a busy node; a grace shorter than a few of them fails live trials (each one run
        # twice).
        if not self.grace_s >= GRACE_BEATS * self.heartbeat_s:
            raise StudyError(
                f"grace_s={self.grace_s:g} must be at least {GRACE_BEATS} heartbeats "
                f"({GRACE_BEATS * self.heartbeat_s:g} s with heartbeat_s={self.heartbeat_s:g}): a shorter "
                f"grace fails trials whose workers are alive"
            )

    @property
    def search_space(self) -> SearchSpace:
        """The study's space, checked (:func:`~dlscale.hpo.space.load_space`) once per process: a worker reads it
        several times a trial, and each check loads the config once per parameter bound."""
        try:
            key = json.dumps(self.space)  # (in its order: the order of the parameters is the order of the draws)
        except (TypeError, ValueError):  # (not as study.json holds it: checked afresh)
            return load_space(self.space)
        return _checked_space(key)


@functools.lru_cache(maxsize=32)
def _checked_space(space_json: str) -> SearchSpace:
    """A study's space from its JSON text, checked once (a :class:`SearchSpace` is frozen: one copy serves all)."""
    return load_space(json.loads(space_json))


def create_study(
    space: SearchSpace | str | Path,
    study_dir: str | Path,
    trials: int,
    *,
    sampler: str = "tpe",
    pruner: str = "hyperband",
    seed: int = 0,
    storage: str = "",
    name: str = "",
    **settings: Any,
) -> StudySettings:
    """Write ``study.json`` and create the study in its storage; an existing folder's study is kept (resumed).

    A folder that holds a study of another space or sampler is refused: pick a new folder.
    """
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    if sampler not in SAMPLERS or pruner not in PRUNERS:
        raise StudyError(
            f"sampler must be one of {', '.join(SAMPLERS)} and pruner one of {', '.join(PRUNERS)}; "
            f"got {sampler!r} and {pruner!r}"
        )
    if trials < 1:
        raise StudyError(f"a study needs at least one trial, got trials={trials}")
    study_dir = Path(study_dir)
    wanted = StudySettings(name or space.name, space.to_dict(), trials, sampler, pruner, seed, storage, **settings)
    # Every trial's shared overrides, checked once here: a typo (lrr=0.1) would otherwise fail every trial.
    space.config({}, **parse_overrides(wanted.extra))
    path = study_dir / STUDY_FILE
    if path.is_file():
        held = read_settings(study_dir)
        if (held.space, held.sampler, held.pruner, held.name) != (wanted.space, sampler, pruner, wanted.name):
            raise StudyError(
                f"{study_dir} already holds study {held.name!r} with another space, sampler or pruner; "
                f"choose a new folder, or resume it with `dlscale hpo start --dir {study_dir}`"
            )
        held.trials = max(held.trials, trials)  # asking for more trials extends it
        wanted = held
    if study_dir.exists() and not study_dir.is_dir():
        raise StudyError(f"{study_dir} is a file, not a study folder: choose another --dir")
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(wanted), indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:  # (a read-only folder, a full disk)
        raise StudyError(
            f"cannot write the study into {study_dir}: {err.strerror or err}; choose a folder you "
            f"can write (on a cluster, under $SCRATCH)"
        ) from None
    optuna = load_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(
        study_name=wanted.name,
        storage=open_storage(wanted.storage, study_dir),
        direction=space.direction,
        load_if_exists=True,
    )
    return wanted


def trial_folder(study_dir: str | Path, recorded: str) -> Path:
    """A trial's run folder from what the study recorded: relative to the study (so the study may move and be read
    from any directory), or, in studies from before that, relative to the worker's directory."""
    path = Path(study_dir) / recorded
    return path if path.exists() or not Path(recorded).exists() else Path(recorded)


def read_settings(study_dir: str | Path) -> StudySettings:
    """The settings of the study in ``study_dir``, or a :class:`StudyError` saying how to make one."""
    path = Path(study_dir) / STUDY_FILE
    if not path.is_file():
        raise StudyError(
            f"no study in {study_dir} (no {STUDY_FILE}); start one with `dlscale hpo start SPACE --dir {study_dir}`"
        )
    try:
        held = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:  # (a truncated or hand-damaged file)
        raise StudyError(
            f"{path} is not valid JSON ({err}); restore it, or start a new study in another --dir"
        ) from None
    known = {f.name for f in fields(StudySettings)}
    unknown = sorted(set(held) - known) if isinstance(held, dict) else []
    if not isinstance(held, dict) or unknown:
        raise StudyError(
            f"{path} holds {'unknown keys: ' + ', '.join(unknown) if unknown else 'no settings'} "
            f"(known: {', '.join(sorted(known))}); restore it, or start a new study in another --dir"
        )
    try:
        return StudySettings(**held)
    except TypeError as err:  # (a key it needs is missing)
        raise StudyError(f"{path} is incomplete ({err}); restore it, or start a new study in another --dir") from None


def open_storage(url: str, study_dir: str | Path) -> Any:
    """Optuna storage: the journal file in ``study_dir`` for '', else the database at ``url``."""
    optuna = load_optuna()
    if not url:
        from optuna.storages.journal import JournalStorage

        from dlscale.hpo.journal import GuardedJournal  # (a record torn by a crash is cut off, never joined)

        return JournalStorage(GuardedJournal(Path(study_dir) / JOURNAL_FILE))
    return optuna.storages.RDBStorage(url)


def open_study(study_dir: str | Path, worker: int = 0) -> tuple[Any, StudySettings]:
    """The Optuna study in ``study_dir`` with this worker's sampler and the study's pruner.

    Samplers are not stored: each worker builds its own, seeded ``seed + worker`` so that
    two workers never draw the same random sequence.
    """
    optuna = load_optuna()
    settings = read_settings(study_dir)
    space = settings.search_space
    study = optuna.load_study(
        study_name=settings.name,
        storage=open_storage(settings.storage, study_dir),
        sampler=make_sampler(settings, space, worker),
        pruner=make_pruner(settings.pruner, int(space.fixed.get("epochs", 0)) or None),
    )
    return study, settings


#: Added to TPE's seed. TPE's first trials are random draws from a RandomSampler seeded as TPE is: with the same
#: study seed, TPE and random search would start with the same trials, and on a small budget tie exactly (the
#: best found among them). An offset gives TPE draws of its own, as a second study would have.
TPE_SEED_OFFSET = 7919


def make_sampler(settings: StudySettings, space: SearchSpace, worker: int = 0) -> Any:
    """This worker's sampler for the study: seeded ``seed + worker`` (plus :data:`TPE_SEED_OFFSET` for TPE)."""
    optuna = load_optuna()
    seed = settings.seed + worker + (TPE_SEED_OFFSET if settings.sampler == "tpe" else 0)
    if settings.sampler == "grid":
        return optuna.samplers.GridSampler(space.grid(settings.grid_points), seed=seed)
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # a few random trials first, then TPE's model of good and bad regions
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, settings.trials // 3)))


def make_pruner(name: str, epochs: int | None) -> Any:
    """Pruning on the per-epoch metric; an epoch is the resource Hyperband and successive halving share out."""
    optuna = load_optuna()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs or "auto", reduction_factor=2)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    return optuna.pruners.NopPruner()
