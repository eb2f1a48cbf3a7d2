"""A room of attendees at a site (#77): a data set the room can read, every lesson pointed at it, the lessons timed at
full size in one command, K-Means compiled ahead wherever the lessons' environment is built, and the kit alone
installable without Jupyter."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ..conftest import ROOT

#: Tiny sizes for the sets a test generates (a few hundred kilobytes).
SMALL = ["train_samples=64", "val_samples=32", "shard_size=32", "progress=false"]


@contextlib.contextmanager
def umask(mask: int):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


@pytest.fixture
def open_folder():
    """A folder every user may pass through (pytest's own tmp_path lies under a 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="dlscale-room-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command],
        capture_output=True,
        encoding="latin-1",  # (a shard's bytes as they are)
        timeout=60,
    )


def _can_switch_user() -> bool:
    import grp
    import pwd

    try:
        pwd.getpwnam("nobody"), grp.getgrnam("nogroup")
    except KeyError:
        return False
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def _modes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): stat.S_IMODE(path.stat().st_mode) for path in [root, *root.rglob("*")]}


def _generate(out: Path, *options: str, sizes: list[str] = SMALL) -> str:
    """``dlscale data generate [options] --out OUT --config tiny``, in a process of its own (under this umask)."""
    command = [sys.executable, "-m", "dlscale", "data", "generate", *options, "--out", str(out), "--config", "tiny"]
    output = subprocess.run([*command, *sizes], capture_output=True, text=True, timeout=300)
    assert output.returncode == 0, output.stderr[-2000:]
    return output.stdout


# -- 1. the data set, readable by the room ---------------------------------------------------------------------------


def test_generated_data_follow_the_umask_and_another_user_reads_them(open_folder):
    """The set was built in a temporary folder made 0700 and renamed into place: another user got "Permission
    denied". Now it has what the user's umask gives any new folder: under 022, the room reads it."""
    from dlscale.data import FieldSpec, generate_dataset

    out = open_folder / "course" / "tiny"
    with umask(0o022):
        generate_dataset(out, FieldSpec(image_size=16), 64, 32, 32, progress=False)
    modes = _modes(out)
    assert modes["."] == 0o755 and modes["train"] == 0o755, modes
    assert all(mode == 0o644 for name, mode in modes.items() if name.endswith((".npy", ".json"))), modes
    assert not list(out.parent.glob(".tiny.*"))  # (no temporary folder left)
    with umask(0o077):  # a private umask keeps it private
        generate_dataset(open_folder / "private", FieldSpec(image_size=16), 64, 32, 32, progress=False)
    assert stat.S_IMODE((open_folder / "private").stat().st_mode) == 0o700
    if not _can_switch_user():
        pytest.skip("reading as another user needs root and setpriv; the modes above were checked")
    listed = _as_nobody("ls", str(out / "train"))
    assert listed.returncode == 0 and "shard-00000-x.npy" in listed.stdout, listed.stderr
    read = _as_nobody("head", "-c", "6", str(out / "train" / "shard-00000-x.npy"))
    assert read.returncode == 0 and read.stdout == "\x93NUMPY", read.stderr
    refused = _as_nobody("ls", str(open_folder / "private"))
    assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_shared_makes_the_set_and_the_folders_it_makes_readable_by_everyone_whatever_the_umask(open_folder):
    """The guide's command (docs/instructors.md, step 3), under the most private umask: `--shared` opens the set and
    the parent folders it creates to the room, and the command says so; without it, it says who cannot read it."""
    out = open_folder / "project" / "dlscale-data" / "tiny"
    with umask(0o077):
        said = _generate(out, "--shared", sizes=[])  # (the tiny set, as the guide generates it)
        private = _generate(open_folder / "mine" / "tiny")
    assert "readable by every user" in said, said
    modes = _modes(out)
    assert all(mode & 0o555 == 0o555 for name, mode in modes.items() if not name.endswith((".npy", ".json")))
    assert all(mode & 0o444 == 0o444 and mode & 0o022 == 0 for name, mode in modes.items() if name.endswith(".npy"))
    for folder in (open_folder / "project", open_folder / "project" / "dlscale-data"):  # made by the command
        assert stat.S_IMODE(folder.stat().st_mode) & 0o555 == 0o555, folder
    assert "other users cannot read it" in private and "--shared" in private, private
    if _can_switch_user():
        read = _as_nobody("head", "-c", "6", str(out / "val" / "shard-00000-y.npy"))
        assert read.returncode == 0 and read.stdout == "\x93NUMPY", read.stderr


