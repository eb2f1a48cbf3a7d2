"""The attendee's stage, gap by gap (#57): each TODO asks for a behaviour without naming its answer's API; each
gap's answer, taken out of our stage (or replaced by its commonest wrong variant), makes the lesson's own check fail
with a message that starts with that gap's label. The stages run in this process as one rank, at the tiny size."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from dlscale.lessons.gaps import answer_lines, api_names, hint
from dlscale.lessons.recipe_folder import recipe_path
from dlscale.lessons.stage_check import check_gaps
from dlscale.lessons.stage_probes import run_stage
from dlscale.lessons.stage_record import Variant
from dlscale.lessons.stages import all_stages

#: Every stage file whose gaps show in one process, in lesson order (the pipeline's show on two ranks or more: its
#: stage and variants run on engines in tests/integration/test_recipes.py).
STAGE_FILES = [stage.file for stage in all_stages().values() if stage.check_ranks == 1]


def _defined(code: str) -> set[str]:
    """Names a stage or its tools define themselves (functions, arguments, variables): not an API to hide."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_no_todo_names_the_api_its_answer_uses():
    tools = _defined(recipe_path("training_tools.py").read_text())
    dictating = []
    for stage in all_stages().values():
        own = (_defined(recipe_path(stage.file).read_text()) | tools) - {"compile", "autocast"}
        for gap in stage.gaps:
            answer = api_names(answer_lines(gap.id)) - own
            for text in (gap.asks, gap.question):  # (the TODO and the first hint ask; the second names the API)
                named = sorted(name for name in answer if re.search(rf"\b{re.escape(name)}\b", text))
                if named:
                    dictating.append((gap.id, named))
    assert dictating == []
    assert sum(len(stage.gaps) for stage in all_stages().values()) >= 22


def test_every_gap_has_a_probe_or_is_named_by_the_numbers_and_its_name_is_its_own():
    for stage in all_stages().values():
        assert {g.id for g in stage.gaps if g.probe} | set(stage.by_numbers[0]) == set(stage.gap_ids), stage.file
        assert all(gap_id.startswith(stage.lesson + ".") for gap_id in stage.gap_ids)
        assert len(set(stage.gap_ids)) == len(stage.gap_ids) and stage.file.startswith(stage.lesson + "_")


def test_a_hint_asks_first_then_names_the_api_then_shows_our_lines(capsys):
    hint("05.e")
    first = capsys.readouterr().out
    assert "?" in first and "set_epoch" not in first and "again names the API" in first
    hint("05.e")
    assert "sampler.set_epoch(epoch)" in capsys.readouterr().out
    hint("05.e")
    assert "sampler.set_epoch(epoch)  # a new order every epoch" in capsys.readouterr().out


# -- our stage, and our stage with one gap taken out ----------------------------------------------------------------

#: How each stage runs here: one epoch of the tiny set on the CPU, in this process as a job of one rank.
SETTINGS = {
    "01_baseline.py": {},
    "02_data_loading.py": {"workers": 1},
    "03_mixed_precision.py": {"workers": 0, "precision": "fp16"},
    "04_compile.py": {"workers": 0, "precision": "fp32", "compile": False},
    "05_ddp.py": {"workers": 0, "precision": "fp32", "compile": False},
    "06_horovod.py": {"workers": 0, "precision": "fp32", "compile": False},
    "07_large_batch.py": {"workers": 0, "precision": "fp32", "compile": False, "batch_size": 64},
    "10_fsdp_tp.py": {"workers": 0, "precision": "fp32"},
}


@pytest.fixture
def stage_folder(tmp_path, monkeypatch):
    """A folder for one test's runs (the micro data set is generated there in a fraction of a second), as a job
    of one rank."""
    from dlscale.distributed import free_port

    monkeypatch.chdir(tmp_path)
    Path("micro.yaml").write_text("inherit: tiny\ntrain_samples: 128\nval_samples: 64\n")  # (4 steps of 32)
    for name, value in dict(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    ).items():
        monkeypatch.setenv(name, value)
    return tmp_path


def _run(stage: str, path: str, tag: str, settings: dict | None = None) -> dict:
    settings = {**SETTINGS[stage], **(settings or {})}
    return run_stage(path, config="micro.yaml", epochs=1, device="cpu", checkpoint=f"runs/{tag}-checkpoint", **settings)


@pytest.mark.parametrize("stage", STAGE_FILES)
def test_our_stage_passes_every_probe(stage, stage_folder):
    if stage == "06_horovod.py":
        pytest.importorskip("horovod.torch", reason="needs Horovod (make horovod)")
    result = _run(stage, str(recipe_path(stage)), stage[:2])
    assert result["error"] is None and result["ours"]
    check_gaps(stage, result)


