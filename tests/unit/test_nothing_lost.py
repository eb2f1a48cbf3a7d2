"""Nothing lost, no one in (#61): a user's folders are never deleted, one run owns its folder, a file the kit reads
never runs code, and what a hostile user or a crash leaves is refused in one line. Each test fails on the code before
the fix: the user's files are asserted intact, the planted code is asserted not to have run."""

from __future__ import annotations

import errno
import json
import os
import pickle
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint, load_model
from dlscale.data import DataError
from dlscale.train import train


def _shards(folder: Path, rows: int, targets: int = 3, image: int = 8) -> None:
    from dlscale.data.shards import write_shards

    rng = np.random.default_rng(0)
    write_shards(folder, rng.random((rows, 1, image, image)), rng.random((rows, targets)), shard_size=16)


# --- data lost ---------------------------------------------------------------------------------------------------


def test_staging_refuses_a_folder_it_did_not_make_and_keeps_its_files(in_tmp):
    from dlscale.data import stage_data

    _shards(in_tmp / "datasets/data/train", 4)
    mine = in_tmp / "stage/data"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("three years")
    with pytest.raises(DataError, match=r"stage/data exists and was not staged by dlscale, so it is left as it is"):
        stage_data(in_tmp / "datasets/data", str(in_tmp / "stage"))
    assert (mine / "thesis.tex").read_text() == "three years" and sorted(os.listdir(mine)) == ["thesis.tex"]
    # a copy staging made is refreshed when the source changes
    staged = stage_data(in_tmp / "datasets/data", str(in_tmp / "stage2"))
    _shards(in_tmp / "datasets/data/train", 20)
    assert len(list(stage_data(in_tmp / "datasets/data", str(in_tmp / "stage2")).rglob("*.npy"))) == 4
    assert staged == in_tmp / "stage2/data"


def test_a_temporary_folder_a_killed_generation_left_is_removed_and_no_other(in_tmp):
    from dlscale.data import FieldSpec, generate_dataset
    from dlscale.data.scratch import OWNER

    host = socket.gethostname()
    dead, live, foreign = (in_tmp / ".set.dead0001", in_tmp / ".set.live0001", in_tmp / ".set.users001")
    for folder in (dead, live, foreign):
        folder.mkdir()
    (dead / OWNER).write_text(f"{host} {2**22 + 7}\n")  # (above the default pid_max: no process has it)
    (live / OWNER).write_text(f"{host} {os.getpid()}\n")
    (foreign / "notes.txt").write_text("not the kit's")
    generate_dataset(in_tmp / "set", FieldSpec(image_size=8), 4, 4, 4, progress=False)
    assert not dead.exists() and live.exists() and (foreign / "notes.txt").exists()


def test_a_second_run_in_a_folder_is_refused_naming_the_first(tiny):
    from dlscale.training.folder_lock import FolderBusyError, own_run_folder

    cfg = tiny(max_steps=2)
    with own_run_folder(cfg.resolved_run_dir, is_main=True):
        with pytest.raises(
            FolderBusyError,
            match=rf"runs/tiny is in use by another run \(process {os.getpid()} on "
            rf"{socket.gethostname()}\); wait for it to end",
        ):
            train(cfg)
    assert not (cfg.resolved_run_dir / "metrics.csv").exists()
    train(cfg)  # (released when the holder ends: a killed run's lock goes with its process)


def test_a_resume_of_a_finished_run_keeps_its_summary_and_a_fresh_start_says_what_it_removed(tiny, capsys):
    cfg = tiny(max_steps=20, checkpoint_every=10)
    train(cfg)
    summary = (cfg.resolved_run_dir / "summary.json").read_text()
    train(tiny(max_steps=20, checkpoint_every=10, resume=True))
    assert "is complete: nothing to train, and its summary.json is kept" in capsys.readouterr().out
    assert (cfg.resolved_run_dir / "summary.json").read_text() == summary
    train(tiny(max_steps=10))
    assert (
        "removed the earlier run's 2 checkpoint(s), the newest of step 20 (to continue a run, pass resume=true)"
        in capsys.readouterr().out
    )


