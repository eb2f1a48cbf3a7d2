"""What only a GPU node or a site would show, checked through what runs here (issue 27).

The device is faked where it must be (torch.cuda's answers, a recorded call, a sysfs tree in a
temporary folder, the environment a Slurm step gives); docs/benchmarks.md's "still to check on
the real thing" lists what only the real machines can confirm.
"""

import os
import types

import pytest
import torch
import torch.distributed as dist

from dlscale import profiling
from dlscale.config import ConfigError, load_config
from dlscale.distributed import DistributedError, process_group
from dlscale.runtime.devices import DeviceError, gpu_index, resolve_device
from dlscale.train import train

from ..conftest import ROOT

# -- which GPU a rank uses, and the group bound to it ---------------------------------------------


def test_each_local_rank_takes_its_gpu_from_the_site_order_when_it_sees_them_all():
    assert [gpu_index(r, 4, "3,2,1,0") for r in range(4)] == [3, 2, 1, 0]
    assert [gpu_index(r, 4, None) for r in range(4)] == [0, 1, 2, 3]
    assert gpu_index(2, 1, "3,2,1,0") == 0  # a task bound to one GPU (--gpu-bind) was given its own
    with pytest.raises(DeviceError, match="must name each of the GPUs 0..3 once"):
        gpu_index(0, 4, "3,3,1,0")


def _fake_gpus(monkeypatch, count=4):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_init_binds_the_nccl_group_to_the_ranks_own_gpu(monkeypatch):
    """device_id: NCCL otherwise guesses the GPU from the global rank (wrong with cyclic layouts, and it can hang)."""
    chosen = _fake_gpus(monkeypatch)
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: calls.append((args, kwargs)))
    # global rank 5 is local rank 1 of its node: the guess from the global rank would be GPU 5 % 4 = 1, the order says 2
    environ = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
        "DLSCALE_GPU_ORDER": "3,2,1,0",
    }
    env = process_group.init("auto", environ=environ)
    assert chosen == [2] and env.device == "cuda:2"
    (backend,), kwargs = calls[0]
    assert backend == "nccl" and kwargs["device_id"] == torch.device("cuda", 2)


def test_the_probe_line_shows_each_tasks_gpu_and_warns_when_it_sits_on_other_cores_numa_node(monkeypatch, tmp_path):
    """Perlmutter's layout: GPU 0 beside the last cores, GPU 3 beside the first (a sysfs tree stands in)."""
    from dlscale.jobs import environment

    _fake_gpus(monkeypatch)
    gpus = {i: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x03 + 0x40 * i, pci_device_id=0) for i in range(4)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpus[index])
    for node in range(4):
        folder = tmp_path / f"devices/system/node/node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(f"{16 * node}-{16 * node + 15},{64 + 16 * node}-{64 + 16 * node + 15}\n")
    for index in range(4):
        bus = tmp_path / f"bus/pci/devices/0000:{0x03 + 0x40 * index:02x}:00.0"
        bus.mkdir(parents=True)
        (bus / "numa_node").write_text(f"{3 - index}\n")
    monkeypatch.setattr(environment, "affinity_set", lambda: list(range(16)))  # local rank 0: the first cores
    plain = environment.task_line({"SLURM_LOCALID": "0"}, sysfs=tmp_path)
    assert "gpu 0 (0000:03:00.0) on NUMA node 3, cores on NUMA node(s) 0" in plain and "MISMATCH" in plain
    ordered = environment.task_line({"SLURM_LOCALID": "0", "DLSCALE_GPU_ORDER": "3,2,1,0"}, sysfs=tmp_path)
    assert "gpu 3 (0000:c3:00.0) on NUMA node 0, cores on NUMA node(s) 0" in ordered and "MISMATCH" not in ordered