# -- what attendees write: each wrong answer caught and named by its one gap, each right one accepted ----------------


def variant_source(stage: str, variant: Variant) -> str:
    """Our stage with a variant's edits: each replaces the first line holding ``old``; the lines of ``new`` after its
    first take that line's indentation plus their own."""
    lines = recipe_path(stage).read_text().splitlines()
    for old, new in variant.edits:
        index = next((i for i, line in enumerate(lines) if old in line), None)
        assert index is not None, f"{stage}: no line holds {old!r} ({variant.what})"
        line = lines[index]
        indent = line[: len(line) - len(line.lstrip())]
        first, *rest = new.split("\n")
        lines[index : index + 1] = [line.replace(old, first, 1), *(indent + more if more else "" for more in rest)]
    return "\n".join(lines) + "\n"


VARIANTS = [
    pytest.param(stage.file, gap.id, kind, variant, id=f"{gap.id}-{kind}-{variant.what.replace(' ', '_')}")
    for stage in all_stages().values()
    if stage.check_ranks == 1
    for gap in stage.gaps
    for kind, variants in (("wrong", gap.mistakes), ("right", gap.alternatives))
    for variant in variants
]

_TWINS: dict[tuple, dict] = {}


def _twin(stage: str, settings: dict) -> dict:
    """The engine's twin of a variant's run (the same for every variant with these settings: computed once)."""
    from dlscale.lessons.parity import engine_twin

    arguments = {**SETTINGS[stage], **settings, "config": "micro.yaml", "epochs": 1, "device": "cpu"}
    key = (stage, tuple(sorted(arguments.items())))
    if key not in _TWINS:
        _TWINS[key] = engine_twin(stage, name=f"twin-{stage[:2]}", **arguments)
    return _TWINS[key]


def test_every_gap_has_three_wrong_answers_and_two_right_ones_to_try():
    for stage in all_stages().values():
        for gap in stage.gaps:
            if gap.id not in ON_TWO_RANKS:
                assert len(gap.mistakes) >= 3 and len(gap.alternatives) >= 2, gap.id


#: Shown on two ranks only (a split needs tp > 1): tests/integration/test_recipes.py.
ON_TWO_RANKS = {"10.b"}


@pytest.mark.parametrize(("stage", "gap_id", "kind", "variant"), VARIANTS)
def test_what_attendees_write_is_judged_by_the_lessons_check(stage, gap_id, kind, variant, stage_folder):
    from dlscale.lessons.stage_check import check_stage

    if stage == "06_horovod.py":
        pytest.importorskip("horovod.torch", reason="needs Horovod (make horovod)")
    path = stage_folder / f"variant_{stage}"
    path.write_text(variant_source(stage, variant))
    result = _run(stage, str(path), gap_id, dict(variant.settings))
    twin = _twin(stage, dict(variant.settings))
    if kind == "right":
        check_stage(stage, result, twin)
        return
    with pytest.raises(AssertionError) as caught:
        check_stage(stage, result, twin)
    message, named = str(caught.value), variant.names or gap_id
    assert "\n" not in message, message
    if named == "outside":
        assert "outside the gaps" in message and "TODO " not in message, message
    else:
        assert re.findall(r"TODO (\d\d\.[a-z])", message) == [named], message


# -- catch up, start over ---------------------------------------------------------------------------------------


def test_ours_beside_theirs_is_the_difference_only():
    from dlscale.lessons.recipes import ours_beside_theirs, use_ours

    ours = recipe_path("05_ddp.py").read_text()
    assert ours_beside_theirs("05", ours) == ""
    theirs = ours.replace("sampler.set_epoch(epoch)  # a new order", "# sampler.set_epoch(epoch)  # a new order")
    diff = ours_beside_theirs("05", "%%writefile runs/lesson05/my_05_ddp.py\n" + theirs)
    assert "-        # sampler.set_epoch(epoch)" in diff and "+        sampler.set_epoch(epoch)" in diff
    assert len([line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]) == 2
    assert callable(use_ours("01")) and use_ours("05").endswith("recipes/05_ddp.py")


