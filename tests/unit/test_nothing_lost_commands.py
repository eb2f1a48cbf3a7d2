"""Nothing lost, third sweep (#74): the commands. An export or a generated file is written whole and never through a
link, so a failure or a planted link leaves the user's files as they were; what ``data check`` passes, training
reads; and a file or value a command cannot use is refused in one line naming it, never a traceback."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.cli import main
from dlscale.data import DataError
from dlscale.train import train


def _refused(capfd, *args: str) -> str:
    """The one line ``dlscale ARGS`` says as it exits with status 2 (the test fails on a traceback or more lines)."""
    code = main(list(args))
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (args, lines)
    return lines[0]


def _notebook(path: Path, cells: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def _recipe_cell(name: str = "05_ddp.py") -> dict:
    return {"cell_type": "code", "metadata": {"tags": ["recipe"]}, "source": [f"# recipes/{name}\n", "print(1)\n"]}


def _shards(folder: Path, rows: int = 16) -> None:
    from dlscale.data.shards import write_shards

    rng = np.random.default_rng(0)
    write_shards(folder, rng.random((rows, 1, 8, 8)), rng.random((rows, 3)), shard_size=8)


def _run_folder(cfg) -> None:
    """A run folder as training leaves it (its config and one checkpoint of a fresh model), without training."""
    from dlscale.checkpoint import save_checkpoint
    from dlscale.models import build_model

    cfg.save(cfg.resolved_run_dir / "config.yaml")
    save_checkpoint(cfg.resolved_run_dir, 1, {"model": build_model(cfg, 1, 3).state_dict()})


# --- data lost ---------------------------------------------------------------------------------------------------


def test_an_export_that_fills_the_disk_keeps_the_previous_export(tiny, capfd, monkeypatch):
    _run_folder(tiny())
    assert main(["export", "runs/tiny", "model.pt"]) == 0
    good = Path("model.pt").read_bytes()
    capfd.readouterr()

    def full(obj, target, *args, **kwargs):  # (some bytes written, then the disk is full)
        if isinstance(target, (str, os.PathLike)):  # (a save to OUT itself, as before #74)
            with open(target, "wb") as handle:
                handle.write(bytes(4096))
        else:
            target.write(bytes(4096))
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(torch, "save", full)
        line = _refused(capfd, "export", "runs/tiny", "model.pt")
    assert f"{Path.cwd()} is on a full disk or over its quota; the file there is unchanged" in line, line
    assert Path("model.pt").read_bytes() == good
    assert torch.load("model.pt", weights_only=True)["config"]["name"] == "tiny"
    assert sorted(p.name for p in Path.cwd().iterdir()) == ["model.pt", "runs"]  # (no temporary file left)
    # a folder that takes no new file, whoever runs it (root passes the permission check; the write then fails)
    assert "/proc/version" in _refused(capfd, "export", "runs/tiny", "/proc/version")


def test_an_export_to_a_folder_a_device_or_a_pipe_is_refused_in_one_line(tiny, capfd):
    _run_folder(tiny())
    Path("folder").mkdir()
    os.mkfifo("pipe")
    for out, said in (
        ("folder/", "folder/ is a folder: name the file to write in it"),
        ("folder", "folder is a folder: name the file to write in it"),
        ("pipe", "pipe is not a regular file"),
        ("/dev/null", "/dev/null is not a regular file"),
    ):
        assert said in _refused(capfd, "export", "runs/tiny", out)
    assert sorted(os.listdir()) == ["folder", "pipe", "runs"] and not os.listdir("folder")


def test_recipes_and_exercises_replace_a_link_and_leave_its_target_alone(in_tmp, capfd, monkeypatch):
    _notebook(Path("nb/05_ddp.ipynb"), [_recipe_cell()])
    _notebook(Path("sol/01.ipynb"), [{"cell_type": "code", "metadata": {}, "source": "x = 1\n", "outputs": []}])
    for name in ("mine.py", "mine.ipynb"):
        Path(name).write_text("the attendee's own file\n")
    for link, target in (("recipes/05_ddp.py", "../mine.py"), ("ex/01.ipynb", "../mine.ipynb")):
        Path(link).parent.mkdir()
        os.symlink(target, link)
    assert main(["recipes", "--notebooks", "nb", "--recipes", "recipes"]) == 0
    assert main(["exercises", "--solutions", "sol", "--exercises", "ex", "--notebooks", "nb"]) == 0
    for name in ("mine.py", "mine.ipynb"):
        assert Path(name).read_text() == "the attendee's own file\n"
    assert not Path("recipes/05_ddp.py").is_symlink() and "print(1)" in Path("recipes/05_ddp.py").read_text()
    assert not Path("ex/01.ipynb").is_symlink() and json.loads(Path("ex/01.ipynb").read_text())["cells"]
    assert sorted(os.listdir("recipes")) == ["05_ddp.py"] and sorted(os.listdir("ex")) == ["01.ipynb"]
    assert "recipes/05_ddp.py" in capfd.readouterr().out
    # a recipe that cannot be written whole (a full disk) leaves the one there as it was, and says where
    written = Path("recipes/05_ddp.py").read_bytes()
    _notebook(Path("nb/05_ddp.ipynb"), [{**_recipe_cell(), "source": "# recipes/05_ddp.py\nprint(2)\n"}])

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full)
        line = _refused(capfd, "recipes", "--notebooks", "nb", "--recipes", "recipes")
    assert f"recipes/05_ddp.py was not written: {Path('recipes').absolute()} is on a full disk" in line, line
    assert Path("recipes/05_ddp.py").read_bytes() == written and os.listdir("recipes") == ["05_ddp.py"]


# --- what data check passes, training reads ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, said",
    [
        ("big-endian", r"shard data/train/shard-00001-x.npy holds >f4 values, in another byte order"),
        ("manifest", r"data/manifest.json is not valid JSON"),
        ("names", r"data/manifest.json: target_names must list the 3 target column\(s\)"),
    ],
)
def test_data_check_refuses_what_training_refuses_in_the_same_words(tiny, capfd, damage, said):
    _shards(Path("data/train"))
    _shards(Path("data/val"))
    if damage == "big-endian":
        np.save("data/train/shard-00001-x.npy", np.load("data/train/shard-00001-x.npy").astype(">f4"))
    else:
        Path("data/manifest.json").write_text('{"target_names": [' if damage == "manifest" else '{"target_names": 3}')
    main(["data", "check", "data"])
    checked = capfd.readouterr().err.strip().splitlines()
    assert len(checked) == 1, checked
    with pytest.raises(DataError, match=said) as refused:
        train(tiny(data_dir="data", image_size=8, max_steps=1, global_batch_size=8))
    assert checked[0] == f"dlscale: error: {refused.value}" and "\n" not in str(refused.value)


# --- tracebacks left -----------------------------------------------------------------------------------------------


def test_an_image_that_is_no_image_is_named(in_tmp, capfd):
    Path("x.png").write_text("not a picture\n")  # (Pillow: SyntaxError)
    Path("y.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))  # (Pillow: OSError, truncated)
    for name in ("x.png", "y.png"):
        line = _refused(capfd, "kmeans", "--image", name, "--out", "km")
        assert f"{name} is not an image that can be read" in line and "give a PNG or JPEG" in line, line


def test_a_config_nested_too_deep_or_a_number_too_long_is_named(in_tmp, capfd):
    digits = "1" * 5000  # (more than Python turns into an int)
    Path("deep.yaml").write_text("max_steps: " + "[" * 30_000 + "]" * 30_000 + "\n")
    Path("long.yaml").write_text(f"inherit: tiny\nmax_steps: {digits}\n")
    assert "deep.yaml: line 1 nests values more than 8 levels deep" in _refused(capfd, "train", "deep.yaml")
    for args in (["long.yaml"], ["tiny", f"max_steps={digits}"], ["tiny", f"profile_steps=1,{digits}"]):
        line = _refused(capfd, "train", *args)
        assert "takes whole numbers from -(2**63 - 1) to 2**63 - 1 (19 digits), got a number of 5,000 digits" in line
        assert ("'profile_steps'" if "profile" in args[-1] else "'max_steps'") in line and len(line) < 200
    assert not Path("runs").exists()


def test_a_notebook_that_is_no_notebook_is_named(in_tmp, capfd):
    cells = {
        "broken.ipynb": '{"cells": [',
        "nosource.ipynb": json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": ["recipe"]}}]}),
        "deep.ipynb": "[" * 100_000 + "]" * 100_000,
    }
    said = {
        "broken.ipynb": " is not a notebook: it is not valid JSON",
        "nosource.ipynb": ", cell 0: the cell has no source",
        "deep.ipynb": " is not a notebook: its JSON nests thousands of levels deep",
    }
    for name, text in cells.items():
        for folder in ("nb", "sol"):
            Path(folder).mkdir(exist_ok=True)
            for old in Path(folder).glob("*.ipynb"):
                old.unlink()
            Path(folder, name).write_text(text)
        for args in (
            ["recipes", "--notebooks", "nb", "--recipes", "recipes"],
            ["exercises", "--solutions", "sol", "--exercises", "ex", "--notebooks", "nb"],
        ):
            line = _refused(capfd, *args)
            assert f"{args[2]}/{name}{said[name]}" in line, line
    assert not Path("recipes").exists() and not Path("ex").exists()
