"""Nothing lost, third sweep (#74), the run's side: a lock that cannot be taken is a refusal, a stop file is a stop
whatever it holds, a checkpoint that does not fit the model is skipped, a run stays in runs/, and a sharded checkpoint
never reads outside its folder nor allocates what its files do not hold. Each test fails on the code before the fix:
the user's files and the good checkpoints are asserted intact, and every message one line."""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlscale.checkpoint import CheckpointError, list_checkpoints, load_model
from dlscale.cli import main
from dlscale.train import train

RUN = Path("runs/tiny")


def _small(tiny, **overrides):
    """A tiny config on 128 maps: a run of a fraction of a second, checkpointing every 2 of its 4 steps."""
    values = {"train_samples": 128, "val_samples": 32, "shard_size": 32, "max_steps": 4, "checkpoint_every": 2}
    return tiny(**{**values, **overrides})


def _names(folder: Path = RUN) -> list[str]:
    return [path.name for path in list_checkpoints(folder)]


def _one_line(text: str) -> str:
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    return text.strip()


# --- the run-folder lock ---------------------------------------------------------------------------------------


def _link(lock: Path) -> None:
    (lock.parent / "elsewhere").write_text("precious\n")
    lock.symlink_to(lock.parent / "elsewhere")


@pytest.mark.parametrize(
    "plant, said",
    [(_link, "is a symbolic link"), (Path.mkdir, "is a folder"), (os.mkfifo, "is a FIFO, socket or device")],
    ids=["symlink", "folder", "fifo"],
)
def test_a_lock_file_that_is_no_plain_file_refuses_the_run_and_nothing_is_removed(tiny, capfd, plant, said):
    train(_small(tiny))
    lock = RUN / ".dlscale-lock"
    lock.unlink()
    plant(lock)
    args = ["train", "tiny", "train_samples=128", "val_samples=32", "shard_size=32", "max_steps=2", "progress=false"]
    assert main(args) == 2  # (a fresh start: it would remove the earlier run's checkpoints)
    line = _one_line(capfd.readouterr().err)
    assert line.startswith(f"dlscale: error: {lock} {said}, not the run's lock file"), line
    assert _names() == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    assert plant is not _link or (RUN / "elsewhere").read_text() == "precious\n"


