"""Hyperparameter search (dlscale.hpo): spaces refused with a clear message, pruning through the engine's stop
path, workers that die, a study that resumes, and the best trial re-run to the same value.

The job-array path on the two-node Slurm cluster is in test_slurm.py.
"""

import json
from pathlib import Path

import pytest

from dlscale.hpo import SearchSpaceError, create_study, load_space, open_study
from dlscale.metrics.tracking import read_rows

optuna = pytest.importorskip("optuna")

#: Trials of about a second on one core: what the tests need to see several finish.
SMALL = {
    "epochs": 2,
    "train_samples": 256,
    "val_samples": 128,
    "shard_size": 128,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "norm": "group",
}


def _space(**parameters):
    return load_space(
        {
            "name": "test",
            "base": "tiny",
            "fixed": SMALL,
            "parameters": parameters
            or {"lr": {"low": 1e-3, "high": 1e-2, "log": True}, "warmup_steps": {"low": 0, "high": 8}},
        }
    )


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"lrr": {"low": 1e-3, "high": 1e-2}}, "'lrr', which is not a config key (did you mean 'lr'?)"),
        ({"lr": {"low": 1e-2, "high": 1e-3}}, "parameter 'lr': the range is inverted (low 0.01 > high 0.001)"),
        ({"lr": {"low": 1e-3, "high": 1e-3}}, "parameter 'lr': the range [0.001, 0.001] is empty"),
        ({"lr": {"low": 0.0, "high": 1e-2, "log": True}}, "parameter 'lr': a log range must stay above zero"),
        ({"optimizer": {"choices": []}}, "parameter 'optimizer': the list of choices is empty"),
        ({"optimizer": {"choices": ["adamw", "adam"]}}, "parameter 'optimizer': the value 'adam' is refused"),
        ({"optimizer": {"low": 1, "high": 2}}, "optimizer is not a number"),
        ({"warmup_steps": {"low": 0.5, "high": 8}}, "warmup_steps is an integer key"),
        ({"run_dir": {"choices": ["a", "b"]}}, "'run_dir', which each trial sets itself"),
        ({"lr": {"low": 1e-3, "hi": 1e-2}}, "unknown setting 'hi'"),
        ({"lr": {"low": float("nan"), "high": 1e-2}}, "parameter 'lr': low and high must be finite numbers, got nan"),
        ({"lr": {"low": 1e-3, "high": float("inf")}}, "parameter 'lr': low and high must be finite numbers"),
        ({}, "'parameters' is empty"),
    ],
)
def test_a_bad_search_space_is_refused_naming_the_parameter(parameters, message):
    with pytest.raises(SearchSpaceError) as caught:
        load_space({"base": "tiny", "parameters": parameters})
    assert message in str(caught.value)


def test_a_shipped_space_loads_and_each_draw_is_a_valid_config(tmp_path):
    space = load_space("tiny")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(5):
        values = {p.key: p.suggest(study.ask()) for p in space.parameters}
        cfg = space.config(values, run_dir=str(tmp_path))
        assert cfg.optimizer in ("adamw", "lamb", "lars") and 3e-4 <= cfg.lr <= 3e-2
    with pytest.raises(SearchSpaceError, match="no search space 'nope'"):
        load_space("nope")