def test_a_lesson_reset_removes_that_lessons_runs_and_nothing_else(tmp_path, capfd):
    from dlscale.cli import main

    runs = tmp_path / "runs"
    for folder in ("lesson05", "lesson05_engine_twin/checkpoints", "lesson050", "lesson04", "mine"):
        (runs / folder).mkdir(parents=True)
        (runs / folder / "kept-or-not.txt").write_text("x")
    (runs / "lesson05/my_05_ddp.py").write_text("# the attendee's stage\n")
    assert main(["lessons", "reset", "05", "--runs", str(runs)]) == 0
    assert "lesson 05 starts over: 2 run folder(s) or file(s) removed" in capfd.readouterr().out
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*") if p.is_file()) == sorted(
        ["lesson04/kept-or-not.txt", "lesson050/kept-or-not.txt", "lesson05/my_05_ddp.py", "mine/kept-or-not.txt"]
    )
    assert main(["lessons", "reset", "5"]) == 2


def test_the_docs_table_lists_every_gap():
    table = (Path(__file__).resolve().parents[2] / "docs/stage-checks.md").read_text()
    rows = re.findall(r"^\| (\d\d\.[a-e]) ([^|]+?) \|", table, re.MULTILINE)
    assert rows == [(gap.id, gap.title) for stage in all_stages().values() for gap in stage.gaps]


def test_a_rank_that_waited_for_a_skipped_collective_is_named_by_the_gap_of_its_line():
    """The wait itself is bounded on two ranks in tests/integration/test_stage_waits.py; here, its verdict."""
    source = recipe_path("10_fsdp_tp.py").read_text()
    number = next(i for i, line in enumerate(source.splitlines(), 1) if "dcp.save(" in line)
    error = {
        "type": "RuntimeError",
        "message": "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 120000ms for recv operation",
        "name": None,
        "frames": [{"function": "main", "line": number, "text": source.splitlines()[number - 1].strip()}],
    }
    with pytest.raises(AssertionError) as caught:
        check_gaps("10_fsdp_tp.py", {"error": error, "source": source, "losses": [], "r2": []})
    message = str(caught.value)
    assert message.startswith("TODO 10.e ") and "waited in a collective that another rank never reached" in message
    assert "\n" not in message


def test_after_an_unfinished_stage_a_later_cell_says_so_in_one_line_and_the_stage_cells_keep_their_tracebacks():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from dlscale.lessons.recipes import use_ours
    from dlscale.lessons.unfinished import mark_unfinished

    config = Config()
    config.HistoryManager.enabled = False  # (its history in memory: no database left to write after the test)
    shell = InteractiveShell.instance(config=config)
    try:
        mark_unfinished(
            "03", "TODO 03.a (the precision and the scaler): still to write (it raises NotImplementedError)"
        )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            later = shell.run_cell("print(r2)", store_history=True)  # (a cell after the check: r2 was never made)
        assert out.getvalue().splitlines() == [
            "Lesson 03's stage is not done yet (TODO 03.a (the precision and the scaler)): this cell needs it. "
            'Finish the stage and run its check again, or carry on with our stage: use_ours("03")'
        ]
        assert isinstance(later.error_in_exec, NameError)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            shell.run_cell("def main():\n    pass\nundefined_name", store_history=True)  # (the attendee's own cell)
        assert "Traceback" in out.getvalue() and "not done yet" not in out.getvalue()
        with contextlib.redirect_stdout(io.StringIO()):
            use_ours("03")  # (our stage stands in: errors show as they are again)
            shell.run_cell("print(r2)", store_history=True)
        assert shell.CustomTB is None or shell.custom_exceptions == ()
    finally:
        InteractiveShell.clear_instance()


def test_a_cpu_switch_runs_on_a_gpu_host_only(monkeypatch):
    """Stage 02's CPU switch: on a GPU host the stage runs on the CPU as well (pinning memory there is a mistake only a
    CPU run shows: two held-out answers passed on an H200 without it); where the lesson's run was on the CPU already,
    by name or as ``auto`` without a GPU, no second run."""
    import torch

    from dlscale.lessons.stage_probes import changes_a_setting
    from dlscale.lessons.stages import stage_record

    switch = {"device": "cpu"}
    assert switch in stage_record("02_data_loading.py").switches
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not changes_a_setting({"device": "cpu", "workers": 2}, switch)
    assert not changes_a_setting({"device": "auto", "workers": 2}, switch)
    assert changes_a_setting({"device": "cuda", "workers": 2}, switch)
    assert changes_a_setting({"device": "cuda:1"}, switch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert changes_a_setting({"device": "auto"}, switch)  # (auto means the GPU on a GPU host)
    assert changes_a_setting({"workers": 2}, {"workers": 0}) and not changes_a_setting({"workers": 0}, {"workers": 0})
