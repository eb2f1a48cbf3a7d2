"""The training loop as a launched run: killed and resumed, and the demo's promised R² (tests/unit/test_train.py has
the rest).

Each run that is killed or signalled is a ``dlscale train`` process of its own, and each such process pays torch's
import and first calls, which cost more than its steps. So only those runs are launched: the uninterrupted run they
are held to trains once for the module in this process (:func:`reference_run`), the killed twice test resumes a copy
of it, the resumes after a kill or a signal run in this process too (:func:`_resume_here`), and every run is as short
as a kill or a signal after its first checkpoint and before its end allows (:data:`RUN`).
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dlscale.checkpoint import list_checkpoints
from dlscale.config import load_config
from dlscale.train import train
from dlscale.training.preemption import PREEMPTED_EXIT_CODE
from tests.unit.test_train import _step_of

# -- in a separate process: a hard kill, and a polite signal --------------------------------------

#: Every run of this module: tiny for 2 epochs, 64 steps (32 an epoch). The kills and the signals come once step 20 is
#: logged (rows come in blocks of 10; a checkpoint at 16 is before it), which leaves them 44 steps and a validation to
#: land in before the end however busy the machine is, and the resumed runs an epoch's end to cross. One thread each,
#: whatever the load: a run's float32 sums depend on its thread count, and these runs are compared bit for bit.
RUN = ["tiny", "progress=false", "plot=false", "epochs=2", "threads=1"]


def _start(cwd, *overrides):
    return subprocess.Popen(
        [sys.executable, "-m", "dlscale", "train", *RUN, *overrides],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_step(run_dir, step, proc, timeout=120):
    """Block until the run has logged ``step`` (rows are written in blocks of 10)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run_dir / "metrics.csv"
        if path.is_file() and len(path.read_text().splitlines()) > step:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.01)
    raise TimeoutError(f"no step {step} in {run_dir}")


def _start_and_kill_after_resume(cwd, *overrides):
    """Start a resuming run and SIGKILL it as soon as it says where it resumed from.

    That line comes after every rank has loaded and before the first step. The run is given
    1000 epochs and no checkpoint before its end (its LR schedule differs, but it dies anyway),
    so the kill lands long before its next checkpoint however busy the machine is.
    """
    proc = _start(cwd, *overrides, "resume=true", "epochs=1000", "checkpoint_every=0")
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "resuming from" in line:
            proc.kill()
            break
    proc.wait()
    return "".join(seen)


def _resume_here(capsys, *overrides):
    """Resume the run in this process, from the test's folder (the process that died is the subject: any process may
    resume its run, and this one has paid torch's import). Returns what it printed, and whether it trained to its end,
    as `dlscale train`'s exit status 0 says: an error raises, and a stop on a signal is ``preempted`` (the command's
    PREEMPTED_EXIT_CODE)."""
    capsys.readouterr()  # (only this run's lines)
    result = train(load_config(RUN[0], [*RUN[1:], *overrides, "resume=true"]))  # (what `dlscale train` does)
    return capsys.readouterr().out, not result.preempted


def _rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted run (a checkpoint every 16 steps, all kept), once for the module and in this process (no
    launch to pay for): the killed and the signalled runs are compared with it, the killed twice test resumes a copy
    of it, and the data set it writes is copied for every test (:func:`_data`)."""
    folder = tmp_path_factory.mktemp("reference")
    here = os.getcwd()
    os.chdir(folder)
    try:  # (what `dlscale train` does with its arguments)
        train(load_config(RUN[0], [*RUN[1:], "checkpoint_every=16", "keep_checkpoints=10", "run_dir=runs/ref"]))
    finally:
        os.chdir(here)
    return folder


def _reference(folder):
    """The reference run's logged steps and validation rows."""
    return _rows(folder / "runs/ref/metrics.csv"), _rows(folder / "runs/ref/validation.csv")


def _data(reference_folder, folder):
    """The reference's data set in ``folder`` too: the run does not spend seconds writing it again."""
    shutil.copytree(reference_folder / "data", folder / "data")