def test_a_checkpoint_every_step_still_measures_the_steps(tiny):
    result = train(tiny(max_steps=6, checkpoint_every=1))
    assert result.samples_per_s > 0
    assert json.loads((Path("runs/tiny") / "summary.json").read_text())["samples_per_s"] > 0


# --- no one in ---------------------------------------------------------------------------------------------------


class _Planted:
    """A pickle that, when loaded by a plain unpickler, writes a file (stands in for any code)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_sharded_checkpoint_whose_metadata_runs_code_is_refused_and_the_newest_good_one_is_used(tiny, capsys):
    cfg = tiny(max_steps=10, checkpoint_every=10)
    train(cfg)
    good = list_checkpoints(cfg.resolved_run_dir)[-1]
    marker = Path("planted-code-ran")
    for name, contents in (("ckpt-00000030", pickle.dumps(_Planted(marker.resolve()))), ("ckpt-00000040", None)):
        folder = cfg.resolved_run_dir / "checkpoints" / name
        folder.mkdir()
        if contents:
            (folder / ".metadata").write_bytes(contents)
    with pytest.warns(UserWarning) as export_warnings:
        model = load_model(cfg.resolved_run_dir)  # (dlscale export's path)
    assert not marker.exists() and sum(p.numel() for p in model.parameters()) > 0
    with pytest.warns(UserWarning) as resume_warnings:
        train(tiny(max_steps=20, checkpoint_every=10, resume=True))
    assert not marker.exists() and f"resuming from {good.name}" in capsys.readouterr().out
    for caught in (export_warnings, resume_warnings):
        said = [str(w.message) for w in caught]
        assert any(
            "ckpt-00000030/.metadata was refused: pathlib.Path.write_text is not part of a checkpoint's "
            "metadata" in line
            for line in said
        ), said
        assert any("ckpt-00000040 has no .metadata" in line for line in said), said


@pytest.mark.parametrize(
    "contents, message",
    [
        (torch.zeros(3), "holds no model weights"),
        ({"model": {}}, "holds no model weights"),
        ({"model": {"fc.weight": torch.zeros(2, 2)}}, "holds no model of the kit"),
        ("another model's", "holds the weights of another model than runs/tiny/config.yaml describes"),
    ],
)
def test_a_checkpoint_holding_the_wrong_thing_is_one_line(tiny, contents, message):
    cfg = tiny(max_steps=10, checkpoint_every=10)
    train(cfg)
    for path in list_checkpoints(cfg.resolved_run_dir):
        if contents == "another model's":  # (the right head, but a layer missing and one of another shape)
            weights = torch.load(path, weights_only=True)["model"]
            first = next(iter(weights))
            contents = {"model": {**{k: v for k, v in weights.items() if k != first}, "extra.weight": torch.zeros(3)}}
        torch.save(contents, path)
    with pytest.raises(CheckpointError) as caught:
        load_model(cfg.resolved_run_dir)
    assert len(str(caught.value).splitlines()) == 1 and "ckpt-00000010.pt" in str(caught.value), caught.value
    assert message in str(caught.value), caught.value


def test_the_local_clusters_counter_never_follows_a_planted_link(tmp_path, monkeypatch):
    from dlscale.jobs.local_slurm import SlurmError, first_job_id

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    first = first_job_id()
    assert (tmp_path / "cache/dlscale").stat().st_mode & 0o777 == 0o700
    assert first_job_id() == first + 10_000
    counter = tmp_path / "cache/dlscale/slurm-clusters"
    counter.unlink()
    counter.symlink_to(victim)
    with pytest.raises(SlurmError, match="cannot be opened"):
        first_job_id()
    assert victim.read_text() == "precious\n"


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses this machine listens on at ``port`` (/proc/net/tcp, state 0A)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, at = local.split(":")
        if state == "0A" and int(at, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_the_store_of_local_ranks_listens_on_the_loopback_only():
    import datetime

    from dlscale.distributed import free_port
    from dlscale.distributed.launch_variables import DistEnv
    from dlscale.distributed.process_group import _loopback_store

    port = free_port()
    env = DistEnv(rank=0, world_size=2, master_addr="127.0.0.1", master_port=port)
    store = _loopback_store(env, datetime.timedelta(seconds=5), {})
    assert _listening_addresses(port) == {"127.0.0.1"}
    client = _loopback_store(
        DistEnv(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port), datetime.timedelta(seconds=5), {}
    )
    client.set("k", "v")
    assert store.get("k") == b"v"
    assert _loopback_store(env, datetime.timedelta(seconds=5), {"TORCHELASTIC_USE_AGENT_STORE": "True"}) is None


# --- silently wrong, and tracebacks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "val_rows, val_targets, message",
    [
        (0, 3, r"val holds no samples"),
        (8, 2, r"val holds maps \(1, 8, 8\) with 2 target\(s\), but .*train holds \(1, 8, 8\) with 3"),
    ],
)
def test_data_check_and_training_refuse_splits_that_do_not_match(tiny, capfd, val_rows, val_targets, message):
    import re

    from dlscale.cli import main

    _shards(Path("data/train"), 32)
    Path("data/val").mkdir(parents=True)
    if val_rows:
        _shards(Path("data/val"), val_rows, targets=val_targets)
    else:
        for name in ("x", "y"):
            np.save(f"data/val/shard-00000-{name}.npy", np.zeros((0, 1, 8, 8) if name == "x" else (0, 3), "f4"))
    assert main(["data", "check", "data"]) == 2
    assert re.search(message, capfd.readouterr().err.strip().splitlines()[-1])
    with pytest.raises(DataError, match=message):
        train(tiny(data_dir="data", image_size=8, max_steps=1, global_batch_size=8))


def test_a_nan_in_a_validation_target_names_the_split(tiny):
    _shards(Path("data/train"), 32)
    _shards(Path("data/val"), 16)
    targets = np.load("data/val/shard-00000-y.npy")
    targets[3, 1] = np.nan
    np.save("data/val/shard-00000-y.npy", targets)
    with pytest.raises(
        DataError,
        match=r"the validation split data/val holds NaN or infinite values .*"
        r"dlscale data check data",
    ):
        train(tiny(data_dir="data", image_size=8, epochs=1, global_batch_size=8))


def test_a_full_disk_is_named_at_a_checkpoint_and_the_last_good_one_is_kept(tiny, monkeypatch):
    from dlscale.checkpoint import store

    train(tiny(max_steps=10, checkpoint_every=10))
    real = store.os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(CheckpointError) as caught:
        train(tiny(max_steps=20, checkpoint_every=10, resume=True))
    monkeypatch.setattr(store.os, "fsync", real)
    assert len(str(caught.value).splitlines()) == 1 and "No space left on device" in str(caught.value)
    assert [p.name for p in list_checkpoints("runs/tiny")] == ["ckpt-00000010.pt"]
    load_latest_checkpoint("runs/tiny")


def test_a_master_port_that_is_no_number_is_named():
    from dlscale.distributed.launch_variables import DistributedError, detect

    with pytest.raises(DistributedError, match="MASTER_PORT"):
        detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"})


def test_options_and_overrides_may_come_in_any_order():
    from dlscale.cli import _parse

    args = _parse(["hpo", "start", "tiny", "--dir", "s", "--workers", "0", "device=cpu", "lr=0.01"])
    assert args.workers == 0 and args.overrides == ["device=cpu", "lr=0.01"]


def test_buckets_are_priced_without_a_list_per_bucket():
    from dlscale.scaling.collectives import buckets

    assert buckets(2.0**100, 2.0**-10) == [(2.0**-10, 2**110)]
    assert buckets(10.0, 4.0) == [(4.0, 2), (2.0, 1)]
