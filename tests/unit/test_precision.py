"""The mixed-precision policy, and the fp16 underflow that loss scaling fixes."""

import math

import numpy as np
import pytest
import torch

from dlscale.runtime import precision as precision_module
from dlscale.runtime.precision import Precision, PrecisionError, gradient_underflow
from dlscale.train import train


@pytest.mark.parametrize("request_, expected", [("auto", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_cpu_policy(request_, expected):
    policy = Precision.resolve(request_, "cpu")
    assert policy.name == expected and policy.device_type == "cpu"
    assert policy.grad_scaler().is_enabled() == (expected == "fp16")  # the scaler is active only for fp16


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(PrecisionError, match="precision must be one of auto, fp32, bf16, fp16, fp64; got 'fp8'"):
        Precision.resolve("fp8", "cpu")


@pytest.mark.parametrize(
    "gpu, capability, bf16, auto",
    [
        ("NVIDIA A100-SXM4-40GB", (8, 0), True, "bf16"),
        ("NVIDIA H100 80GB HBM3", (9, 0), True, "bf16"),
        ("Tesla V100-SXM2-16GB", (7, 0), False, "fp16"),
        ("Tesla T4", (7, 5), False, "fp16"),
    ],
)
def test_gpu_policy_follows_the_compute_capability(monkeypatch, gpu, capability, bf16, auto):
    """The CUDA rules from a faked device capability (no GPU here; the device tool checks the real one).

    ``torch.cuda.is_bf16_supported()`` answers True on a V100 too (it counts emulation); the stand-in
    answers so everywhere, and the policy must not listen to it.
    """
    monkeypatch.setattr(precision_module, "_capability", lambda device: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: gpu)
    assert precision_module.supports_bf16("cuda") == bf16
    assert Precision.resolve("auto", "cuda").name == auto
    assert Precision.resolve("fp16", "cuda").name == "fp16"
    if bf16:
        assert Precision.resolve("bf16", "cuda").name == "bf16"
    else:
        with pytest.raises(
            PrecisionError, match=rf"bf16 needs a GPU with bfloat16 .*{gpu}.* has compute {capability[0]}"
        ):
            Precision.resolve("bf16", "cuda")


@pytest.mark.parametrize("arch, bf16", [("gfx90a:sramecc+:xnack-", True), ("gfx942", True), ("gfx908", False)])
def test_rocm_bf16_follows_the_architecture(monkeypatch, arch, bf16):
    """On ROCm builds the capability numbers say little; the architecture decides (MI250X is gfx90a)."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("Props", (), {"gcnArchName": arch}))
    monkeypatch.setattr(precision_module, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "AMD Instinct")
    assert precision_module.supports_bf16("cuda") == bf16
    assert Precision.resolve("auto", "cuda").name == ("bf16" if bf16 else "fp16")


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_autocast_changes_the_dtype_of_a_matmul(name, dtype):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with Precision.resolve(name, "cpu").autocast():
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32  # only inside the context


def test_loss_scaling_rescues_underflowing_gradients():
    """Gradients whose fate in fp16 IEEE rounding alone decides, so the fractions hold on every CPU.

    A bias-free linear layer fed ones, with the loss sum(out * y) over a batch of one, gets the
    gradient y_i in every weight of row i: one product by 1.0 and no sum, so no kernel can round it
    differently. The y_i span 1e-12 to 1e-2 (as gradients late in training do); fp16 turns to zero
    what lies below half its smallest subnormal (2^-25, about 3e-8), and a loss scale of 2^16 lifts
    most of them back. The expected fractions come from numpy's own float16 rounding.
    """
    y = torch.logspace(-12, -2, 101).reshape(1, -1)
    model = torch.nn.Linear(8, y.shape[1], bias=False)
    x = torch.ones(1, 8)
    product = lambda out, target: (out * target).sum()  # noqa: E731 - d(loss)/d(out) = target
    result = gradient_underflow(model, x, y, loss_fn=product)
    lost = lambda scale: float(np.mean(np.float16(y.numpy() * scale) == 0))  # noqa: E731
    assert result.elements == 8 * y.shape[1]
    assert result.unscaled == pytest.approx(lost(1.0)) and 0.4 < result.unscaled < 0.5  # those below ~3e-8
    assert result.scaled == pytest.approx(lost(2.0**16)) and result.scaled < result.unscaled / 2
    assert gradient_underflow(model, x, y, loss_fn=product, scale=1.0).scaled == pytest.approx(result.unscaled)


def test_fp64_keeps_parameters_and_data_in_float64(tiny):
    policy = Precision.resolve("fp64", "cpu")
    assert policy.param_dtype == torch.float64 and not policy.grad_scaler().is_enabled()
    result = train(tiny(precision="fp64", max_steps=12))
    assert result.applied["precision"] == "fp64"
    assert all(p.dtype == torch.float64 for p in result.model.parameters())
    assert all(map(math.isfinite, (row["loss"] for row in result.steps)))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_mixed_precision_runs_learn(tiny, name):
    result = train(tiny(precision=name, epochs=3))
    assert result.applied["precision"] == name and result.applied["grad_scaler"] == (name == "fp16")
    assert result.final["r2"] > 0.5