@pytest.mark.parametrize(
    "build, expected",
    [
        ((None, None), "CPU-only build.*TORCH_INDEX=https://download.pytorch.org/whl/rocm"),
        (("12.8", None), "sees no GPU on this node: run on a GPU node"),
    ],
)
def test_asking_for_a_gpu_that_is_not_there_names_the_fix(monkeypatch, build, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", build[0])
    monkeypatch.setattr(torch.version, "hip", build[1])
    with pytest.raises(DeviceError, match=expected):
        resolve_device("cuda")


# -- what the summary reports -----------------------------------------------------------------------


def test_flops_are_counted_on_the_meta_device_and_the_peak_is_reset_once_the_model_is_laid_out(tiny, monkeypatch):
    """On a GPU the whole model ran a forward and backward before FSDP sharded it: the 'sharded' peak held it."""
    from dlscale.training import setup

    seen = []
    count_flops, build_step_model = setup.count_flops, setup.build_step_model
    monkeypatch.setattr(
        setup,
        "count_flops",
        lambda model, *a: seen.append(("flops", next(model.parameters()).device)) or count_flops(model, *a),
    )
    monkeypatch.setattr(
        setup, "build_step_model", lambda *a, **k: seen.append(("step model",)) or build_step_model(*a, **k)
    )
    monkeypatch.setattr(setup, "reset_peak", lambda device: seen.append(("reset peak", device.type)))
    setup.model_flops.cache_clear()  # (an earlier run of this config in the process has counted it already)
    result = train(tiny(max_steps=1))
    assert seen == [("flops", torch.device("meta")), ("step model",), ("reset peak", "cpu")]
    assert result.steps_done == 1


def test_mfu_counts_a_tensor_parallel_ranks_share_and_the_peak_of_the_kernels_the_model_uses(monkeypatch):
    from dlscale.models import build_model
    from dlscale.profiling import count_flops, mfu, peak_flops, peak_precision

    shares = {}
    for name in ("tiny", "vit-tiny"):
        cfg = load_config(name)
        with torch.device("meta"):
            shares[name] = count_flops(build_model(cfg, 1, 2), (1, cfg.image_size, cfg.image_size)).convolution_share
    assert shares["tiny"] > 0.9 and shares["vit-tiny"] < 0.1  # the ViT's FLOPs are matmuls (its patches are one conv)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's defaults: TF32 convolutions,
    assert torch.backends.cuda.matmul.allow_tf32 is False  # float32 matmuls
    assert peak_flops("cuda", peak_precision("cuda", "fp32", convolutions=True)) == 156e12
    assert peak_flops("cuda", peak_precision("cuda", "fp32", convolutions=False)) == 19.5e12
    # 4 ranks in 2 tensor-parallel pairs: each rank's 1000 samples/s are its pair's, half the FLOPs on each GPU
    assert mfu(1000.0, 1e9, 1e13, tensor_parallel=2) == pytest.approx(mfu(1000.0, 1e9, 1e13) / 2)


def test_throughput_counts_the_device_work_a_measured_stretch_left_queued():
    """On a GPU steps return before their kernels ran: the sync at the end of a stretch is counted in it."""
    from dlscale.metrics.throughput import ThroughputMeter

    now = [0.0]
    meter = ThroughputMeter(warmup_steps=1, sync=lambda: now.__setitem__(0, now[0] + 3.0), clock=lambda: now[0])
    for _ in range(3):  # steps 1 and 2 are counted: 1 s each on the host
        meter.step(10)
        now[0] += 1.0
    meter.pause()  # the device needs 3 s more for what was queued (then validation, not counted)
    now[0] += 100.0
    assert meter.seconds == pytest.approx(2.0 + 1.0 + 3.0) and meter.samples == 20
    meter.pause()  # nothing queued since: nothing added
    assert meter.seconds == pytest.approx(6.0)


def test_each_logged_rows_samples_per_s_is_its_blocks_with_the_device_work_in_it():
    """A GPU queues a step in 1 ms and runs it in 10: the rows of metrics.csv show the device's rate (their
    block's, timed up to the wait that fetches the block's losses), not the host's ten times higher one."""
    from dlscale.metrics.steplog import LOG_BLOCK, StepLog
    from dlscale.metrics.throughput import ThroughputMeter

    now, device_done, rows = [0.0], [0.0], []
    meter = ThroughputMeter(sync=lambda: now.__setitem__(0, max(now[0], device_done[0])), clock=lambda: now[0])
    log = StepLog(types.SimpleNamespace(log_steps=rows.extend), [])
    log.time_with(meter, ranks=2)
    for step in range(1, 3 * LOG_BLOCK + 1):
        device_done[0] = max(device_done[0], now[0]) + 0.010  # the kernels this step queued
        now[0] += 0.001  # the host is back after 1 ms
        meter.step(8)
        log.add(step, 0, torch.tensor(1.0), 0.1)
        if step % LOG_BLOCK == 0:
            log.flush()
    rates = [row["samples_per_s"] for row in rows]
    assert len(rates) == 3 * LOG_BLOCK and len(set(rates[LOG_BLOCK : 2 * LOG_BLOCK])) == 1  # one rate per block
    # 8 samples per 10 ms on each of 2 ranks: 1,600 samples/s (the first block loses its first step's start)
    assert rates[-1] == pytest.approx(1600, rel=0.01) and rates[0] == pytest.approx(1600, rel=0.1)


def test_the_profile_summary_has_one_row_per_range_whatever_the_device_recorded():
    """Kineto records each range twice on a GPU (host event, gpu_user_annotation); key_averages keeps both."""
    from dlscale.profiling.step_profiler import summarize_events

    def event(key, device, count=4, cpu=4000.0, gpu=2000.0):
        return types.SimpleNamespace(
            key=key,
            count=count,
            cpu_time_total=cpu,
            self_cpu_time_total=cpu / 2,
            device_time_total=gpu,
            self_device_time_total=gpu,
            device_type=device,
        )

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [event(name, cpu) for name in profiling.RANGES] + [
        event(name, cuda, cpu=0.0, gpu=9000.0) for name in profiling.RANGES
    ]
    events.append(event("aten::mm", cpu, count=8))
    summary = summarize_events(events, steps=4)
    assert [r["name"] for r in summary["ranges"]] == list(profiling.RANGES)
    assert all(r["calls"] == 4 and r["device_ms_per_step"] == pytest.approx(0.5) for r in summary["ranges"])
    # operators rank by their kernels' time on a GPU: a cheap launch of a long kernel comes first
    events += [event("aten::copy_", cpu, cpu=9000.0, gpu=100.0), event("aten::convolution", cpu, cpu=100.0, gpu=8000.0)]
    summary = summarize_events(events, steps=4, by_device=True)  # (the GPU's activity was profiled)
    assert [r["name"] for r in summary["top_operators"]][:2] == ["aten::convolution", "aten::mm"]
    assert summarize_events(events, steps=4)["top_operators"][0]["name"] == "aten::copy_"  # a CPU profile: CPU time
    times, clock = profiling.step_profiler.operator_times(summary, "cuda:0")
    assert clock == "self device" and times[0] == ("aten::convolution", pytest.approx(2.0))
    assert profiling.step_profiler.operator_times(summary, "cpu")[0][0][0] == "aten::copy_"


def test_the_backward_phase_gets_the_kernels_autograds_thread_launched_and_lesson_04s_answer_agrees():
    """On CUDA a range's own device time misses kernels launched on another thread, and autograd launches the
    backward pass's from its own (pytorch/pytorch#144778): the table gives each range the kernels launched
    inside its host interval on any thread, so the backward phase is the slowest, as exercise 04.2 expects."""
    import json

    from dlscale.lessons.exercises import _solution_cell, answer
    from dlscale.profiling.step_profiler import device_time_by_window, phase_times, summarize_events

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def raw(name, thread, start, end, own=0.0, device=cpu):  # one event of profiler.events(), in microseconds
        return types.SimpleNamespace(
            name=name,
            thread=thread,
            time_range=types.SimpleNamespace(start=start, end=end),
            self_device_time_total=own,
            device_type=device,
        )

    main, autograd = 1, 2  # one step, shaped as Kineto records it on a GPU
    trace = [
        raw("data", main, 0, 100),
        raw("aten::copy_", main, 10, 90, own=200.0),
        raw("forward", main, 100, 400),
        raw("aten::convolution", main, 120, 300, own=3100.0),
        raw("backward", main, 400, 1400),  # the main thread waits here while autograd's thread launches
        raw("autograd::engine::evaluate_function: ConvolutionBackward0", autograd, 420, 1300),
        raw("aten::convolution_backward", autograd, 430, 1290, own=6400.0),
        raw("optimizer", main, 1400, 1600),
        raw("aten::_foreach_addcdiv_", main, 1410, 1590, own=900.0),
        raw("backward", main, 0, 9000, own=9999.0, device=cuda),  # the gpu_user_annotation: not a host range
        raw("aten::mm", main, 2000, 2100, own=50.0),
    ]  # after the last range: nobody's
    windows = device_time_by_window(trace)
    assert windows == {"data": 200.0, "forward": 3100.0, "backward": 6400.0, "optimizer": 900.0}

    # key_averages()'s rows: the ranges' own device time, as record_function reports it (backward: nearly none)
    own = {"data": 200.0, "forward": 3100.0, "backward": 10.0, "optimizer": 900.0}
    averages = [
        types.SimpleNamespace(
            key=name,
            count=1,
            cpu_time_total=cpu_us,
            self_cpu_time_total=cpu_us / 10,
            device_time_total=own[name],
            self_device_time_total=0.0,
            device_type=cpu,
        )
        for name, cpu_us in {"data": 400.0, "forward": 1500.0, "backward": 1200.0, "optimizer": 4800.0}.items()
    ]
    assert max(own, key=own.get) == "forward"  # what the table said before: the wrong slowest phase
    summary = summarize_events(averages, steps=1, by_device=True, windows=windows)
    times, clock = phase_times(summary, "cuda:0")
    assert clock == "device" and times == pytest.approx(
        {"data": 0.2, "forward": 3.1, "backward": 6.4, "optimizer": 0.9}
    )

    solution = json.loads((ROOT / "solutions" / "04_profiling.ipynb").read_text())
    namespace: dict = {}
    exec(answer(_solution_cell(solution, "04.2", "04.2")), namespace)
    assert namespace["slowest_phase"](summary["ranges"], "cuda:0") == "backward"


def test_a_phases_device_time_is_read_from_real_profiler_events():
    """The attribute names device_time_by_window reads exist on torch's own events (a CPU profile: no device time)."""
    from dlscale.profiling.nvtx import nvtx_range
    from dlscale.profiling.step_profiler import device_time_by_window

    model = torch.nn.Linear(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with nvtx_range("forward"):
            loss = model(torch.randn(4, 8)).square().sum()
        with nvtx_range("backward"):
            loss.backward()
    assert device_time_by_window(profiler.events()) == {"data": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}


def test_ranges_reach_rocprof_on_rocm(monkeypatch):
    """torch.cuda.nvtx emits roctx on ROCm; the nvtx package's ranges would reach no profiler there."""
    import nvtx  # noqa: F401  (installed, as on a site: it must not be chosen on ROCm)

    monkeypatch.setattr(profiling.nvtx, "_nvtx_module", None)
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert profiling.nvtx_backend() == "torch.cuda.nvtx"


# -- no device sync in the step ---------------------------------------------------------------------


def test_whole_tensor_norms_of_shards_copy_nothing_to_the_device_after_the_first_step(monkeypatch):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dlscale.distributed.dtensors import full_norms

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        tensors = [
            distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]),
            torch.randn(5),
            distribute_tensor(torch.randn(6), mesh, [Shard(0)]),
        ]
        first = full_norms(tensors)
        made = []
        real = torch.tensor
        monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
        again = full_norms(tensors)  # the next step: the same lists
        assert made == [] and torch.equal(first, again)
        assert again[0] == pytest.approx(float(tensors[0].full_tensor().norm()))
    finally:
        dist.destroy_process_group()


