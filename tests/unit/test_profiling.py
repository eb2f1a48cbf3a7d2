"""NVTX ranges, the step profiler, the Nsight Systems helpers, FLOPs and MFU."""

import json

import pytest
import torch

from dlscale import profiling
from dlscale.models import CNNRegressor
from dlscale.profiling import (
    flops_per_sample,
    mfu,
    nsys_command,
    nsys_stats_command,
    nvtx_range,
    parse_nvtx_sum,
    peak_flops,
)
from dlscale.train import train


def _profiled_names(function):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        function()
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("nvtx_installed", [True, False])
def test_nvtx_range_is_a_context_manager_and_a_decorator(monkeypatch, nvtx_installed):
    import nvtx  # the profiling extra is a test dependency: the real package, no-op without a profiler

    if not nvtx_installed:
        monkeypatch.setattr(profiling.nvtx, "_nvtx_module", False)  # as if it were missing
    else:
        monkeypatch.setattr(profiling.nvtx, "_nvtx_module", nvtx)

    @nvtx_range("decorated_work")
    def work():
        return torch.ones(4).sum()

    def run():
        with nvtx_range("outer", color="blue"):
            work()
            work()

    names = _profiled_names(run)
    assert {"outer", "decorated_work"} <= names


def test_step_profiler_writes_a_trace_with_the_training_ranges(tiny):
    result = train(tiny(profile_steps=(3, 6), max_steps=10))
    trace = json.loads((result.run_dir / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer"} <= names
    summary = json.loads((result.run_dir / "profile_summary.json").read_text())
    assert summary["steps"] == 3 and [r["name"] for r in summary["ranges"]] == [
        "data",
        "forward",
        "backward",
        "optimizer",
    ]
    assert all(r["calls"] == 3 and r["cpu_ms_per_step"] > 0 for r in summary["ranges"])
    # torch's operators are listed (which one tops the list moves with the machine's load: on a busy one the
    # DataLoader's own range can take longest)
    assert any("aten::" in op["name"] for op in summary["top_operators"])


def test_no_trace_without_a_window(tiny):
    result = train(tiny(max_steps=4))
    assert not (result.run_dir / "trace.json").exists()


def test_nsys_command_has_the_recommended_flags():
    command = nsys_command(["demo", "profile_steps=20,30"])
    assert command[:2] == ["nsys", "profile"]
    for flag in ("--trace=cuda,nvtx,osrt,cudnn,cublas", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"):
        assert flag in command
    assert any(part.startswith("--output=") and "%q{SLURM_PROCID}" in part for part in command)
    assert command[-5:] == ["python", "-m", "dlscale.train", "demo", "profile_steps=20,30"]
    assert "--cuda-graph-trace=node" not in command and "--cuda-graph-trace=node" in nsys_command(cuda_graphs=True)
    assert nsys_stats_command("r.nsys-rep")[2:4] == ["--report", "nvtx_sum"]
    assert nsys_stats_command("r.nsys-rep", old_names=True)[3] == "nvtxsum"


NEW_FORMAT = """\
Generating SQLite file report.sqlite from report.nsys-rep
Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2024.2.1/host-linux-x64/reports/nvtx_sum.py]...
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
52.1,1043872011,100,10438720.1,10401233.0,10022113,11893321,301122.4,PushPop,:backward
31.4,629123874,100,6291238.7,6280011.5,6102345,6702211,98211.7,PushPop,:forward
10.2,204352110,100,2043521.1,2011322.0,1899877,2533211,60011.9,PushPop,:optimizer
6.3,126223391,101,1249736.5,1203344.0,1100211,3011223,201223.3,PushPop,:data
"""

OLD_FORMAT = """\
Using report.sqlite for SQL queries.
Running [/opt/nvidia/nsight-systems/2021.3.1/target-linux-x64/reports/nvtxsum.py report.sqlite]...

Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,StdDev,Range
60.0,600000000,50,12000000.0,11000000,13000000,500000.0,backward
40.0,400000000,50,8000000.0,7000000,9000000,400000.0,forward
"""


def test_nvtx_sum_parser_reads_new_and_old_nsys_output():
    rows = parse_nvtx_sum(NEW_FORMAT)
    assert [r["range"] for r in rows] == ["backward", "forward", "optimizer", "data"]
    assert rows[0]["total_ns"] == 1043872011 and rows[0]["instances"] == 100 and rows[0]["time_percent"] == 52.1
    assert rows[3]["med_ns"] == 1203344.0 and rows[3]["style"] == "PushPop"
    old = parse_nvtx_sum(OLD_FORMAT)
    assert [(r["range"], r["avg_ns"], r["instances"]) for r in old] == [
        ("backward", 12000000.0, 50),
        ("forward", 8000000.0, 50),
    ]
    with pytest.raises(ValueError, match="no NVTX summary table"):
        parse_nvtx_sum("nothing to see\n")


def test_flops_per_sample_counts_forward_and_backward_and_leaves_the_model_alone():
    model = CNNRegressor(width=4, depth=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops = flops_per_sample(model, (1, 8, 8))
    conv_forward = 2 * 8 * 8 * 4 * 9 * 1 + 2 * 8 * 8 * 4 * 9 * 4  # the two 3x3 convolutions, one sample
    assert 2 * conv_forward < flops < 4 * conv_forward  # backward costs about twice the forward
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)
    assert mfu(1000.0, 1e9, None) is None and peak_flops("cpu", "bf16") is None


class _CudaProfilerCalls:
    """Stands in for torch.cuda's profiler API (no GPU here) and records what was called at which step."""

    def __init__(self, monkeypatch):
        self.calls, self.step = [], None
        monkeypatch.setattr(torch.cuda.profiler, "start", lambda: self.calls.append(("start", self.step)))
        monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: self.calls.append(("stop", self.step)))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def run(self, profiler, first, last):
        self.step = first
        with profiler:
            for self.step in range(first + 1, last + 1):
                profiler.step(self.step)
        return self.calls


@pytest.mark.parametrize(
    "first_step, expected",
    [
        (0, [("start", 5), ("stop", 8)]),  # a fresh run
        (3, [("start", 5), ("stop", 8)]),  # resumed before the window: steps still count from the start
        (6, [("start", 6), ("stop", 8)]),  # resumed inside the window: what is left of it
        (9, []),  # resumed after it
    ],
)
def test_every_rank_opens_the_nsys_capture_range_at_the_right_steps(monkeypatch, tmp_path, first_step, expected):
    """A rank that is not the main one writes no trace but must still open and close nsys's window."""
    calls = _CudaProfilerCalls(monkeypatch)
    profiler = profiling.StepProfiler(tmp_path, 5, 8, torch.device("cuda"), trace=False, first_step=first_step)
    assert calls.run(profiler, first_step, 12) == expected


def test_under_nsys_the_trace_records_cpu_activity_only(tmp_path):
    cuda = torch.device("cuda")
    alone = profiling.StepProfiler(tmp_path, 2, 4, cuda, environ={})
    under = profiling.StepProfiler(tmp_path, 2, 4, cuda, environ={"DLSCALE_UNDER_NSYS": "1"})
    assert torch.profiler.ProfilerActivity.CUDA in alone.activities
    assert under.activities == [torch.profiler.ProfilerActivity.CPU]  # CUPTI is left to nsys


def test_a_resumed_run_profiles_what_is_left_of_its_window(tiny):
    train(tiny(max_steps=20, checkpoint_every=10))
    for path in sorted((tiny().resolved_run_dir / "checkpoints").glob("*.pt"))[1:]:
        path.unlink()  # as if it had died after step 10
    result = train(tiny(max_steps=20, checkpoint_every=10, resume=True, profile_steps=(12, 15)))
    summary = json.loads((result.run_dir / "profile_summary.json").read_text())
    assert summary["steps"] == 3 and all(r["calls"] == 3 for r in summary["ranges"])


def test_without_the_nvtx_package_ranges_go_through_torch_cuda_nvtx(monkeypatch):
    """A site's PyTorch module has CUDA but not the nvtx package: nsys must still see the ranges."""
    import sys

    pushed = []
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx now fails
    monkeypatch.setattr(profiling.nvtx, "_nvtx_module", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: pushed.append(("pop",)))
    with nvtx_range("forward"):
        pass
    assert pushed == [("push", "forward"), ("pop",)]
    assert profiling.nvtx_backend() == "torch.cuda.nvtx"


@pytest.mark.parametrize(
    "gpu, tf32, precision, expected, peak",
    [
        ("NVIDIA A100-SXM4-40GB", True, "fp32", "tf32", 156e12),  # cuDNN's default for convolutions
        ("NVIDIA A100-SXM4-40GB", False, "fp32", "fp32", 19.5e12),
        ("NVIDIA A100-SXM4-40GB", True, "bf16", "bf16", 312e12),
        ("Tesla V100-SXM2-16GB", True, "fp32", "fp32", 15.7e12),  # no TF32 on Volta
        ("NVIDIA H100 80GB HBM3", True, "bf16", "bf16", 989e12),  # the SXM card
        ("NVIDIA H100 PCIe", True, "bf16", "bf16", 756e12),  # was divided by the SXM peak
        ("NVIDIA H100 NVL", True, "fp32", "tf32", 417.5e12),
    ],
)
def test_mfu_divides_by_the_peak_the_run_really_had(monkeypatch, gpu, tf32, precision, expected, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: gpu)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    assert profiling.peak_precision("cuda", precision) == expected
    assert peak_flops("cuda", expected) == peak


def test_activation_checkpointings_recomputation_is_counted_apart_from_the_models_flops(tiny):
    """With activation checkpointing the counted FLOPs included the recomputed forward: MFU was hardware utilisation."""
    plain = train(tiny(model="vit", width=32, depth=2, heads=2, patch_size=4, max_steps=2))
    checkpointed = train(
        tiny(
            model="vit",
            width=32,
            depth=2,
            heads=2,
            patch_size=4,
            max_steps=2,
            activation_checkpointing=True,
            run_dir="runs/ac",
        )
    )
    summary = json.loads((checkpointed.run_dir / "summary.json").read_text())
    plain_summary = json.loads((plain.run_dir / "summary.json").read_text())
    assert summary["flops_per_sample"] == plain_summary["flops_per_sample"]  # the model's own
    assert 0 < summary["recomputed_flops_per_sample"] < summary["flops_per_sample"]  # a forward pass of the blocks
    assert "recomputed_flops_per_sample" not in plain_summary


def test_the_summary_names_the_peak_and_the_nvtx_backend(tiny):
    result = train(tiny(max_steps=2))
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["mfu_peak"] == {"precision": "fp32", "flops_per_s": None}  # a CPU: no known peak
    assert summary["applied"]["nvtx"] == "nvtx"  # the profiling extra is installed for the tests
