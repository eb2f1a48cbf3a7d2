"""The thread count each process gives torch, from the CPUs it was given."""

import json

import pytest

from dlscale.runtime.threads import choose_threads, fair_threads, per_process_env


@pytest.mark.parametrize(
    "environ, cpus, expected",
    [
        ({}, 8, (8, "affinity mask")),
        ({"OMP_NUM_THREADS": "3"}, 8, (3, "OMP_NUM_THREADS")),
        ({"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "4"}, 8, (3, "OMP_NUM_THREADS")),  # explicit wins
        ({"SLURM_CPUS_PER_TASK": "4"}, 8, (4, "SLURM_CPUS_PER_TASK")),
        ({"SLURM_CPUS_PER_TASK": "16"}, 8, (8, "SLURM_CPUS_PER_TASK")),  # never more than the mask holds
        ({"OMP_NUM_THREADS": "", "SLURM_CPUS_PER_TASK": "x"}, 2, (2, "affinity mask")),  # unusable values ignored
        ({"OMP_NUM_THREADS": "0"}, 2, (2, "affinity mask")),
    ],
)
def test_thread_choice_follows_what_the_process_was_given(environ, cpus, expected):
    choice = choose_threads(environ, cpus)
    assert (choice.count, choice.source) == expected and choice.cpus == cpus


def test_the_config_threads_win_over_the_environment(tiny):
    choice = choose_threads({"OMP_NUM_THREADS": "2", "SLURM_CPUS_PER_TASK": "2"}, 2, requested=1)
    assert (choice.count, choice.source) == (1, "config threads")
    # a notebook's torch.set_num_threads is overridden by train(); threads=1 in the config is not
    import torch

    from dlscale.train import train

    torch.set_num_threads(2)
    result = train(tiny(threads=1, max_steps=2))
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert torch.get_num_threads() == 1 and summary["threads"]["count"] == 1


def test_fair_threads_fit_the_largest_run_on_the_cpus():
    assert [fair_threads(n, cpus=8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert per_process_env(2, {"PATH": "/bin"}) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
