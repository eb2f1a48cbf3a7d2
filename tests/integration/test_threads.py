"""The thread count each process gives torch, from the CPUs it was given: the tests that launch ranks, engines or
runs beside them (tests/unit/test_threads.py
has the rest)."""

import json
import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(
    not shutil.which("taskset") or not hasattr(os, "sched_getaffinity"),
    reason="needs taskset (util-linux) and Linux affinity masks",
)
def test_a_run_bound_to_one_cpu_uses_one_thread_and_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK")}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-m",
            "dlscale",
            "train",
            "tiny",
            "max_steps=2",
            f"run_dir={run_dir}",
            "progress=false",
            "plot=false",
            "checkpoint_every=0",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    threads = json.loads((run_dir / "summary.json").read_text())["threads"]
    assert threads == {"count": 1, "source": "affinity mask", "cpus": 1, "busy": 0, "changes": []}