def test_the_command_names_a_folder_above_the_set_that_others_cannot_pass(open_folder):
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    said = _generate(closed / "tiny", "--shared")
    assert f"cannot pass through {closed}" in said, said


# -- 1. every lesson that reads the data set takes data_dir ------------------------------------------------------------

#: The lessons that read the data set (all but these), and why these do not: their runs are the attendee's stage,
#: checked on the tiny set every lesson makes in a second, or they read no maps at all.
NO_DATA_SET = {
    "03_mixed_precision.ipynb": "its runs are the attendee's stage, on the tiny set (the stage check's)",
    "08_distributed_kmeans.ipynb": "K-Means on a photo: no maps",
    "13_pipeline_parallel.ipynb": "its runs are the attendee's stage and its twin, on the tiny set (the stage check's)",
}
#: The solutions that read the data set without data_dir: their checks train at `config` themselves (the check's
#: own data), so the solution reads the set the check does.
SOLUTIONS_WITHOUT = {
    "01_single_device_baseline.ipynb": "check_epochs_needed trains at config",
    "07_large_batch.ipynb": "check_break_and_rescue trains at demo_config",
}
#: Calls that make a run (or its config) from the lesson's config name: each must be given data_dir.
RUN_MAKERS = {"train", "train_quietly", "load_config", "run_on_engines", "run"}
CONFIG_NAMES = {"config", "demo_config"}
#: Statements that build a config from the lesson's config for something other than reading maps.
NOT_READING = {"checkpointing_trade"}  # (random maps: the activations of one batch)


def _notebook(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _parameters(cells: list[dict]) -> str:
    return next("".join(c["source"]) for c in cells if "parameters" in c["metadata"].get("tags", []))


def _code(cells: list[dict]) -> list[str]:
    """The code of the cells the lesson itself runs (not its parameters, nor the stage the attendee writes)."""
    skipped = {"parameters", "attendee", "recipe"}
    sources = []
    for cell in cells:
        if cell["cell_type"] != "code" or skipped & set(cell["metadata"].get("tags", [])):
            continue
        lines = "".join(cell["source"]).split("\n")
        shell = [line.lstrip().startswith(("!", "%")) for line in lines]  # (IPython's: no Python to read)
        sources.append("\n".join(line[: len(line) - len(line.lstrip())] + "pass" if bang else line
                                 for line, bang in zip(lines, shell)))  # fmt: skip
    return sources


def _mentions_data_dir(node: ast.AST, settings_with_data_dir: bool) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name) and inner.id == "data_dir":
            return True
        if isinstance(inner, ast.keyword) and inner.arg is None and isinstance(inner.value, ast.Name):
            if inner.value.id == "settings" and settings_with_data_dir:
                return True
    return False


def _in_order(nodes: list) -> list[ast.stmt]:
    """The statements of ``nodes`` and of the blocks inside them (ifs, loops, functions, tries), in source order."""
    found = []
    for node in nodes:
        if isinstance(node, ast.stmt):
            found.append(node)
        for block in ("body", "orelse", "handlers", "finalbody"):
            found += _in_order(getattr(node, block, None) or [])
    return found


def _runs_without_data_dir(sources: list[str]) -> list[str]:
    """Each statement that makes a run of the lesson's config without data_dir (``settings`` followed in order)."""
    missing, settings_with_data_dir = [], False
    for source in sources:
        for node in _in_order(ast.parse(source).body):
            own = [c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.stmt, ast.excepthandler))]
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "settings" for t in node.targets
            ):
                settings_with_data_dir = _mentions_data_dir(node.value, False)
            text = ast.unparse(node).split("\n", 1)[0]
            for call in (c for part in own for c in ast.walk(part) if isinstance(c, ast.Call)):
                name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                given = {a.id for a in call.args if isinstance(a, ast.Name)}
                if name in RUN_MAKERS and given & CONFIG_NAMES and not any(w in text for w in NOT_READING):
                    if not any(_mentions_data_dir(part, settings_with_data_dir) for part in own):
                        missing.append(text)
                        break
    return missing


