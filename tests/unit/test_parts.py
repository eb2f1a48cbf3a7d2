"""Small parts of the engine: schedule, parameter groups, model, throughput, RNG state."""

import random

import numpy as np
import pytest
import torch

from dlscale.checkpoint import rng_state, set_rng_state
from dlscale.config import load_config
from dlscale.data import TARGET_NAMES
from dlscale.metrics.throughput import ThroughputMeter
from dlscale.models import CNNRegressor, build_model, count_parameters
from dlscale.optim.factory import build_optimizer, param_groups
from dlscale.optim.schedules import lr_factor, lr_trace, scale_lr, warmup_schedule


def test_scale_lr_rules_and_errors():
    assert scale_lr(0.1, 256, 8192, "linear") == pytest.approx(3.2)
    assert scale_lr(0.1, 256, 8192, "sqrt") == pytest.approx(0.1 * 32**0.5)
    assert scale_lr(0.1, 256, 8192, "none") == 0.1
    assert scale_lr(0.1, 256, 64, "linear") == pytest.approx(0.025)  # smaller batches scale down
    with pytest.raises(ValueError, match="rule must be one of none, linear, sqrt"):
        scale_lr(0.1, 256, 512, "cubic")
    with pytest.raises(ValueError, match="base_lr > 0"):
        scale_lr(0.0, 256, 512)
    with pytest.raises(ValueError, match="batches >= 1"):
        scale_lr(0.1, 0, 512)


@pytest.mark.parametrize(
    "decay, at_end", [("cosine", 0.0), ("linear", 0.0), ("poly", 0.0), ("none", 1.0), ("step", 0.01)]
)
def test_warmup_hits_start_peak_and_end(decay, at_end):
    trace = lr_trace(2.0, warmup_steps=10, total_steps=110, decay=decay, warmup_start_factor=0.1)
    assert trace[0] == pytest.approx(0.2)  # step 0: the start factor, never 0
    assert trace[5] == pytest.approx(0.2 + 1.8 * 5 / 10)
    assert trace[10] == pytest.approx(2.0)  # end of warmup: the peak
    end = lr_factor(10, 110, decay, 0.1)(110)
    assert end == pytest.approx(at_end, abs=1e-12)
    assert max(trace) == pytest.approx(2.0)


def test_schedule_shapes_between_the_ends():
    assert lr_factor(0, 100, "cosine")(50) == pytest.approx(0.5)
    assert lr_factor(0, 100, "linear")(25) == pytest.approx(0.75)
    assert lr_factor(0, 100, "poly", poly_power=2.0)(50) == pytest.approx(0.25)
    assert [lr_factor(0, 100, "step")(t) for t in (49, 50, 74, 75)] == pytest.approx([1, 0.1, 0.1, 0.01])
    assert lr_factor(0, 100, "cosine", min_factor=0.1)(100) == pytest.approx(0.1)
    assert lr_factor(4, 10)(0) == 0.25  # default start: 1 / warmup_steps
    with pytest.raises(ValueError, match="decay must be one of"):
        lr_factor(0, 10, "exp")
    with pytest.raises(ValueError, match="warmup_start_factor must be in"):
        lr_factor(5, 10, "cosine", 0.0)


def test_schedule_is_a_torch_scheduler_that_checkpoints():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = warmup_schedule(optimizer, 3, 10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1 / 3)  # the first step is never at lr 0
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    fresh_optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    fresh = warmup_schedule(fresh_optimizer, 3, 10)
    fresh.load_state_dict(state)
    optimizer.step(), scheduler.step(), fresh_optimizer.step(), fresh.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr()


def test_biases_and_norm_parameters_do_not_decay():
    model = CNNRegressor(width=4, depth=2)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim <= 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    sgd = build_optimizer(load_config("tiny", ["optimizer=sgd", "momentum=0.8"]).sections.optim, model)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.8


def test_model_shapes_and_channels_last_agree():
    cfg = load_config("tiny", ["width=4", "depth=2"])
    model = build_model(cfg).eval()
    x = torch.randn(5, 1, 16, 16)
    assert model(x).shape == (5, len(TARGET_NAMES))  # log A, n and the blur
    nhwc = build_model(load_config("tiny", ["width=4", "depth=2", "channels_last=true"])).eval()
    nhwc.load_state_dict(model.state_dict())
    assert nhwc.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(nhwc(x.contiguous(memory_format=torch.channels_last)), model(x), atol=1e-5)
    assert count_parameters(CNNRegressor(width=8, depth=3)) > count_parameters(CNNRegressor(width=4, depth=3))


def test_throughput_meter_skips_warmup_and_pauses(monkeypatch):
    clock = iter([0.0, 5.0, 6.0, 7.0, 100.0, 101.0])  # a slow first step, then 1 s steps, a pause
    monkeypatch.setattr("dlscale.metrics.throughput.time.perf_counter", lambda: next(clock))
    meter = ThroughputMeter(warmup_steps=2)
    for _ in range(4):
        meter.step(10)
    meter.pause()
    meter.step(10)
    meter.step(10)
    assert meter.samples_per_s == pytest.approx(10.0)  # (7-6) and (101-100): 20 samples in 2 s
    assert meter.aggregate(4) == pytest.approx(40.0)


def test_rng_state_round_trips_every_generator():
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_waiting_asks_often_at_first_and_every_poll_seconds_later(monkeypatch):
    from dlscale.jobs import slurm_jobs

    clock, sleeps = [0.0], []

    def sleep(seconds):
        sleeps.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(slurm_jobs.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(slurm_jobs.time, "sleep", sleep)
    slurm_jobs.wait_until(lambda: clock[0] >= 60, 600, "a minute", poll=2.0, quick=0.25)
    assert sleeps[0] == 0.25 and max(sleeps) == 2.0  # a short job seen ending within a quarter second
    assert sleeps == sorted(sleeps) and len(sleeps) < 60  # a long one asked about every 2 s, not 4 times a second
    with pytest.raises(TimeoutError, match="waited 5 s for never"):
        slurm_jobs.wait_until(lambda: False, 5, "never", poll=0.5)
