"""Nothing lost, in the rooms the kit shares with the user (#74): a lesson's folder keeps every file the attendee made
there, and the notebook engines leave no file in the IPython profile, nor does the suite in the user's home. Each test
fails on the code before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.plugins.reaper import SESSION_MARK


def test_a_lesson_reset_keeps_every_file_of_the_attendee_wherever_it_is(tmp_path, capfd):
    from dlscale.cli import main

    runs = tmp_path / "runs"
    mine = ["lesson05/sub/my_stage.py", "lesson05/a/b/my_notes.txt", "lesson05_engine_twin/deep/my_05_ddp.py"]
    for path in [
        "lesson05/sub/metrics.csv",
        "lesson05/a/b/ckpt-1.pt",
        "lesson05/a/other/x",
        "lesson05/top.txt",
        "lesson05_engine_twin/s.json",
        *mine,
    ]:
        (runs / path).parent.mkdir(parents=True, exist_ok=True)
        (runs / path).write_text(path)
    assert main(["lessons", "reset", "05", "--runs", str(runs)]) == 0
    said = capfd.readouterr().out.splitlines()
    assert said[-1] == (
        f"lesson 05 starts over: 5 run folder(s) or file(s) removed from {runs}/ (your own files, my_*, kept wherever "
        f"they are)"
    )
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*") if p.is_file()) == sorted(mine)
    assert all((runs / path).read_text() == path for path in mine)


def test_the_suite_keeps_ipython_out_of_the_users_home():
    """The suite's notebook engines, kernels and their commands use an IPython folder inside the session's temporary
    folder (removed at its end), inherited by every process the tests start."""
    folder = Path(os.environ["IPYTHONDIR"])
    assert folder.is_dir() and folder.is_relative_to(os.environ[SESSION_MARK])
    assert not folder.resolve().is_relative_to(Path.home().resolve())
    seen = subprocess.run(
        [sys.executable, "-c", "from IPython.paths import get_ipython_dir; print(get_ipython_dir())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert seen.stdout.strip() == str(folder)


class _Cluster:
    """ipyparallel's Cluster as far as stopping goes: its file in the profile, and a stop that fails half-way."""

    def __init__(self, cluster_file: Path) -> None:
        self.cluster_file = str(cluster_file)

    def stop_cluster_sync(self) -> None:
        raise RuntimeError("an engine would not stop")

    def remove_cluster_file(self) -> None:
        os.remove(self.cluster_file)


def test_stopped_engines_leave_no_cluster_file(tmp_path, monkeypatch):
    """A cluster file left behind names a "running" cluster whose processes are gone: stopping the engines removes
    it, whether the kit stops them or its watchdog does after the kernel was killed."""
    import pytest

    from dlscale.jobs import engine_watchdog, notebook_engines

    stopped_in_vain = tmp_path / "cluster-1-aaaa.json"
    stopped_in_vain.write_text("{}")
    monkeypatch.setattr(notebook_engines, "_kept", ("key", _Cluster(stopped_in_vain), None))
    with pytest.raises(RuntimeError, match="would not stop"):
        notebook_engines.stop_engines()
    assert not stopped_in_vain.exists()

    killed_kernel = tmp_path / "cluster-2-bbbb.json"
    killed_kernel.write_text("{}")
    kernel = subprocess.Popen([sys.executable, "-c", ""])
    kernel.wait()
    engine = subprocess.Popen(["sleep", "60"], start_new_session=True)
    monkeypatch.setattr(engine_watchdog, "GRACE_S", 0.2)  # (the engine, ended but not reaped here, still counts)
    try:
        engine_watchdog.main(kernel.pid, [engine.pid], str(killed_kernel))
        assert engine.wait(timeout=10) < 0
    finally:
        engine.kill()
    assert not killed_kernel.exists()