def _reads_data_dir(sources: list[str]) -> bool:
    return any(
        isinstance(node, ast.Name) and node.id == "data_dir" and isinstance(node.ctx, ast.Load)
        for source in sources
        for node in ast.walk(ast.parse(source))
    )


@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_every_lesson_that_reads_the_data_set_takes_data_dir_and_passes_it_on(folder):
    """docs/instructors.md told instructors to set data_dir in the lessons' parameters cells, and none had one. Each
    lesson that reads the maps takes it (empty: the kit's own set) and gives it to every run of its config."""
    import papermill

    without = NO_DATA_SET if folder == "notebooks" else {**NO_DATA_SET, **SOLUTIONS_WITHOUT}
    taking = []
    for path in sorted((ROOT / folder).glob("*.ipynb")):
        cells = _notebook(path)
        parameters, code = _parameters(cells), _code(cells)
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")
        names = [line.split("=")[0].strip() for line in parameters.splitlines() if re.match(r"\w+ *=", line)]
        assert list(papermill.inspect_notebook(str(path))) == names, path  # (papermill parses every line)
        if "data_dir" not in names:
            uses_maps = any(re.search(r"\b(train|load_config|prepare_data)\(", source) for source in code)
            assert path.name in without or not uses_maps, f"{path} reads the data set but takes no data_dir"
            continue
        taking.append(path.name)
        assert re.search(r'^data_dir = ""  +# .*(the kit\'s own|none)', parameters, re.M), parameters
        assert _reads_data_dir(code), f"{path}: data_dir is taken but never used"
        assert _runs_without_data_dir(code) == [], path
    if folder == "notebooks":
        assert sorted(taking) == sorted(p.name for p in (ROOT / folder).glob("*.ipynb") if p.name not in without)
    else:
        assert taking == ["02_data_loading.ipynb", "03_mixed_precision.ipynb", "09_scaling_out.ipynb",
                          "11_how_many_nodes.ipynb"]  # fmt: skip


def test_the_static_check_finds_a_run_without_data_dir():
    """The check above, on cells that forget it: it names the statement."""
    cells = [
        'settings = dict(epochs=2, data_dir=data_dir)\nresult = train(config, name="a", **settings)',
        'settings = dict(epochs=2)\nsingle = train_quietly(config, name="b", **settings)',
        'cfg = load_config(demo_config, {"data_dir": data_dir})\ntrade = checkpointing_trade(load_config(config))',
        "ranks = run_on_engines(train, 2, config)",
    ]
    assert _runs_without_data_dir(cells) == [
        "single = train_quietly(config, name='b', **settings)",
        "ranks = run_on_engines(train, 2, config)",
    ]


# -- 3. the lessons at full size, in one command ----------------------------------------------------------------------