# -- errors as they are ------------------------------------------------------------------------------


def test_only_a_peers_failure_reads_as_a_dead_rank():
    gloo = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4")
    assert process_group.is_peer_failure(gloo)
    assert process_group.is_peer_failure(dist.DistBackendError("NCCL watchdog timeout"))
    assert not process_group.is_peer_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not process_group.is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"))


def test_out_of_memory_says_so_with_the_batch_and_what_to_lower(tiny, monkeypatch):
    from dlscale.training import loop

    def no_memory(run, batches):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(loop, "train_step", no_memory)
    with pytest.raises(
        loop.OutOfMemoryError,
        match="ran out of memory on cpu with micro-batches of 32 samples "
        r"\(global_batch_size=32 .*Lower global_batch_size",
    ) as caught:
        train(tiny(global_batch_size=32))
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)  # the original stays chained


# -- K-Means on a GPU: float64 sums, blocks within the budget ---------------------------------------


def test_the_gpu_pass_sums_in_float64_so_one_rank_equals_two():
    """The one-hot GEMM over half a million float32 rows a chunk lost digits in float32 (weights cast too)."""
    from dlscale.kmeans.lloyd import _ClusterSums, _one_hot_pass

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6000, 3, generator=generator) * 1000 + 1e4
    weights = torch.rand(6000, generator=generator, dtype=torch.float64) / 3
    centers = x[:5].clone()

    def sums(rows):  # one "rank" summing these rows in chunks of 4,096 (as a GPU would)
        part = _ClusterSums(5, 3, x.device)
        _one_hot_pass(x[rows], weights[rows], centers, torch.full((len(x[rows]),), -1), 4096, part)
        return part.packed.clone()

    one, two = sums(slice(None)), sums(slice(0, 3001)) + sums(slice(3001, None))
    torch.testing.assert_close(two, one, rtol=1e-12, atol=0)
    labels = torch.cdist(x.double(), centers.double()).argmin(1)
    exact = torch.zeros(5, 3, dtype=torch.float64).index_add_(0, labels, x.double() * weights[:, None])
    torch.testing.assert_close(one[:15].view(5, 3), exact, rtol=1e-12, atol=0)


