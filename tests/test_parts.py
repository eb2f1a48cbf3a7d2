"""Small parts of the engine: schedule, parameter groups, model, throughput, RNG state."""

import random

import numpy as np
import pytest
import torch

from dlscale.checkpoint import rng_state, set_rng_state
from dlscale.config import load_config
from dlscale.models import CNNRegressor, build_model, count_parameters
from dlscale.optim import build_optimizer, param_groups
from dlscale.schedules import lr_factor, warmup_schedule
from dlscale.throughput import ThroughputMeter


def test_warmup_then_cosine_to_zero():
    factor = lr_factor(warmup_steps=4, total_steps=14, decay="cosine")
    assert [factor(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(9) == pytest.approx(0.5)
    assert factor(14) == pytest.approx(0.0, abs=1e-12)
    linear = lr_factor(0, 10, "linear")
    assert linear(0) == 1.0 and linear(5) == 0.5
    assert lr_factor(2, 10, "none")(9) == 1.0
    with pytest.raises(ValueError, match="decay must be one of"):
        lr_factor(0, 10, "exp")


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
    sgd = build_optimizer(load_config("tiny", ["optimizer=sgd", "momentum=0.8"]), model)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.8


def test_model_shapes_and_channels_last_agree():
    cfg = load_config("tiny", ["width=4", "depth=2"])
    model = build_model(cfg).eval()
    x = torch.randn(5, 1, 16, 16)
    assert model(x).shape == (5, 2)
    nhwc = build_model(load_config("tiny", ["width=4", "depth=2", "channels_last=true"])).eval()
    nhwc.load_state_dict(model.state_dict())
    assert nhwc.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(nhwc(x.contiguous(memory_format=torch.channels_last)), model(x), atol=1e-5)
    assert count_parameters(CNNRegressor(width=8, depth=3)) > count_parameters(CNNRegressor(width=4, depth=3))


def test_throughput_meter_skips_warmup_and_pauses(monkeypatch):
    clock = iter([0.0, 5.0, 6.0, 7.0, 100.0, 101.0])  # a slow first step, then 1 s steps, a pause
    monkeypatch.setattr("dlscale.throughput.time.perf_counter", lambda: next(clock))
    meter = ThroughputMeter(warmup_steps=2)
    for _ in range(4):
        meter.step(10)
    meter.pause()
    meter.step(10)
    meter.step(10)
    assert meter.samples_per_s == pytest.approx(10.0)  # (7-6) and (101-100): 20 samples in 2 s


def test_rng_state_round_trips_every_generator():
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]
