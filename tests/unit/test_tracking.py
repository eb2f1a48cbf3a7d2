"""Tracking: the CSV rows and W&B's offline records, read back."""

import sys

import pytest

from dlscale.metrics.tracking import TrackingError
from dlscale.train import train


def test_wandb_mode_from_the_environment_wins(tiny, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    result = train(tiny(tracking="wandb", epochs=1, wandb_mode="offline"))
    assert not list(result.run_dir.glob("wandb/offline-run-*"))
    assert (result.run_dir / "metrics.csv").is_file()  # the CSV metrics are always written


def test_missing_wandb_is_one_clear_error(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(TrackingError, match=r"pip install -e '\.\[tracking\]' in the dlscale folder"):
        train(tiny(tracking="wandb"))