def test_kmeans_parallel_keeps_every_distance_block_within_the_chunks_budget(monkeypatch):
    from dlscale.kmeans.initialization import kmeans_parallel

    sizes, addmm = [], torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: (lambda out: sizes.append(out.numel()) or out)(addmm(*a, **k)))
    x = torch.randn(20_000, 3, generator=torch.Generator().manual_seed(1))
    k, chunk = 8, 256
    centers = kmeans_parallel(x, k, torch.Generator().manual_seed(2), chunk)
    assert centers.shape == (k, 3) and max(sizes) <= chunk * k  # (the candidates number about 10 k)


# -- a resume continues the same run only ------------------------------------------------------------


def test_a_resume_refuses_another_runs_checkpoint_and_says_what_changed(tiny, capsys):
    first = train(tiny(run_dir="runs/r", max_steps=4, checkpoint_every=2))
    with pytest.raises(ConfigError, match=r"belongs to another run: width 8 -> 16\..*run_dir=runs/<new name>"):
        train(tiny(run_dir="runs/r", width=16, resume=True, max_steps=6))
    capsys.readouterr()
    again = train(tiny(run_dir="runs/r", resume=True, max_steps=6, checkpoint_every=2))
    out = capsys.readouterr().out
    assert "resuming with changed settings: max_steps 4 -> 6" in out and "resuming from ckpt-00000004.pt" in out
    assert first.steps_done == 4 and again.steps_done == 6


