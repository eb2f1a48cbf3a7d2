"""The mixed-precision policy, and the fp16 underflow that loss scaling fixes."""

import pytest
import torch

from dlscale import precision as precision_module
from dlscale.models import CNNRegressor
from dlscale.precision import Precision, PrecisionError, gradient_underflow
from dlscale.train import train


@pytest.mark.parametrize("request_, expected", [("auto", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_cpu_policy(request_, expected):
    policy = Precision.resolve(request_, "cpu")
    assert policy.name == expected and policy.device_type == "cpu"
    assert policy.grad_scaler().is_enabled() == (expected == "fp16")  # the scaler is active only for fp16


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(PrecisionError, match="precision must be one of auto, fp32, bf16, fp16; got 'fp8'"):
        Precision.resolve("fp8", "cpu")


@pytest.mark.parametrize("gpu, capability, bf16, auto", [
    ("NVIDIA A100-SXM4-40GB", (8, 0), True, "bf16"),
    ("NVIDIA H100 80GB HBM3", (9, 0), True, "bf16"),
    ("Tesla V100-SXM2-16GB", (7, 0), False, "fp16"),
])
def test_gpu_policy_rules(monkeypatch, gpu, capability, bf16, auto):
    """The CUDA rules, with the device's answers given (this machine has no GPU; the device tool checks the real one)."""
    monkeypatch.setattr(precision_module, "_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: gpu)
    assert Precision.resolve("auto", "cuda").name == auto
    assert Precision.resolve("fp16", "cuda").name == "fp16"
    if bf16:
        assert Precision.resolve("bf16", "cuda").name == "bf16"
    else:
        with pytest.raises(PrecisionError, match=r"bf16 needs a GPU with bfloat16 .* V100.* has compute 7.0"):
            Precision.resolve("bf16", "cuda")


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_autocast_changes_the_dtype_of_a_matmul(name, dtype):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with Precision.resolve(name, "cpu").autocast():
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32  # only inside the context


def test_loss_scaling_rescues_underflowing_gradients():
    torch.manual_seed(0)
    model = CNNRegressor(width=8, depth=2)
    x, y = torch.randn(32, 1, 16, 16), 0.01 * torch.randn(32, 2)
    tiny_loss = lambda out, target: torch.nn.functional.mse_loss(out, target) * 1e-3  # noqa: E731 - late in training
    result = gradient_underflow(model, x, y, loss_fn=tiny_loss)
    assert result.unscaled > 0.3 and result.scaled < 0.01 and result.elements > 1000
    assert gradient_underflow(model, x, y, loss_fn=tiny_loss, scale=1.0).scaled == pytest.approx(result.unscaled)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_mixed_precision_runs_learn(tiny, name):
    result = train(tiny(precision=name, epochs=3))
    assert result.applied["precision"] == name and result.applied["grad_scaler"] == (name == "fp16")
    assert result.final["r2"] > 0.5