def _time_lessons(*options: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/time_lessons.py"), *options, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_time_lessons_full_gives_each_lesson_the_sizes_its_parameters_cell_names_for_a_gpu_node():
    """Step 4 of the guide in one command on a site's GPU node: `scripts/time_lessons.py --full`, rendered (what it
    passes each lesson) without running a lesson. Every full-size value is one the lesson's parameters cell names
    on the line of its parameter, for a GPU node."""
    full = {row["lesson"]: row["parameters"] for row in _time_lessons("--full", "--gpus", "4")}
    assert sorted(full) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert full["01_single_device_baseline.ipynb"] == {"config": "gpu"}
    assert full["02_data_loading.ipynb"] == {"config": "gpu", "worker_counts": [0, 2, 4, 8]}
    assert full["05_data_parallel.ipynb"] == {"engines": 4}
    assert full["07_large_batch.ipynb"] == {"sweep_size": "full", "sweep_multiples": [8, 32, 128]}
    assert full["10_sharded_and_model_parallel.ipynb"] == {"config": "vit", "engines": 4, "memory_width": 256}
    assert full["11_how_many_nodes.ipynb"] == {"sizes": [1, 4]}
    for lesson, parameters in full.items():
        cell = _parameters(_notebook(ROOT / "notebooks" / lesson))
        for key, value in parameters.items():
            line = re.search(rf"^{key} = .*$", cell, re.M)
            assert line, f"{lesson}: {key} is not a parameter of the lesson"
            comment = line[0].split("#", 1)[1] if "#" in line[0] else ""
            per_gpu = key in ("engines", "ranks", "workers", "sizes")
            assert ("one per GPU" in comment) if per_gpu else (json.dumps(value) in comment), (lesson, line[0])
    one_gpu = {row["lesson"]: row["parameters"] for row in _time_lessons("--full", "--gpus", "1")}
    assert one_gpu["05_data_parallel.ipynb"] == {"engines": 2}  # (a lesson compares one rank with several)
    assert {row["parameters"] == {} for row in _time_lessons("01_single_device_baseline.ipynb")} == {True}


# -- 4. K-Means compiled ahead where the lessons' environment is built ------------------------------------------------


def _recipe(makefile: str, target: str) -> list[str]:
    block = re.search(rf"^{target}:.*\n((?:\t.*\n|.*\\\n)*)", makefile, re.M)
    assert block, target
    return [line.strip() for line in block[1].splitlines()]


def test_make_kernel_and_the_image_compile_kmeans_ahead_before_the_kernel_is_registered():
    """`make test` compiled K-Means's loops into numba's cache, `make kernel` and the image did not: every fresh
    kernel of a room paid the compile at its first fit (lesson 08)."""
    compile_ahead = "-m dlscale.kmeans.compile_ahead"
    kernel = _recipe((ROOT / "Makefile").read_text(), "kernel")
    steps = [i for i, line in enumerate(kernel) if compile_ahead in line or "-m dlscale.jobs.kernel" in line]
    assert [compile_ahead in kernel[i] for i in steps] == [True, False], kernel
    assert kernel[steps[0]] == "$(BIN)/python -m dlscale.kmeans.compile_ahead"  # (the kernel's own Python)
    image = (ROOT / "Containerfile").read_text()
    run = re.search(r"^RUN python3 -m pip install .*?(?<!\\)\n", image, re.M | re.S)[0]
    order = [run.index(step) for step in ('-e ".${EXTRAS', f"python3 {compile_ahead}", "-m dlscale.jobs.kernel")]
    assert order == sorted(order), run
    assert "-m dlscale.jobs.kernel --if-jupyter" in run  # (EXTRAS= builds the kit alone: no Jupyter)


def test_the_kernel_is_given_the_numba_cache_that_compile_ahead_filled(tmp_path, monkeypatch):
    """Where NUMBA_CACHE_DIR is set, compile_ahead fills that cache, and the kernel (started without this shell's
    variables) is given it; elsewhere numba's cache beside the package serves both."""
    from dlscale.jobs.kernel import install_kernel, kernel_files

    assert "env" not in json.loads(kernel_files("python", [], "dlscale")["kernel.json"])
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    folder = install_kernel(display_name="dlscale (test)")
    assert json.loads((folder / "kernel.json").read_text())["env"] == {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}


# -- 10. the kit alone, without Jupyter -------------------------------------------------------------------------------


def test_the_kernel_module_imports_without_jupyter_and_names_the_extra(tmp_path):
    """`EXTRAS=` builds the kit alone, and its registration of the kernel failed on jupyter_client's import."""
    script = """
import sys
sys.modules["jupyter_client"] = None  # (not installed)
import dlscale.jobs.kernel as kernel
print("imported")
kernel.main(["--if-jupyter", "--display-name", "dlscale (container)"])
kernel.main([])
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "jupyter")},
    )
    assert done.stdout.splitlines() == [
        "imported",
        "no kernel registered: Jupyter (the notebooks extra) is not installed here, only the kit",
    ], done.stderr[-2000:]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "needs jupyter_client, which is not installed here: pip install -e '.[notebooks]'" in done.stderr
    assert not (tmp_path / "jupyter").exists()
