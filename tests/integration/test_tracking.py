"""Tracking: a run that writes W&B offline files, read back (tests/unit/test_tracking.py has the rest)."""

import json
import struct

import pytest

from dlscale.metrics.tracking import NOISE_FILE, read_rows
from dlscale.train import train


def wandb_history(run_file):
    """History rows of an offline ``.wandb`` file: LevelDB's log format behind a 7-byte W&B header,
    each record one of wandb's protobufs (wandb >= 0.19 no longer ships a Python reader)."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, parts, rows = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            kind_of = record.WhichOneof("record_type")
            # a row is a history record, or (not yet merged by W&B's service) a partial-history request
            items = (
                record.history.item
                if kind_of == "history"
                else record.request.partial_history.item
                if kind_of == "request" and record.request.WhichOneof("request_type") == "partial_history"
                else None
            )
            if items is not None:
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


def test_wandb_offline_run_records_the_metrics_and_never_the_key(tiny, monkeypatch):
    secret = "0123456789abcdef-not-a-real-key-" + "x" * 8
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    # the noise-scale rows come at steps 4, 8, ... before the step rows, which are written in blocks of 10
    result = train(tiny(tracking="wandb", epochs=1, noise_scale_every=4))
    # W&B's service process writes the file; run.finish() can return before it has written the last rows
    # (CI, busy: the last two were missing), and teardown waits for the service, as the CLI's exit does
    import wandb

    wandb.teardown()
    runs = list((result.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, "no offline run"
    # what lesson 07 lists for a later upload: this run's folder, found from the folder of all runs
    from dlscale.metrics.tracking import offline_wandb_runs, wandb_sync_command

    assert offline_wandb_runs(result.run_dir.parent) == [runs[0].parent]
    assert wandb_sync_command([runs[0].parent] * 3) == f"wandb sync {runs[0].parent} {runs[0].parent} ..."
    history = wandb_history(runs[0])
    steps = [row for row in history if "train/loss" in row]
    assert [row["step"] for row in steps] == [row["step"] for row in result.steps], f"{len(history)} rows read"
    assert [row["train/loss"] for row in steps] == pytest.approx([row["loss"] for row in result.steps])
    noise = [row for row in history if "noise/b_simple" in row]
    csv_noise = read_rows(result.run_dir / NOISE_FILE)
    assert len(csv_noise) >= 4 and [row["step"] for row in noise] == [row["step"] for row in csv_noise]  # none dropped
    assert [row for row in history if "val/r2" in row][-1]["val/r2"] == pytest.approx(result.final["r2"])
    for path in result.run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"API key written to {path}"