def _init_recorded(monkeypatch, environ, device, gpus, fail=None):
    """process_group.init with ``gpus`` faked and init_process_group recorded (or raising ``fail``)."""
    chosen = _fake_gpus(monkeypatch, gpus)
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs, os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")))
        if fail:
            raise fail

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", record)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    base = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    return process_group.init(device, environ={**base, **environ}), chosen, calls


TWO_TORCHRUN_RANKS = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def test_more_ranks_than_gpus_is_refused_naming_both_counts_or_trains_on_the_cpu_under_auto(monkeypatch, capsys):
    """Two ranks on a one-GPU node (a shared Jupyter node, two engines) used to land on one GPU, which NCCL refuses
    with an error the kit then blamed on MASTER_ADDR."""
    with pytest.raises(
        DistributedError,
        match=r"2 ranks on this node but 1 GPU\(s\) visible: NCCL cannot put two "
        r"ranks on one GPU",
    ):
        _init_recorded(monkeypatch, TWO_TORCHRUN_RANKS, "cuda", gpus=1)
    env, chosen, calls = _init_recorded(monkeypatch, {**TWO_TORCHRUN_RANKS, "LOCAL_RANK": "0", "RANK": "0"}, "auto", 1)
    assert env.device == "cpu" and chosen == [] and calls[0][0] == ("gloo",)
    assert "2 ranks on this node and 1 GPU(s): the ranks train on the CPU (gloo)" in capsys.readouterr().out
    # Slurm's binding: every task of 8 sees its own one GPU, which is not sharing
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "n1",
    }
    env, chosen, calls = _init_recorded(monkeypatch, slurm, "cuda", gpus=1)
    assert env.device == "cuda:0" and calls[0][0] == ("nccl",)