@pytest.mark.parametrize("storage", ["journal", "database"])
def test_a_pruned_trial_stops_through_the_engines_stop_path_and_keeps_its_folder(storage, in_tmp, monkeypatch):
    """A pruner that prunes everything below R² 0.99: each trial stops after its first epoch, checkpointed;
    in the default journal file, or in a database named by its URL (recorded in study.json for the workers)."""
    from dlscale.hpo import study as study_module
    from dlscale.hpo.worker import run_worker

    monkeypatch.setattr(study_module, "make_pruner", lambda *args: optuna.pruners.ThresholdPruner(lower=0.99))
    url = f"sqlite:///{in_tmp / 'trials.db'}" if storage == "database" else ""
    create_study(_space(), "study", trials=2, storage=url)
    assert run_worker("study") == [0, 1]
    study, _ = open_study("study")
    assert (in_tmp / "study/study.journal").exists() == (storage == "journal")
    for trial in study.trials:
        assert trial.state == optuna.trial.TrialState.PRUNED
        run_dir = in_tmp / "study" / trial.user_attrs["run_dir"]  # (recorded relative to the study)
        history = read_rows(run_dir / "validation.csv")
        assert [row["epoch"] for row in history] == [1]  # of 2: stopped after the first
        assert trial.intermediate_values == {1: pytest.approx(history[0]["r2"])}
        assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))  # stopped as on a signal: checkpoint first
        summary = json.loads((run_dir / "summary.json").read_text())  # pruned, and saying so: not "a signal"
        assert (summary["stop_reason"], summary["preempted"]) == ("callback", False)
        assert summary["stop_detail"] == "stopped after epoch 1 by the search's pruner"
    if storage == "journal":  # the study moves whole: its trials' folders are recorded relative to it
        from dlscale.hpo.results import trial_rows

        (in_tmp / "elsewhere").mkdir()
        (in_tmp / "study").rename(in_tmp / "elsewhere/study")
        monkeypatch.chdir(in_tmp / "elsewhere")
        assert all(Path(row["run_dir"], "validation.csv").is_file() for row in trial_rows(in_tmp / "elsewhere/study"))


def test_a_journal_torn_mid_record_is_cut_back_and_never_joined_by_the_next_write(in_tmp, capsys):
    """A crash mid-write leaves the journal's last record cut short. Optuna reads past it silently, and a
    worker's next append used to join it, making the study unreadable for good."""
    create_study(_space(), "study", trials=8)
    first, _ = open_study("study")
    for value in (0.1, 0.2, 0.3):
        first.tell(first.ask(), value)
    journal, torn = in_tmp / "study/study.journal", in_tmp / "study/study.journal.torn"
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-25])  # trial 2's result, torn by a crash (the issue's reproduction)
    live, _ = open_study("study")  # the next worker: the torn record is cut off when it opens the study
    assert "ended in a record torn mid-write (" in capsys.readouterr().out
    assert torn.read_bytes() == whole[whole.rstrip(b"\n").rfind(b"\n") + 1 : -25] + b"\n"
    with journal.open("ab") as dying:  # another worker dies mid-write while this one runs on
        dying.write(whole.splitlines()[-1][:-25])
    live.tell(live.ask(), 0.4)  # this worker's next write cuts the torn record first, never joins it
    assert "ended in a record torn mid-write (" in capsys.readouterr().out and torn.read_bytes().count(b"\n") == 2
    study, _ = open_study("study")  # readable: every line whole
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "RUNNING", "COMPLETE"]
    assert [t.value for t in study.trials if t.value is not None] == [0.1, 0.2, 0.4]  # only trial 2's result lost
    assert journal.read_bytes().endswith(b"\n")


def test_random_search_and_tpe_of_one_seed_start_from_different_draws():
    # TPE's first trials are a RandomSampler's, seeded as TPE is: without an offset, the two studies of lesson 12
    # began with the same trials and tied exactly whenever the best came from those
    import optuna

    from dlscale.hpo.study import StudySettings, make_sampler

    space = _space()
    first = {}
    for sampler in ("random", "tpe"):
        settings = StudySettings("s", space.to_dict(), 4, sampler=sampler, seed=3)
        study = optuna.create_study(sampler=make_sampler(settings, space), direction="maximize")
        first[sampler] = [space.overrides(study.ask()) for _ in range(3)]
    assert first["random"] != first["tpe"]
    again = optuna.create_study(
        sampler=make_sampler(StudySettings("s", space.to_dict(), 4, sampler="tpe", seed=3), space)
    )
    assert [space.overrides(again.ask()) for _ in range(3)] == first["tpe"]  # and a seed still repeats its draws


