"""Time each lesson as an attendee runs it, for its parameters cell's runtime note and docs/benchmarks.md.

    .venv/bin/python scripts/time_lessons.py [LESSON.ipynb ...]      (from the repository root; default: all)
    .venv/bin/python scripts/time_lessons.py --full [--gpus N]       on a site's GPU node: every lesson at full size
    .venv/bin/python scripts/time_lessons.py --full --dry-run        what --full would run, without running it

Each lesson runs headless from notebooks/ (so it writes under runs/), with its attendee cells filled with the
answers: at its own parameters (the parameters cell's small sizes, for a laptop and CI), or with ``--full`` at the
sizes its parameters cell names for a GPU node (:data:`FULL_SIZE`, one entry per lesson). One line of JSON per
lesson: the parameters it was given, its seconds, any cell that raised, and every cell that ran over 10 s with what
it showed meanwhile (a widget bar, a text bar, or lines): a long cell that shows nothing looks stuck to an attendee.
Run it on a quiet machine: the figures are what other work leaves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: In :data:`FULL_SIZE`, a count of one per GPU of the node (``--gpus``; at least 2: the lessons compare one rank with
#: several, and where ranks outnumber the GPUs they train on the CPU, as the lessons say).
GPUS = "one per GPU"

#: Each lesson's full size: the values its parameters cell's comments name for a GPU node (``"gpu" on a GPU node``,
#: ``one per GPU``...), passed as papermill parameters over the cell's own. An empty entry: the lesson's own sizes
#: are its sizes on a GPU node too (00, 03 and 08 measure the stage, the machine or an image, not a size; 09's
#: runs are the site's jobs, whose node counts are its `sizes`).
FULL_SIZE: dict[str, dict] = {
    "00_environment.ipynb": {},
    "01_single_device_baseline.ipynb": {"config": "gpu"},
    "02_data_loading.ipynb": {"config": "gpu", "worker_counts": [0, 2, 4, 8]},
    "03_mixed_precision.ipynb": {},
    "04_profiling.ipynb": {"config": "gpu"},
    "05_data_parallel.ipynb": {"engines": GPUS},
    "06_horovod.ipynb": {"ranks": GPUS},
    "07_large_batch.ipynb": {"sweep_size": "full", "sweep_multiples": [8, 32, 128]},
    "08_distributed_kmeans.ipynb": {},
    "09_scaling_out.ipynb": {},
    "10_sharded_and_model_parallel.ipynb": {"config": "vit", "engines": GPUS, "memory_width": 256},
    "11_how_many_nodes.ipynb": {"sizes": [1, GPUS]},
    "12_search_not_just_scale.ipynb": {"workers": GPUS},
    "13_pipeline_parallel.ipynb": {"engines": GPUS},
}


def full_parameters(name: str, gpus: int) -> dict:
    """The parameters ``--full`` gives lesson ``name`` on a node of ``gpus`` GPUs."""
    per_gpu = max(2, gpus)

    def value(item):
        if item == GPUS:
            return per_gpu
        return [value(entry) for entry in item] if isinstance(item, list) else item

    return {key: value(item) for key, item in FULL_SIZE[name].items()}


def gpus_here() -> int:
    """The GPUs torch sees on this node; 4 (a Perlmutter GPU node's) where it sees none (rendering elsewhere)."""
    import torch

    return torch.cuda.device_count() or 4


def seconds(cell) -> float:
    """How long a cell ran, from nbclient's timestamps."""
    stamps = cell.metadata.get("execution", {})
    began, ended = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    if not (began and ended):
        return 0.0
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(ended) - parse(began)).total_seconds()


def shown(cell) -> list[str]:
    """What a cell showed while it ran: a widget (tqdm in Jupyter), a text bar, lines."""
    kinds = set()
    for output in cell.get("outputs", []):
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
            kinds.add("widget")
        if output.get("output_type") == "stream":
            kinds.add("bar" if "it/s]" in output.get("text", "") or "%|" in output.get("text", "") else "lines")
    return sorted(kinds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", metavar="LESSON.ipynb", help="lessons to run (default: all)")
    parser.add_argument("--full", action="store_true", help="each lesson at its full size (FULL_SIZE)")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs of this node (default: those torch sees)")
    parser.add_argument("--dry-run", action="store_true", help="print each lesson's parameters; run nothing")
    parser.add_argument("--cell-timeout", type=int, default=None, help="seconds a cell may run (900; 3600 --full)")
    args = parser.parse_args(argv)
    names = args.lessons or sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))
    unknown = [name for name in names if name not in FULL_SIZE]
    if unknown:
        parser.error(f"no lesson {', '.join(unknown)} in notebooks/ (the lessons: {', '.join(FULL_SIZE)})")
    gpus = (args.gpus or gpus_here()) if args.full else 0
    timeout = args.cell_timeout or (3600 if args.full else 900)
    if not args.dry_run:
        sys.path.insert(0, str(ROOT))
        from tests.notebooks import errors, execute  # (the tests' way of running a lesson)
    for name in names:
        parameters = full_parameters(name, gpus) if args.full else {}
        if args.dry_run:
            print(json.dumps({"lesson": name, "parameters": parameters}), flush=True)
            continue
        start = time.time()
        lesson = ROOT / "notebooks" / name
        notebook = execute(lesson, lesson.parent, parameters, allow_errors=True, timeout=timeout)
        slow = [
            (index, round(seconds(cell)), shown(cell), cell.source.splitlines()[0][:60])
            for index, cell in enumerate(notebook.cells)
            if cell.cell_type == "code" and seconds(cell) > 10
        ]
        record = {
            "lesson": name,
            "parameters": parameters,
            "seconds": round(time.time() - start, 1),
            "errors": errors(notebook),
            "slow": slow,
        }
        print(json.dumps(record, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
