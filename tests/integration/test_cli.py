"""The dlscale command end to end: the subcommands run as a user runs them (tests/unit/test_cli.py has the rest)."""

import json
import re
import sys

from ..conftest import run_cli


def test_train_end_to_end(in_tmp):
    done = run_cli("train", "tiny", "epochs=2", "progress=false", cwd=in_tmp)
    assert done.returncode == 0, done.stderr
    assert re.search(r"[\d,]+ samples/s", done.stdout)
    assert re.search(r"validation: mse [\d.]+, r2 0\.\d+", done.stdout)
    run = in_tmp / "runs/tiny"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps_done"] == 64 and summary["r2"] > 0.5
    assert (run / "loss_curve.png").stat().st_size > 10_000


def test_overrides_without_a_config_use_the_defaults(in_tmp):
    done = run_cli(
        "train",
        "name=bare",
        "image_size=16",
        "train_samples=256",
        "val_samples=64",
        "width=4",
        "depth=1",
        "max_steps=3",
        "progress=false",
        "plot=false",
        cwd=in_tmp,
    )
    assert done.returncode == 0, done.stderr
    assert (in_tmp / "runs/bare/metrics.csv").is_file()


def test_bad_input_is_one_line_without_a_traceback(in_tmp):
    for args, message in [
        (["train", "tiny", "lr=fast"], "config key 'lr' expects float, got 'fast'"),
        (["train", "tiny", "epoch=1"], "unknown config key 'epoch' (did you mean 'epochs'?)"),
        (["train", "tiny", "data_dir=nowhere"], "data_dir nowhere does not exist"),
        (
            ["train", "tiny", "device=cuda:0"] if "cuda" not in sys.modules else ["train", "tiny", "device=cuda:99"],
            "device=cuda",
        ),
        (["data", "check", "nowhere"], "data folder nowhere/train does not exist"),
    ]:
        done = run_cli(*args, cwd=in_tmp)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_data_generate_then_check_then_train_on_it(in_tmp):
    done = run_cli(
        "data",
        "generate",
        "--out",
        "mydata",
        "image_size=16",
        "train_samples=512",
        "val_samples=128",
        "shard_size=100",
        "progress=false",
        cwd=in_tmp,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"wrote 512 training and 128 validation maps of 16x16 to mydata in [\d.]+ s \([\d,]+ maps/s\)", done.stdout
    )
    assert len(list((in_tmp / "mydata/train").glob("*-x.npy"))) == 6
    done = run_cli("data", "check", "mydata", cwd=in_tmp)
    assert "train: 512 maps of shape (1, 16, 16), 3 targets, 6 shards: ok" in done.stdout
    done = run_cli("train", "tiny", "data_dir=mydata", "max_steps=4", "progress=false", "plot=false", cwd=in_tmp)
    assert done.returncode == 0 and "from mydata" in done.stdout, done.stderr


def test_data_check_names_shards_with_nan_or_inf(in_tmp):
    import numpy as np

    done = run_cli(
        "data",
        "generate",
        "--out",
        "mydata",
        "image_size=8",
        "train_samples=200",
        "val_samples=100",
        "shard_size=100",
        "progress=false",
        cwd=in_tmp,
    )
    assert done.returncode == 0, done.stderr
    for name, value, where in (
        ("train/shard-00001-x.npy", np.nan, (3, 0, 2, 5)),
        ("val/shard-00000-y.npy", np.inf, (5, 1)),
    ):
        array = np.load(in_tmp / "mydata" / name)
        array[where] = value
        np.save(in_tmp / "mydata" / name, array)
    done = run_cli("data", "check", "mydata", cwd=in_tmp)
    assert done.returncode == 2, done.stdout
    assert "train: mydata/train/shard-00001-x.npy holds 1 NaN or infinite value(s)" in done.stdout
    assert "val: mydata/val/shard-00000-y.npy holds 1 NaN or infinite value(s)" in done.stdout
    assert "train: 200 maps of shape (1, 8, 8), 3 targets, 2 shards: NOT ok" in done.stdout
    assert "2 shard file(s) in mydata hold NaN or infinite values" in done.stderr


LEAVES_AT_ONCE = """
import argparse, atexit
from dlscale import cli, distributed
atexit.register(print, "the interpreter finalized")  # (what finalizing runs; gloo's threads could abort there)
def failing(args):
    raise distributed.PeerFailedError("rank 0 of 2 stopped: a collective operation failed")
def build_parser():
    parser = argparse.ArgumentParser()
    parser.set_defaults(handler=failing)
    return parser
cli.build_parser = build_parser
cli.main([])
"""


def test_a_rank_whose_peer_died_says_so_in_one_line_and_leaves_without_finalizing(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", LEAVES_AT_ONCE], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr == "dlscale: error: rank 0 of 2 stopped: a collective operation failed\n"
    assert "finalized" not in done.stdout
