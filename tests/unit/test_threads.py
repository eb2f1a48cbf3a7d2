"""The thread count each process gives torch, from the CPUs it was given."""

import json

import pytest

from dlscale.runtime.threads import ThreadChoice, ThreadWatch, choose_threads, fair_threads, per_process_env


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


def test_a_shared_node_gives_torch_only_the_cpus_other_work_leaves_free(monkeypatch):
    """#63: on a hub's shared CPU node, or a laptop running the lab beside the training, a thread per masked core
    waits for the cores another process holds: the mask less the CPUs busy at start, never fewer than one."""
    from dlscale.runtime import threads

    choice = choose_threads({}, 4, busy=1)
    assert (choice.count, choice.source) == (3, "affinity mask, 1 of its 4 CPUs busy with other work")
    assert choose_threads({}, 2, busy=2).count == 1  # (every CPU busy: one thread, not none)
    assert choose_threads({"OMP_NUM_THREADS": "2"}, 2, busy=2).count == 2  # what the user chose stands
    # the counters /proc/stat gives: cpu0 spun the whole sample (another process), cpu1 idled
    samples = iter([{0: (100, 200), 1: (50, 200)}, {0: (110, 210), 1: (50, 210)}])
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    assert threads.busy_cpus([0, 1]) == 1


def test_work_started_now_counts_the_busy_cpus_at_most_every_so_often_and_never_exceeds_torchs_count(monkeypatch):
    """A K-Means fit takes the CPUs free at its start (threads_now): the count is taken again only once it is older
    than RECOUNT_S, a lower torch count and OMP_NUM_THREADS stand."""
    import torch

    from dlscale.runtime import threads

    counted, clock = [], [1000.0]
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 4)
    monkeypatch.setattr(threads, "busy_cpus", lambda: counted.append(1) or 1)
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads, "_last_busy", None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert threads.threads_now({}).count == 3 and len(counted) == 1  # one busy of four
    clock[0] += threads.RECOUNT_S - 1
    assert threads.threads_now({}).count == 3 and len(counted) == 1  # the count stands: not taken again
    clock[0] += 2
    assert threads.threads_now({}).count == 3 and len(counted) == 2  # older than RECOUNT_S: taken again
    assert threads.threads_now({"OMP_NUM_THREADS": "2"}).count == 2 and len(counted) == 2
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    choice = threads.threads_now({})
    assert choice.count == 2 and "torch's own count is lower" in choice.source


def test_bench_threads_sets_the_kits_choice_beside_fixed_counts_alone_and_beside_a_spinning_process(
    monkeypatch, tmp_path
):
    """#63's benchmark: every setting runs in each condition, the busy neighbour only during the second, and each row
    is set beside the best fixed count in the same condition."""
    import psutil

    from dlscale.bench import threads

    seen = []

    def cmdline(process) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # a child another test left as a zombie, or one that ended meanwhile
            return ""

    def rate(config, steps, count, out):
        spinning = sum(threads.SPIN in cmdline(p) for p in psutil.Process().children())
        seen.append((count, spinning))
        return {None: 90.0, 1: 50.0, 2: 100.0}[count] / (2 if spinning and count != 1 else 1)

    monkeypatch.setattr(threads, "_train_rate", rate)
    monkeypatch.setattr("dlscale.runtime.threads.affinity_cpus", lambda: 2)
    rows = threads.bench_threads("tiny", steps=10, rounds=2, out_dir=tmp_path)
    assert set(seen) == {(None, 0), (None, 1), (1, 0), (1, 1), (2, 0), (2, 1)} and len(seen) == 12
    by = {(r["condition"], r["setting"]): r for r in rows}
    assert by[("alone", "the kit's choice")]["vs_best_fixed"] == 0.9
    assert by[("beside 1 busy process(es)", "1 thread(s)")]["vs_best_fixed"] == 1.0  # (1 thread: 50, 2 halved: 50)
    assert by[("beside 1 busy process(es)", "the kit's choice")]["vs_kit_alone"] == 0.5
    from dlscale.runtime.devices import cpu_name

    assert threads.format_threads(rows).startswith(cpu_name())  # (the CPU named above the table)


def test_a_run_chooses_its_threads_again_when_a_neighbour_arrives_and_again_when_it_leaves():
    """#63: the step slows 2x when a process takes a core mid-run; fewer threads, then more once it is gone."""
    neighbours, looks, set_to = [0], [], []

    def busy() -> int:
        looks.append(neighbours[0])
        return neighbours[0]

    watch = ThreadWatch(ThreadChoice(2, "affinity mask", 2), busy=busy, set_threads=set_to.append, window=4, recheck=3)
    steps = iter(range(1, 1000))

    def window(seconds: float):
        return [watch.observe(next(steps), seconds) for _ in range(4)]

    window(0.01)  # the pace alone
    assert window(0.011) == [None] * 4 and looks == []  # within the jump: no look
    neighbours[0] = 1
    assert window(0.02)[-1] == (12, 2, 1, 1) and set_to == [1]  # 2x slower: a look, one thread
    window(0.012)  # the new count's pace
    window(0.012), window(0.012)
    assert set_to == [1] and looks == [1, 1]  # a look every 3rd window on fewer threads than CPUs: still busy
    neighbours[0] = 0
    for _ in range(3):
        window(0.012)
    assert set_to == [1, 2] and watch.changes[-1][1:] == (1, 2, 0)
    # slower for another reason (nothing busy, every thread in use): one look, and that pace becomes the baseline
    before = len(looks)
    window(0.01), window(0.03), window(0.03), window(0.03)
    assert len(looks) == before + 1 and set_to == [1, 2]
    # a count the user, torchrun or Slurm chose is never watched
    kept = ThreadWatch(ThreadChoice(2, "OMP_NUM_THREADS", 2), busy=busy, set_threads=set_to.append, window=1)
    assert [kept.observe(i, t) for i, t in ((1, 0.01), (2, 1.0))] == [None, None] and not kept.active
