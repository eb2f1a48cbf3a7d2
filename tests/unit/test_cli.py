"""The dlscale command: its arguments checked, its errors one line each."""

import json
import re
import sys

import pytest

from ..conftest import ROOT, run_cli


def test_python_dash_m_dlscale_train_is_the_same_command(in_tmp):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "dlscale.train", "tiny", "max_steps=5", "progress=false", "plot=false"],
        cwd=in_tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "step 5/5" in done.stdout


def test_help_explains_every_key_and_command(in_tmp):
    top = run_cli("--help", cwd=in_tmp).stdout
    for command in ("train", "data", "exercises", "info"):
        assert command in top
    train_help = run_cli("train", "--help", cwd=in_tmp).stdout
    from dlscale.config import FIELDS

    for key in FIELDS:
        assert f"\n  {key} (" in train_help, key
    assert "global_batch_size (int, default 64)" in train_help and "optimizer (adamw|sgd" in train_help
    assert "75 stopped on SIGTERM/SIGUSR1" in train_help


def test_info_reports_the_launcher(in_tmp):
    done = run_cli("info", cwd=in_tmp, env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert re.search(r"launcher\s+slurm", done.stdout)
    assert re.search(r"torch\s+2\.", done.stdout)


def test_exercises_check_reports_drift(in_tmp):
    assert (
        run_cli(
            "exercises",
            "--check",
            "--solutions",
            str(ROOT / "solutions"),
            "--exercises",
            str(ROOT / "exercises"),
            cwd=in_tmp,
        ).returncode
        == 0
    )
    done = run_cli("exercises", "--check", "--solutions", str(ROOT / "solutions"), "--exercises", "empty", cwd=in_tmp)
    assert done.returncode == 1 and "out of date" in done.stderr


def _fake_run(folder, **summary):
    """A run folder as `dlscale report` and `plan` read it: summary.json, and an R² of 0.5 at step 10."""
    folder.mkdir(parents=True)
    fields = {
        "world_size": 1,
        "nodes": 1,
        "samples_per_s": 100.0,
        "global_batch_size": 32,
        "r2": 0.5,
        "seconds": 10.0,
        **summary,
    }
    (folder / "summary.json").write_text(json.dumps(fields))
    (folder / "validation.csv").write_text("epoch,step,mse,r2\n1,10,0.1,0.5\n")
    (folder / "metrics.csv").write_text(
        "step,loss,lr,samples_per_s\n" + "".join(f"{s},0.1,0.001,100.0\n" for s in range(1, 11))
    )
    return folder


# Numbers out of range, and files a hostile user (or a crash) leaves behind: each is one line naming the argument,
# key or file, and exit status 2, never a traceback nor a result that looks valid (a 110% efficiency).
MISTAKES = [
    (["project", "--ms-per-sample", "-1"], "argument --ms-per-sample: must be above 0, not -1"),
    (["project", "--ms-per-sample", "0.26", "--batch", "-64"], "argument --batch: must be at least 1, not -64"),
    (["project", "--ms-per-sample", "0.26", "--overlap", "2"], "argument --overlap: must be at most 1, not 2"),
    (["project", "--ms-per-sample", "nan"], "argument --ms-per-sample: must be a finite number, not nan"),
    (
        ["project", "--samples-per-s", "2600", "--step-ms", "25"],
        "argument --step-ms: not allowed with argument --samples-per-s",
    ),
    (["project", "--samples-per-s", "2600", "--gpus-per-node", "0"], "argument --gpus-per-node: must be at least 1"),
    (["project", "--samples-per-s", "2600", "--machine", "half.yaml"], "half.yaml: between needs bandwidth_gbs"),
    (["project", "--samples-per-s", "2600", "--machine", "nowhere.yaml"], "nowhere.yaml cannot be read ("),
    (
        ["project", "--samples-per-s", "2600", "--breakdown", "nowhere.json"],
        "nowhere.json gives no overlap (No such file or directory)",
    ),
    (
        ["recipes", "--notebooks", "nb", "--recipes", "out"],
        "x.ipynb: a cell tagged recipe must start with '# recipes/NAME.py'",
    ),
    (["plan", "sweep", "--overlap", "5"], "argument --overlap: must be at most 1, not 5"),
    (["bench", "breakdown", "tiny", "--sizes=-1"], "argument --sizes: must be at least 1, not -1"),
    (["bench", "breakdown", "tiny", "--sizes", "1,x"], "argument --sizes: a whole number is needed, not 'x'"),
    (["bench", "breakdown", "tiny", "--steps", "0"], "argument --steps: must be at least 10, not 0"),
    (["bench", "breakdown", "tiny", "--rounds", "0"], "argument --rounds: must be at least 1, not 0"),
    (["bench", "breakdown", "tiny", "--sizes", "1000000000"], "--sizes 1000000000: this process has"),
    (
        ["hpo", "start", "tiny", "--dir", "study", "--workers", "0", "--grace-s", "1"],
        "grace_s=1 must be at least 3 heartbeats (6 s with heartbeat_s=2)",
    ),
    (
        ["plan", "negative", "--site", "perlmutter"],
        "negative/run-n1/summary.json: nodes must be a whole number of at least 1, not -2",
    ),
    (["report", "cut"], "cut/run-n1/summary.json cannot be read ("),
    (["plan", "low", "--site", "perlmutter", "--target-r2", "0.99"], "no run of the series reached the target R²"),
    (["train", "tiny", "lr=nan"], "config key 'lr' must be a finite number, got nan"),
    (["hpo", "start", "tiny", "--dir", "afile", "--workers", "0"], "afile is a file, not a study folder"),
    (["hpo", "worker", "--dir", "typo"], "no study in typo (no study.json)"),
    (
        ["hpo", "start", "choices.yaml", "--dir", "s"],
        "parameter 'optimizer': choices must be a list, e.g. choices: ['adamw']",
    ),
    (["hpo", "start", "count.yaml", "--dir", "s"], "parameter 'optimizer': choices must be a list"),
    (
        ["hpo", "start", "step.yaml", "--dir", "s"],
        "step applies to integer keys and must be a whole number of at least 1, got 'two'",
    ),
    (["hpo", "start", "log.yaml", "--dir", "s"], "parameter 'lr': log must be true or false, got 'false'"),
    (["hpo", "start", "fixed.yaml", "--dir", "s"], "'fixed' must map config keys to values"),
    (["hpo", "start", "latin1.yaml", "--dir", "s"], "latin1.yaml is not valid YAML text (UTF-8)"),
    (["plan", "low", "--allreduce", "missing.json"], "missing.json cannot be read (No such file or directory)"),
    (["plan", "low", "--allreduce", "one-size.json"], "one-size.json has fewer than two message sizes timed"),
    (
        ["plan", "low", "--allreduce", "zero.json"],
        "zero.json is not an all-reduce result: every row needs bytes and ms above 0",
    ),
    # #61: paths out of recipes/, configs that are not configs (a YAML bomb refused at once), numbers out of range
    (["recipes", "--notebooks", "up", "--recipes", "out"], "a recipe cell must name a plain file in recipes/"),
    (["recipes", "--notebooks", "abs", "--recipes", "out"], "not '# recipes//"),
    (["recipes", "--check", "--notebooks", "nonexist"], "nonexist is not a folder of notebooks"),
    (["train", "latin1.yaml"], "config latin1.yaml is not UTF-8 text"),
    (["train", "model.pt"], "config model.pt is not UTF-8 text"),
    (["train", "inherit.yaml"], "inherit.yaml: 'inherit' names a config (a shipped name or a YAML path), got 5"),
    (["train", "bomb.yaml"], "config bomb.yaml: line 2 uses the YAML alias *a: configs take no aliases"),
    (["train", "huge.yaml"], "config huge.yaml is 70,003 bytes"),
    (["train", "tiny", "seed=-1"], "config key 'seed' must be a whole number from 0 to 4294967295, got -1"),
    (["train", "tiny", "seed=1e23"], "config key 'seed' expects int, got '1e23'"),
    (["train", "tiny", "threads=-5"], "config key 'threads' must be 0 (auto) or a number of threads >= 1, got -5"),
    (["project", "--samples-per-s", "2600", "--parameters", "1e30"], "argument --parameters: must be at most 1e+14"),
    (["project", "--samples-per-s", "2600", "--parameters", "0"], "argument --parameters: must be at least 1, not 0"),
    (["project", "--samples-per-s", "2600", "--between-gbs", "1e-320"], "argument --between-gbs: must be at least"),
    (["report", "low", "--out", "afile/table"], "afile/table"),
    (["data", "generate", "--out", "gen", "image_size=65536"], "maps of 65536x65536 take 147,456.0 GiB, but . has"),
    (["hpo", "worker", "--dir", "damaged"], "damaged/study.json is not valid JSON"),
    (["hpo", "worker", "--dir", "unknown"], "unknown/study.json"),
    # #60: comma lists took no type (a ValueError traceback); a mistyped command, an option for a setting
    (["bench", "scaling", "tiny", "--procs", "1,x"], "argument --procs: a whole number is needed, not 'x'"),
    (["bench", "kmeans", "--procs", "1,x"], "argument --procs: a whole number is needed, not 'x'"),
    (["bench", "kmeans", "--photo-k", "16,sixty"], "argument --photo-k: a whole number is needed, not 'sixty'"),
    (["bench", "breakdown", "tiny", "--buckets", "x"], "argument --buckets: a number is needed, not 'x'"),
    (["trian", "tiny"], "no command 'trian'; did you mean 'train'?"),
    (["train", "tiny", "--epochs", "2"], "unrecognized arguments: --epochs 2; a setting is key=value, as epochs=2"),
]

#: Search spaces a hand can get wrong: a string for a list, a word for a number, a quoted boolean, a list for a map.
BAD_SPACES = {
    "choices.yaml": "optimizer: {choices: adamw}",
    "count.yaml": "optimizer: {choices: 5}",
    "step.yaml": "warmup_steps: {low: 0, high: 8, step: two}",
    "log.yaml": 'lr: {low: 0.001, high: 0.01, log: "false"}',
}


def test_every_mistake_in_the_table_is_one_line_without_a_traceback(in_tmp, capfd):
    from dlscale.cli import main

    _fake_run(in_tmp / "negative/run-n1", nodes=-2)
    (_fake_run(in_tmp / "cut/run-n1") / "summary.json").write_text('{"world_size": 1, "nod')
    _fake_run(in_tmp / "low/run-n1")
    (in_tmp / "afile").write_text("not a folder")
    row = {"bytes": 4096, "ms": 0.1, "world_size": 2}
    (in_tmp / "one-size.json").write_text(json.dumps([row, {**row, "ms": 0.2}]))
    (in_tmp / "zero.json").write_text(json.dumps([{**row, "ms": 0.0}, {**row, "bytes": 8192, "ms": 0.0}]))
    for name, parameter in BAD_SPACES.items():
        (in_tmp / name).write_text(f"name: s\nbase: tiny\nparameters:\n  {parameter}\n")
    (in_tmp / "fixed.yaml").write_text("name: s\nbase: tiny\nfixed: [epochs, 2]\nparameters:\n  lr: [0.001, 0.01]\n")
    (in_tmp / "nb").mkdir()
    (in_tmp / "nb/x.ipynb").write_text(
        json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": ["recipe"]}, "source": ["print(1)\n"]}]})
    )
    (in_tmp / "half.yaml").write_text("gpus_per_node: 4\ninside: {bandwidth_gbs: 100}\n")
    (in_tmp / "latin1.yaml").write_bytes("name: s\nbase: tiny  # réglé\n".encode("latin-1"))
    for folder, first_line in (("up", "# recipes/../escaped.py"), ("abs", f"# recipes/{in_tmp}/abs.py")):
        (in_tmp / folder).mkdir()
        (in_tmp / folder / "x.ipynb").write_text(
            json.dumps(
                {
                    "cells": [
                        {"cell_type": "code", "metadata": {"tags": ["recipe"]}, "source": [f"{first_line}\nprint(1)\n"]}
                    ]
                }
            )
        )
    (in_tmp / "model.pt").write_bytes(b"PK\x03\x04" + bytes(range(256)))
    (in_tmp / "inherit.yaml").write_text("inherit: 5\n")
    nine = ", ".join(["*a"] * 9)  # (four levels of nine: 6,561 copies from 150 bytes; more levels take minutes)
    (in_tmp / "bomb.yaml").write_text(
        f"a: &a [x, x]\nb: &b [{nine}]\nc: &c [{nine.replace('a', 'b')}]\nd: [{nine.replace('a', 'c')}]\n"
    )
    (in_tmp / "huge.yaml").write_text("# " + "x" * 70_000 + "\n")
    (in_tmp / "damaged").mkdir()
    (in_tmp / "damaged/study.json").write_text('{"name": "s", "ba')
    (in_tmp / "unknown").mkdir()
    (in_tmp / "unknown/study.json").write_text('{"name": "s", "colour": "red"}')
    for args, message in MISTAKES:
        try:
            code = main(args)
        except SystemExit as exit:  # (argparse exits on a bad argument)
            code = exit.code
        lines = capfd.readouterr().err.strip().splitlines()
        assert code == 2, (args, lines)
        assert message in lines[-1], (args, lines)
        assert len(lines) == 1, (args, lines)
    assert not (in_tmp / "study").exists() and not (in_tmp / "typo").exists()  # refused: no folder left behind
    assert not (in_tmp / "escaped.py").exists() and not (in_tmp / "abs.py").exists() and not (in_tmp / "gen").exists()


def _typed_options(parser, path=()):
    """(command path, option) for every option of every command that takes a typed value (a number, a list)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _typed_options(sub, (*path, name))
        elif action.option_strings and action.type not in (None, str) and action.nargs != 0:
            yield path, action.option_strings[-1]


def test_every_typed_option_of_every_command_says_a_bad_value_in_one_line(capfd):
    """#60: no value on the command line can end in a traceback: each typed option refuses a word in one line."""
    from dlscale.cli import build_parser, main

    found = list(_typed_options(build_parser()))
    assert len(found) >= 30 and (("bench", "kmeans"), "--photo-k") in found  # (the walk reaches nested commands)
    for path, option in found:
        with pytest.raises(SystemExit) as stopped:
            main([*path, option, "not-a-value"])
        err = capfd.readouterr().err
        assert stopped.value.code == 2 and "Traceback" not in err, (path, option, err)
        assert err.count("\n") == 1 and f"argument {option}" in err, (path, option, err)