def test_nccl_error_handling_keeps_torchs_default_and_a_failure_keeps_its_own_words_first(monkeypatch):
    """Forcing TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (abort) can hang (pytorch#110723); torch's default is 3."""
    _, _, calls = _init_recorded(monkeypatch, TWO_TORCHRUN_RANKS, "cuda", gpus=2)
    assert calls[0][2] is None  # not set by the kit
    failure = RuntimeError("NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)")
    with pytest.raises(
        DistributedError,
        match=r"^rank 1 of 2 could not join the nccl process group: RuntimeError: "
        r"NCCL error: invalid usage",
    ):
        _init_recorded(monkeypatch, TWO_TORCHRUN_RANKS, "cuda", gpus=2, fail=failure)


def test_horovod_without_nccl_is_refused_on_a_gpu_in_one_line(monkeypatch):
    """The CPU build of scripts/build_horovod.sh crashed at the first all-reduce of GPU tensors (horovod#2478)."""
    from dlscale.distributed import horovod_backend
    from dlscale.distributed.horovod_backend import HorovodError

    inited = []
    stub = types.SimpleNamespace(
        nccl_built=lambda: False,
        mpi_built=lambda: False,
        is_initialized=lambda: False,
        init=lambda: inited.append(True),
    )
    monkeypatch.setattr(horovod_backend, "load", lambda: stub)
    with pytest.raises(HorovodError, match=r"built without NCCL .* Use the site's Horovod .*data_parallel=ddp"):
        horovod_backend.init("horovodrun", 60, on_gpu=True)
    assert inited == []  # refused before hvd.init()
    horovod_backend.init("horovodrun", 60, on_gpu=False)  # on CPUs, the gloo build is what it is for
    assert inited == [True]


def test_cudnns_autotuner_is_on_for_the_gpu_config_and_set_per_run_on_a_gpu(tiny, monkeypatch):
    """The gpu config's batches all have one shape, so cuDNN's benchmark mode pays; a CPU run leaves the flag alone."""
    assert load_config("gpu").cudnn_benchmark and not load_config("tiny").cudnn_benchmark
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    result = train(tiny(max_steps=2))  # on the CPU: nothing to tune, and it says so
    assert result.applied["cudnn_benchmark"] is False and torch.backends.cudnn.benchmark is True


# -- the recipe's profiling window under Nsight Systems (issue 59) ------------------------------------------------


def test_the_recipes_profiling_window_traces_the_cpu_only_under_nsys_and_synchronizes_at_its_edges(
    monkeypatch, tmp_path
):
    """Beside nsys a second CUDA tracer fails (CUPTI: multiple subscribers); a capture stopped without a synchronize
    loses the kernels still queued."""
    import importlib

    from dlscale.lessons.recipe_folder import RECIPES  # noqa: F401  (puts recipes/ on the path)

    ProfilingWindow = importlib.import_module("training_tools").ProfilingWindow  # noqa: N806

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("capture starts"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("capture stops"))
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "7")
    window = ProfilingWindow("1,2", trace=str(tmp_path / "trace.json"))
    assert set(window.profiler.activities) == {torch.profiler.ProfilerActivity.CPU}
    monkeypatch.setattr(window.profiler, "start", lambda: None)
    monkeypatch.setattr(window.profiler, "stop", lambda: None)
    monkeypatch.setattr(window.profiler, "export_chrome_trace", lambda path: None)
    monkeypatch.setattr(window.profiler, "key_averages", lambda: types.SimpleNamespace(table=lambda **k: ""))
    window.step()
    window.step()
    assert calls == ["synchronize", "capture starts", "synchronize", "capture stops"]
    monkeypatch.delenv("NSYS_PROFILING_SESSION_ID")
    assert torch.profiler.ProfilerActivity.CUDA in ProfilingWindow("").profiler.activities