def test_a_lock_file_this_user_cannot_open_refuses_the_run(tiny, monkeypatch):
    """Another user's lock file in a shared (0777) run folder: os.open fails with EACCES (simulated: tests run as
    root, who opens anything)."""
    from dlscale.training.folder_lock import FolderBusyError

    train(_small(tiny))
    real = os.open

    def denied(path, *args, **kwargs):
        if str(path).endswith(".dlscale-lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(FolderBusyError) as caught:
        train(_small(tiny))
    line = _one_line(str(caught.value))
    said = r"runs/tiny/\.dlscale-lock belongs to \S+ and cannot be opened by this user \(Permission denied\)"
    assert re.search(said, line), line
    assert "run_dir=runs/<new name>" in line
    assert _names() == ["ckpt-00000002.pt", "ckpt-00000004.pt"]


# --- the stop file ---------------------------------------------------------------------------------------------


def test_a_stop_file_that_is_not_text_stops_at_a_checkpoint_and_the_resume_goes_on(tiny, monkeypatch):
    """Bytes that are no text, behind a link to a user's big file: a stop request all the same; the link goes, the
    file stays, and neither reaches summary.json."""
    from dlscale.training import preemption

    monkeypatch.setattr(preemption, "STOP_FILE_EVERY_S", 0.0)  # (looked for at every step)
    RUN.mkdir(parents=True)
    big = Path("big.bin")
    big.write_bytes(b"\xff\xfe" + bytes(2_000_000))
    (RUN / preemption.STOP_FILE).symlink_to(big.resolve())
    stopped = train(_small(tiny))
    assert stopped.stop_reason == "signal"
    assert stopped.stop_detail == "SIGUSR1 received by the job script (stop-requested)"
    assert _names() == ["ckpt-00000001.pt"] and not (RUN / preemption.STOP_FILE).exists()
    assert big.stat().st_size == 2_000_002 and (RUN / "summary.json").stat().st_size < 20_000
    done = train(_small(tiny, resume=True))
    assert done.stop_reason == "completed" and _names() == ["ckpt-00000002.pt", "ckpt-00000004.pt"]


def test_a_stop_file_names_its_signal_in_its_first_word_only(tmp_path):
    from dlscale.training.preemption import STOP_FILE, StopFlag

    for written, named in ((b"SIGTERM\n", "SIGTERM"), (b"\xff\xfe", "SIGUSR1"), (b"rm -rf /\n", "SIGUSR1")):
        (tmp_path / STOP_FILE).write_bytes(written)
        stop = StopFlag(tmp_path / STOP_FILE, clock=itertools.count(0.0, 10.0).__next__)
        assert stop.poll() is True and stop.signal_name == named


# --- checkpoints that load but do not fit ----------------------------------------------------------------------


def _deflated(path: Path, weights: dict[str, torch.Tensor]) -> None:
    """``path`` rewritten as a zip bomb: the same records deflated, one weight a large block of zeros."""
    state = torch.load(path, weights_only=True)
    state["model"] = weights
    plain = io.BytesIO()
    torch.save(state, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in source.infolist():
            bomb.writestr(info.filename, source.read(info.filename))


@pytest.mark.parametrize("kind", ["wrong shape", "zip bomb"])
def test_a_newest_checkpoint_that_does_not_fit_the_model_is_set_aside_and_the_resume_goes_on(tiny, capsys, kind):
    train(_small(tiny))
    older, newest = list_checkpoints(RUN)
    kept = older.read_bytes()
    weights = torch.load(newest, weights_only=True)["model"]
    first = next(iter(weights))
    if kind == "wrong shape":
        weights[first] = torch.zeros(3, 3)
        state = torch.load(newest, weights_only=True)
        torch.save({**state, "model": weights}, newest)
        said = rf"does not fit the model: its {first} is \[3, 3\] where the model's is"
    else:
        _deflated(newest, {**weights, first: torch.zeros(4_000_000)})  # (16 MB inflated, a few KB on disk)
        assert newest.stat().st_size < 200_000
        said = "holds .* compressed record"
    with pytest.warns(UserWarning, match=rf"ckpt-00000004.pt could not be loaded \(ckpt-00000004.pt {said}"):
        train(_small(tiny, max_steps=3, resume=True))
    out = capsys.readouterr().out
    assert "resuming from ckpt-00000002.pt" in out and "moved to runs/tiny/checkpoints/unreadable" in out
    assert (RUN / "checkpoints/unreadable/ckpt-00000004.pt").exists()
    assert _names() == ["ckpt-00000002.pt", "ckpt-00000003.pt"] and older.read_bytes() == kept


# --- a run stays in runs/ --------------------------------------------------------------------------------------


def test_a_run_name_that_is_a_path_is_refused_naming_the_key(in_tmp, capfd):
    from dlscale.config import ConfigError, load_config

    assert main(["train", "tiny", "name=../../escape", "progress=false"]) == 2
    line = _one_line(capfd.readouterr().err)
    assert line.startswith("dlscale: error: config key 'name' must be a plain name") and "set run_dir" in line
    assert not (in_tmp.parent / "escape").exists() and not (in_tmp / "runs").exists()
    for name in ("/tmp/x", "..", "a/b", ""):
        with pytest.raises(ConfigError, match="config key 'name'"):
            load_config("tiny", {"name": name})
    assert load_config("tiny", {"name": "", "run_dir": "elsewhere/run"}).resolved_run_dir == Path("elsewhere/run")


# --- sharded checkpoints: what they may read and declare ----------------------------------------------------------


def _sharded(step: int = 8, plain: bool = False) -> Path:
    """The newest run checkpoint's weights as a sharded (DCP) folder of step ``step`` (``plain``: saved as a plain
    ``state_dict()``, its names without the ``model.`` that the kit's folders have)."""
    import torch.distributed.checkpoint as dcp

    state = torch.load(list_checkpoints(RUN)[-1], weights_only=True)
    folder = RUN / "checkpoints" / f"ckpt-{step:08d}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.distributed is disabled: one process is the intent)
        dcp.save(state["model"] if plain else {"model": state["model"]}, checkpoint_id=folder, no_dist=True)
    torch.save({k: v for k, v in state.items() if k not in ("model", "optimizer", "rng")}, folder / "training.pt")
    return folder


def _rewrite_metadata(folder: Path, change) -> None:
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # (the test's own folder: a plain unpickler is safe)
    change(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def _huge_head(metadata) -> None:
    head = [key for key in metadata.state_dict_metadata if key.endswith("bias")][-1]
    metadata.state_dict_metadata[head].size = torch.Size([10**10])


def _outside(metadata) -> None:
    for entry in metadata.storage_data.values():
        entry.relative_path = "../../../outside.distcp"


def _dev_zero(metadata) -> None:
    for entry in metadata.storage_data.values():
        entry.relative_path = "/dev/zero"


@pytest.mark.parametrize(
    "change, said",
    [
        (_huge_head, r"declares 40,000,\d{3},\d{3} bytes of tensors but its data files hold"),
        (_outside, r"names '../../../outside.distcp' as a data file: only plain file names inside"),
        (_dev_zero, r"names '/dev/zero' as a data file"),
    ],
    ids=["10**10 elements", "outside the folder", "/dev/zero"],
)
def test_a_sharded_checkpoint_that_declares_too_much_or_reads_elsewhere_is_refused(tiny, capfd, change, said):
    train(_small(tiny))
    good = load_model(RUN).state_dict()
    folder = _sharded()
    (RUN.parent / "outside.distcp").write_bytes((folder / "__0_0.distcp").read_bytes())  # (../../../ of the folder)
    (folder / "__0_0.distcp").write_bytes(b"\0" * (folder / "__0_0.distcp").stat().st_size)  # (its own: zeros)
    _rewrite_metadata(folder, change)
    with pytest.warns(UserWarning, match=rf"ckpt-00000008/.metadata {said}"):
        model = load_model(RUN)  # the older, good checkpoint
    assert all(torch.equal(model.state_dict()[name], value) for name, value in good.items())
    for path in list_checkpoints(RUN)[:-1]:
        path.unlink()
    with pytest.warns(UserWarning, match="trying an older one"):
        assert main(["export", str(RUN), "out.pt"]) == 2  # the crafted folder alone: refused
    line = _one_line(capfd.readouterr().err)
    assert "no checkpoint in runs/tiny/checkpoints could be loaded: ckpt-00000008/.metadata" in line
    assert not Path("out.pt").exists()


def test_a_sharded_checkpoint_dcp_cannot_read_is_one_line_naming_it(tiny):
    """DCP raises a CheckpointException, a BaseException that passes every ``except Exception``."""
    train(_small(tiny))
    folder = _sharded()
    data = folder / "__0_0.distcp"
    data.write_bytes(b"\x01" * data.stat().st_size)  # (the right size, nothing torch can load)
    with pytest.raises(CheckpointError) as caught:
        load_model(RUN)
    line = _one_line(str(caught.value))
    assert line.startswith(f"{folder} could not be read: rank 0: ") and "move it out of checkpoints/" in line


def test_a_sharded_checkpoint_that_dcp_cannot_write_is_one_line_and_the_last_good_one_stays(tiny, monkeypatch):
    from dlscale.checkpoint.sharded import save_sharded_checkpoint
    from dlscale.checkpoint.state import training_extras

    train(_small(tiny))
    model = load_model(RUN)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    extras = training_extras(6, 4, _small(tiny), scheduler, scaler, SimpleNamespace())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.distributed is disabled: one process is the intent)
        with pytest.raises(CheckpointError) as caught:
            save_sharded_checkpoint(RUN, 6, model, optimizer, extras)
    line = _one_line(str(caught.value))
    assert line.startswith("the checkpoint ckpt-00000006 in runs/tiny/checkpoints was not written: the disk is full")
    assert _names() == ["ckpt-00000002.pt", "ckpt-00000004.pt"]


def test_a_sharded_checkpoint_of_a_plain_state_dict_is_skipped_on_resume(tiny, capsys):
    """Written from a plain ``state_dict()`` (no ``model.`` names): it does not fit, so the resume takes the one
    before it instead of ending in DCP's missing-key exception."""
    train(_small(tiny))
    _sharded(plain=True)
    with pytest.warns(UserWarning, match=r"ckpt-00000008 does not fit the model: it has no weight features"):
        train(_small(tiny, max_steps=6, resume=True))
    assert "resuming from ckpt-00000004.pt" in capsys.readouterr().out
    assert _names() == ["ckpt-00000004.pt", "ckpt-00000006.pt"] and json.loads((RUN / "summary.json").read_text())