def test_killed_run_resumes_bit_for_bit(in_tmp, reference_run, capsys):
    ref_steps, ref_val = _reference(reference_run)
    _data(reference_run, in_tmp)
    proc = _start(in_tmp, "run_dir=runs/cut", "checkpoint_every=16")
    _wait_for_step(in_tmp / "runs/cut", 20, proc)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    last_ckpt = list_checkpoints(in_tmp / "runs/cut")[-1]
    assert 16 <= _step_of(last_ckpt) < len(ref_steps)  # it really was cut short, however busy the machine

    output, finished = _resume_here(capsys, "run_dir=runs/cut", "checkpoint_every=16")
    assert finished, output
    assert f"resuming from {last_ckpt.name}" in output
    # every logged step, before and after the kill, matches the uninterrupted run exactly
    assert [(r["step"], r["loss"]) for r in _rows(in_tmp / "runs/cut/metrics.csv")] == [
        (r["step"], r["loss"]) for r in ref_steps
    ]
    assert _rows(in_tmp / "runs/cut/validation.csv") == ref_val


def test_a_run_killed_twice_resumes_bit_for_bit(in_tmp, reference_run, capsys):
    """Killed after step 48 of 64, resumed, killed again before its next checkpoint, resumed: nothing is lost.

    The first kill is staged: the uninterrupted reference run, copied, with its checkpoint after the last (step 64)
    removed, leaves what a kill between steps 48 and 64 leaves (test_killed_run_resumes_bit_for_bit kills for real);
    its last 16 steps are all the resumes train.
    """
    run = in_tmp / "runs/twice"
    shutil.copytree(reference_run / "runs/ref", run)
    _data(reference_run, in_tmp)
    ref_steps, ref_val = _rows(run / "metrics.csv"), _rows(run / "validation.csv")
    assert len(ref_steps) == 64
    for path in list_checkpoints(run):
        if _step_of(path) > 48:
            path.unlink()

    output = _start_and_kill_after_resume(in_tmp, "run_dir=runs/twice")
    assert "resuming from ckpt-00000048.pt" in output, output
    assert [p.name for p in list_checkpoints(run)] == [
        "ckpt-00000016.pt",
        "ckpt-00000032.pt",
        "ckpt-00000048.pt",
    ]  # all still there

    output, finished = _resume_here(capsys, "run_dir=runs/twice", "checkpoint_every=16")
    assert finished, output
    assert "resuming from ckpt-00000048.pt" in output  # not from step 0
    assert [(r["step"], r["loss"]) for r in _rows(run / "metrics.csv")] == [(r["step"], r["loss"]) for r in ref_steps]
    assert _rows(run / "validation.csv") == ref_val


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_checkpoints_and_exits_with_the_requeue_status(in_tmp, reference_run, sig, capsys):
    ref_steps, _ = _reference(reference_run)
    _data(reference_run, in_tmp)
    proc = _start(in_tmp, "run_dir=runs/sig", "checkpoint_every=0")
    _wait_for_step(in_tmp / "runs/sig", 20, proc)
    os.kill(proc.pid, sig)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    assert f"{signal.Signals(sig).name} received; checkpointing at step" in output
    stopped_at = int(list_checkpoints(in_tmp / "runs/sig")[-1].name[5:13])
    assert 20 <= stopped_at < len(ref_steps)
    assert len(_rows(in_tmp / "runs/sig/metrics.csv")) == stopped_at  # every step up to the checkpoint is logged
    assert f"stopped on a signal, {signal.Signals(sig).name} received (resume with resume=true)" in output
    stopped = json.loads((in_tmp / "runs/sig/summary.json").read_text())
    assert (stopped["stop_reason"], stopped["preempted"]) == ("signal", True)

    output, finished = _resume_here(capsys, "run_dir=runs/sig")
    assert finished, output
    assert [r["loss"] for r in _rows(in_tmp / "runs/sig/metrics.csv")] == [r["loss"] for r in ref_steps]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard: about 20 s on 2 quiet cores
def test_one_epoch_of_the_demo_learns_every_target(in_tmp):
    """The README's demo in one epoch (its whole schedule, warmup to decay, in one pass: a sixth of the run) reaches
    R² >= 0.8 on held-out maps, and every target 0.7: 0.88 and 0.82 on a 2-core EPYC (docs/benchmarks.md has the six
    epochs' figures the README quotes). A loop that does not learn (no step, gradients never cleared, the wrong
    targets) stays far below."""
    result = train("demo", epochs=1, progress=False, plot=False)
    assert result.config.name == "demo" and result.steps_done == result.total_steps == 8192 // 64
    assert result.final["r2"] >= 0.8, result.final
    assert min(v for k, v in result.final.items() if k.startswith("r2_")) >= 0.7, result.final