#: scripts/gpu_checks.sh's steps in their order: what never ran on a GPU first (Horovod's NCCL build, the stop file on
#: CUDA, NCCL's error for a missing network plugin), then what ran on an H200 once; K-Means's compile-ahead inside
#: the budget
GPU_CHECKS = (
    "horovod stop nccl_net probe ddp parity heldout fsdp pipeline ddp_cost compile nsys gpu_tests kmeans_ahead "
    "kmeans_gpu profile kmeans2 kmeans_all"
).split()


def test_the_gpu_checks_run_as_the_guide_writes_them_and_without_a_gpu_say_each_step_was_skipped():
    """`bash scripts/gpu_checks.sh`, verbatim (docs/instructors.md): it stopped at "OUT: name the output folder";
    now it writes to runs/gpu-checks-DATE-TIME, risk first, here one line per step that it was skipped, and why."""
    import shutil
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script runs for real (scripts/gpu_checks.sh)")
    environ = {key: value for key, value in os.environ.items() if key not in ("OUT", "STEPS")}
    done = subprocess.run(
        ["bash", "scripts/gpu_checks.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, "PYTHON": sys.executable},
    )
    folder = ROOT / done.stdout.split("gpu_checks: writing to ", 1)[-1].split(" ", 1)[0]
    try:
        assert done.returncode == 0, done.stderr
        assert folder.parent == ROOT / "runs" and folder.name.startswith("gpu-checks-")
        log = (folder / "log.txt").read_text()
    finally:
        if folder.parent == ROOT / "runs" and folder.name.startswith("gpu-checks-"):
            shutil.rmtree(folder, ignore_errors=True)
    skipped = [line.split("skipped: ", 1)[1] for line in log.splitlines() if "skipped: " in line]
    assert [entry.split(" ", 1)[0] for entry in skipped] == [f"{name}.txt" for name in GPU_CHECKS]
    assert all(entry.endswith("(no CUDA GPU: torch " + torch.__version__ + " sees none)") for entry in skipped)


def test_a_lease_runs_every_gpu_check_risk_first_within_its_budget_horovods_build_first(tmp_path):
    """scripts/gpu_lease.sh gave the Horovod step a budget equal to its limit, so it was always "left out"; and the
    K-Means compile-ahead ran outside the budget. Here with a stand-in Python that records its arguments and exits 0
    (its torch probe takes a second, as an import of torch does): every step starts, in the risk-first order."""
    import subprocess

    fake, calls = tmp_path / "bin", tmp_path / "calls.log"
    fake.mkdir()
    (fake / "python3").write_text(
        f'#!/bin/sh\necho "python3 $*" >> "{calls}"\ncase "$*" in *"no CUDA GPU"*) sleep 1 ;; esac\nexit 0\n'
    )
    (fake / "find").write_text("#!/bin/sh\nexit 0\n")  # (the probe's search of / for nccl.h)
    for tool in fake.iterdir():
        tool.chmod(0o755)
    (fake / "python").symlink_to("python3")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        ["bash", "scripts/gpu_lease.sh", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{fake}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "LEASE_DIR": str(tmp_path / "lease"),
            "OUT": str(out),
        },
    )
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "lease/res/checks/log.txt").read_text()
    assert "left out" not in log and "within 480 s" in done.stdout  # (the lease's budget: CHECKS_BUDGET's default)
    started = [line.split("start: ", 1)[1] for line in log.splitlines() if "start: " in line]
    assert started == [f"{name}.txt" for name in GPU_CHECKS]
    assert "end: horovod.txt rc=" in log and "cmake:" in (tmp_path / "lease/res/checks/horovod.txt").read_text()
    recorded = calls.read_text()
    assert "-m dlscale.kmeans.compile_ahead" in recorded  # (inside the budget: a step of its own)
    assert "-m dlscale train tiny device=cuda" in recorded  # the stop file's run
    assert recorded.count('dist.init_process_group("nccl"') == 3  # NCCL_NET unset, "AWS Libfabric", "OFI"
    assert (out / "res.tgz").is_file() and "lesson 00_environment.ipynb: rc=0" in done.stdout
