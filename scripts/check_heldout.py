"""Run the held-out answers (scripts/heldout/answers.py) through the lessons' own stage check, as the lessons run it,
and count: the wrong ones caught, those named by their own gap alone, the right ones accepted, the slowest verdict.

    .venv/bin/python scripts/check_heldout.py [--stages 01,02,03,04,05,07] [--out rows.json] [--device cuda]

Stages 01-04 run in this process (as a lesson's kernel runs them) on a small set; 05, 07 and 13 run their file on two
notebook engines with the lesson's settings and its tiny config, beside the engine's twin on the same engines.
A wrong answer counts as named when the verdict names its gap and no other (or, for one whose change lies outside
the gaps, says "outside the gaps"). A few wrong answers cannot show on one node of CPUs (a rank's number on the node
for its number in the job, gloo for NCCL, pinned memory): the table says which were missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "heldout"))

#: The settings each lesson's check cell runs the stage with (its kernel's or its engines').
KERNEL = {
    "01": {},
    "02": {"workers": 1},
    "03": {"workers": 0, "precision": "fp16"},
    "04": {"workers": 0, "precision": "fp32"},
}
RANKS = {
    "05": {"workers": 0, "precision": "fp32", "compile": False},
    "07": {
        "batch_size": 64,
        "scaling": "sqrt",
        "optimizer_name": "lamb",
        "workers": 0,
        "precision": "fp32",
        "compile": False,
    },
    "13": {"workers": 0},  # (the lesson's 1f1b at 4 micro-batches; its check's short runs: GPipe, interleaved, tp=2)
}


def write_answers(folder: Path, stages: set[str]) -> list[tuple[Path, dict]]:
    """Each answer as a file in ``folder``: our stage with its replacements; with what it is."""
    import answers

    written = []
    for name, expect, where, what, edits in answers.V:
        lesson, letter = name.split("_")[:2]
        if lesson not in stages:
            continue
        stage = answers.STAGE[lesson]
        text = (ROOT / "recipes" / stage).read_text()
        for old, new in edits:
            assert text.count(old) == 1, (name, old[:80])
            text = text.replace(old, new)
        path = folder / f"{name}.py"
        path.write_text(text)
        written.append((path, dict(stage=stage, gap=f"{lesson}.{letter}", expect=expect, where=where, what=what)))
    return written


def verdict_of(check, stage: str, mine: dict, twin: dict) -> str | None:
    try:
        check(stage, mine, twin)
    except AssertionError as failed:
        return str(failed)
    return None


def judged(info: dict, verdict: str | None) -> str:
    if info["expect"] == "right":
        return "accepted" if verdict is None else "rejected"
    if verdict is None:
        return "missed"
    named = re.findall(r"TODO (\d\d\.[a-z])", verdict)
    alone = named == [info["gap"]] or (info["where"] == "outside" and "outside the gaps" in verdict and not named)
    return "named" if alone else "misnamed"


def run_all(written: list[tuple[Path, dict]], device: str = "cpu") -> list[dict]:
    from dlscale.distributed import free_port
    from dlscale.lab import engine_twin, run_on_engines, run_stage
    from dlscale.lessons.stage_check import check_stage

    Path("micro.yaml").write_text("inherit: tiny\ntrain_samples: 128\nval_samples: 64\n")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    twins: dict[str, dict] = {}
    rows = []
    for path, info in written:
        lesson, stage = info["gap"][:2], info["stage"]
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            if lesson in KERNEL:
                os.environ["MASTER_PORT"] = str(free_port())
                settings = dict(KERNEL[lesson], config="micro.yaml", epochs=1, device=device)
                mine = run_stage(str(path), checkpoint=f"runs/{path.stem}", **settings)
                if stage not in twins:
                    twins[stage] = engine_twin(stage, name=f"twin-{lesson}", **settings)
            else:
                settings = dict(RANKS[lesson], config="tiny", epochs=1, device="cpu")
                mine = run_on_engines(run_stage, 2, str(path), checkpoint=f"runs/{path.stem}", **settings)
                if stage not in twins:
                    twins[stage] = run_on_engines(engine_twin, 2, stage, name=f"twin-{lesson}", **settings)[0]
            verdict = verdict_of(check_stage, stage, mine, twins[stage])
        seconds = time.perf_counter() - start
        rows.append(
            {
                **info,
                "file": path.name,
                "result": judged(info, verdict),
                "seconds": round(seconds, 1),
                "verdict": verdict,
            }
        )
        print(f"{path.stem:14} {rows[-1]['result']:9} {seconds:5.1f} s  {(verdict or '')[:110]}", flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    wrong = [r for r in rows if r["expect"] == "wrong"]
    right = [r for r in rows if r["expect"] == "right"]
    caught = [r for r in wrong if r["result"] != "missed"]
    named = [r for r in wrong if r["result"] == "named"]
    accepted = [r for r in right if r["result"] == "accepted"]
    lines = [
        f"wrong answers caught: {len(caught)} of {len(wrong)}; named by their gap alone: {len(named)} of {len(wrong)} "
        f"({len(named)} of the {len(caught)} caught)",
        f"right answers accepted: {len(accepted)} of {len(right)}",
        f"slowest verdict: {max(r['seconds'] for r in rows):.1f} s",
    ]
    lines += [
        f"  {r['result']}: {r['file']} ({r['what']})" for r in rows if r["result"] in ("missed", "misnamed", "rejected")
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="01,02,03,04,05,07,13", help="lessons, comma-separated")
    parser.add_argument("--out", help="write every row, its verdict included, to this JSON file")
    parser.add_argument(
        "--device", default="cpu", help="where stages 01-04 run (cuda on a GPU node: where pinned memory shows)"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve() if args.out else None
    with tempfile.TemporaryDirectory(prefix="dlscale-heldout-") as folder:
        os.environ["IPYTHONDIR"] = str(Path(folder, "ipython"))
        os.chdir(folder)
        answers = Path(folder, "answers")
        answers.mkdir()
        rows = run_all(write_answers(answers, set(args.stages.split(","))), args.device)
        if any(r["gap"][:2] in RANKS for r in rows):
            from dlscale.jobs.notebook_engines import stop_engines

            stop_engines()
    if out:
        out.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