def test_the_optuna_calls_it_does_not_promise_work_without_a_warning_at_this_version():
    # run here at the newest Optuna and in the oldest-Python run at the floor (4.0): the adapter is all there is
    import warnings

    import optuna
    from optuna.trial import TrialState

    from dlscale.hpo import optuna_api

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
    seen = study.get_trials(deepcopy=False)[0]  # as another worker sees it: a frozen trial
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated name (RetryFailedTrialCallback from 4.9) would fail here
        optuna_api.record(study, seen, "failed_because", "no heartbeat")
        assert optuna_api.claim_failed(study, seen) is True
        optuna_api.retry(study, seen, max_retry=1)
    failed, queued = study.get_trials(deepcopy=False)
    assert failed.state == TrialState.FAIL and failed.user_attrs["failed_because"] == "no heartbeat"
    assert queued.state == TrialState.WAITING and queued.params == {"lr": trial.params["lr"]}
    again = study.ask()  # the retry runs the same settings
    assert again.number == queued.number and again.params == queued.params


def test_a_setting_every_trial_shares_is_checked_before_any_trial_and_a_repeated_refusal_stops_the_worker(
    in_tmp, capsys
):
    """A typo in the per-trial overrides once made thousands of failed trials in minutes, without a word."""
    from dlscale.config import ConfigError
    from dlscale.hpo.worker import FAILURES_IN_A_ROW, WorkerError, run_worker

    with pytest.raises(ConfigError, match="unknown config key 'lrr'"):
        create_study(_space(), "typo", trials=4, extra=["lrr=0.1"])
    assert not (in_tmp / "typo").exists()
    create_study(_space(), "study", trials=20)
    with pytest.raises(ConfigError, match="unknown config key 'lrr'"):
        run_worker("study", extra=["lrr=0.1"])  # a worker's own overrides too
    with pytest.raises(
        WorkerError,
        match=f"{FAILURES_IN_A_ROW} trials in a row failed the same way, so this worker "
        f"stopped: data_dir nowhere does not exist",
    ):
        run_worker("study", extra=["data_dir=nowhere"])  # refused by the engine only when a trial starts
    study, _ = open_study("study")
    assert len(study.trials) == FAILURES_IN_A_ROW and {t.state.name for t in study.trials} == {"FAIL"}


def test_starting_an_existing_study_again_keeps_its_settings_and_says_what_changes(in_tmp, capfd):
    """It used to raise a finished 4-trial study to 12 and ignore a new grace, seed or override without a word."""
    from dlscale.cli import main
    from dlscale.hpo import read_settings

    assert main(["hpo", "start", "tiny", "--dir", "s", "--trials", "4", "--workers", "0", "--grace-s", "30"]) == 0
    assert main(["hpo", "start", "tiny", "--dir", "s", "--workers", "0"]) == 0  # the same, resumed: nothing changes
    assert read_settings("s").trials == 4 and read_settings("s").grace_s == 30
    capfd.readouterr()
    assert main(["hpo", "start", "--dir", "s", "--workers", "0", "--grace-s", "6", "--seed", "3", "epochs=1"]) == 2
    assert capfd.readouterr().err.strip() == (
        "dlscale: error: s holds study 'tiny-search', created with other settings: seed 0 -> 3; grace_s 30.0 -> 6.0; "
        "extra [] -> ['epochs=1']. Resume it without them (`dlscale hpo start --dir s`; --trials may change), or "
        "start the new search in a new folder"
    )
    assert main(["hpo", "start", "--dir", "s", "--workers", "0", "--trials", "6"]) == 0
    assert "6 trials to finish (it had 4)" in capfd.readouterr().out and read_settings("s").trials == 6


def test_a_space_whose_choices_are_lists_is_drawn_stored_and_shown(in_tmp):
    """Optuna keeps plain values only: its plots failed on a list choice (profile_steps), so hpo show did too."""
    from dlscale.cli import main

    space = load_space(
        {"name": "lists", "base": "tiny", "parameters": {"profile_steps": {"choices": [[1, 2], [2, 3]]}}}
    )
    create_study(space, "study", trials=2)
    study, settings = open_study("study")
    drawn = []
    for value in (0.1, 0.2):
        trial = study.ask()
        drawn.append(settings.search_space.overrides(trial)["profile_steps"])
        study.tell(trial, value)
    assert all(isinstance(steps, list) and steps in ([1, 2], [2, 3]) for steps in drawn)  # the config gets the list
    assert main(["hpo", "show", "--dir", "study"]) == 0
    assert (in_tmp / "study/parallel_coordinates.png").is_file()
