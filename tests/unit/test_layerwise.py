"""LARS (and LARC, its clip mode) and LAMB against plain per-tensor implementations of the papers' equations."""

import copy
import math

import pytest
import torch
from torch import nn

from dlscale.optim.factory import param_groups
from dlscale.optim.layerwise import LAMB, LARS


def small_model(dtype=torch.float64):
    """Several parameter shapes: 4-D conv weights, 2-D linear weights, 1-D biases and norm weights."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
        nn.ReLU(),
        nn.Linear(5, 2),
    ).to(dtype)


def batches(count, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(16, 2, 8, 8, generator=generator, dtype=dtype),
            torch.randn(16, 2, generator=generator, dtype=dtype),
        )
        for _ in range(count)
    ]


def backward(model, x, y):
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()


# -- references: one tensor at a time, written from the equations ------------------------------


def ref_lars(params, state, lr, momentum, wd, eta, eps, nesterov=False):
    for p in params:
        g, eligible = p.grad, p.ndim > 1
        w_norm, g_norm = p.norm(), g.norm()
        ratio = eta * w_norm / (g_norm + wd * w_norm + eps) if eligible and w_norm > 0 and g_norm > 0 else 1.0
        d = ratio * (g + (wd * p if eligible else 0))
        buf = state.setdefault(p, torch.zeros_like(p))
        buf.mul_(momentum).add_(d)
        p.sub_(lr * ((d + momentum * buf) if nesterov else buf))


def ref_lamb(params, state, t, lr, beta1, beta2, eps, wd):
    for p in params:
        g, eligible = p.grad, p.ndim > 1
        m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(beta1).add_((1 - beta1) * g)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        u = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
        if eligible:
            u = u + wd * p
        w_norm, u_norm = p.norm(), u.norm()
        ratio = w_norm / u_norm if eligible and w_norm > 0 and u_norm > 0 else 1.0
        p.sub_(lr * ratio * u)


def ref_larc_sgd(params, state, lr, momentum, wd, eta, eps, clip):
    for p in params:
        g, eligible = p.grad, p.ndim > 1
        w_norm, g_norm = p.norm(), g.norm()
        ratio = 1.0
        if eligible and w_norm > 0 and g_norm > 0:
            ratio = eta * w_norm / (g_norm + wd * w_norm + eps)
            if clip:
                ratio = min(ratio / lr, 1.0)
        d = ratio * (g + (wd * p if eligible else 0))
        buf = state.setdefault(p, torch.zeros_like(p))
        buf.mul_(momentum).add_(d)
        p.sub_(lr * buf)


def assert_same_weights(a, b, atol=1e-6):
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=atol, rtol=0), f"{name}: max diff {(x - y).abs().max():.3g}"


def run_pair(make_optimizer, reference, steps=20):
    model, ref_model = small_model(), small_model()
    optimizer, state = make_optimizer(model), {}
    for t, (x, y) in enumerate(batches(steps), 1):
        backward(model, x, y)
        optimizer.step()
        backward(ref_model, x, y)
        with torch.no_grad():
            reference(list(ref_model.parameters()), state, t)
    moved = sum((a - b).abs().sum() for a, b in zip(model.parameters(), small_model().parameters()))
    assert moved > 1e-3  # the optimizer really changed the weights
    return model, ref_model


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_paper(nesterov):
    model, ref = run_pair(
        lambda m: LARS(
            m.parameters(), lr=2.0, momentum=0.9, weight_decay=5e-3, trust_coefficient=1e-3, nesterov=nesterov
        ),
        lambda ps, st, t: ref_lars(ps, st, 2.0, 0.9, 5e-3, 1e-3, 1e-8, nesterov),
    )
    assert_same_weights(model, ref)


def test_lamb_matches_the_paper():
    model, ref = run_pair(
        lambda m: LAMB(m.parameters(), lr=0.01, weight_decay=0.01),
        lambda ps, st, t: ref_lamb(ps, st, t, 0.01, 0.9, 0.999, 1e-6, 0.01),
    )
    assert_same_weights(model, ref)


@pytest.mark.parametrize("clip", [True, False])
def test_larc_matches_apex_around_sgd(clip):
    """apex's LARC around SGD (the reference) is LARS with trust_clip (clip mode), or LARS itself (scale mode)."""
    model, ref = run_pair(
        lambda m: LARS(
            m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.02, trust_clip=clip
        ),
        lambda ps, st, t: ref_larc_sgd(ps, st, 0.05, 0.9, 1e-3, 0.02, 1e-8, clip),
    )
    assert_same_weights(model, ref)


def test_param_groups_give_the_same_result_as_per_tensor_exclusion():
    """param_groups() (no decay on 1-D) and exclude_1d agree: the flags compose, nothing is decayed twice."""
    model, ref = run_pair(
        lambda m: LAMB(param_groups(m, 0.01), lr=0.01),
        lambda ps, st, t: ref_lamb(ps, st, t, 0.01, 0.9, 0.999, 1e-6, 0.01),
    )
    assert_same_weights(model, ref)


# -- corner cases ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: LARS(ps, lr=1.0),
        lambda ps: LAMB(ps, lr=0.01),
        lambda ps: LARS(ps, lr=0.1, trust_coefficient=0.02, trust_clip=True),
    ],
)
def test_zero_initialised_layer_trains_and_zero_gradient_is_harmless(make):
    layer = nn.Linear(4, 3)
    nn.init.zeros_(layer.weight)
    optimizer = make(layer.parameters())
    layer(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    assert layer.weight.abs().sum() > 0 and torch.isfinite(layer.weight).all()  # ‖w‖ = 0 gave ratio 1
    assert optimizer.trust_ratios[0][0] == 1.0
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)  # ‖g‖ = 0
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in layer.parameters())


def test_one_dimensional_tensors_neither_adapt_nor_decay_by_default():
    for exclude in (True, False):
        layer = nn.Linear(3, 3)
        before = copy.deepcopy(layer)
        optimizer = LAMB(layer.parameters(), lr=0.1, weight_decay=0.5, exclude_1d=exclude)
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        assert not torch.equal(layer.weight, before.weight)  # the 2-D weight decays
        assert torch.equal(layer.bias, before.bias) == exclude  # the bias only when not excluded


def test_adaptation_stays_on_without_weight_decay():
    layer = nn.Linear(8, 8)
    optimizer = LARS(layer.parameters(), lr=1.0, weight_decay=0.0)
    layer(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    assert optimizer.trust_ratios[0][0] < 0.1  # η‖w‖/‖g‖, not 1
    off = LARS(layer.parameters(), lr=1.0, adapt=False)
    off.step()
    assert torch.equal(off.trust_ratios[0], torch.ones(2))


def test_lamb_global_gradient_clipping_is_opt_in():
    model = small_model()
    x, y = batches(1)[0]
    backward(model, x, 1000 * y)  # a huge gradient
    grads = [p.grad.clone() for p in model.parameters()]
    clipped = LAMB(copy.deepcopy(model).parameters(), max_grad_norm=1.0)
    plain = LAMB(model.parameters())
    assert plain.max_grad_norm is None and clipped._global_clip() is None  # the copy has no grads yet
    for p, g in zip(clipped.param_groups[0]["params"], grads):
        p.grad = g.clone()
    factor = clipped._global_clip()
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
    assert float(factor) == pytest.approx(1.0 / total, rel=1e-5)


# -- with GradScaler, and through a checkpoint ---------------------------------------------------


@pytest.mark.parametrize("name", ["lars", "lamb", "larc"])
def test_gradscaler_unscales_first_and_a_skipped_step_changes_nothing(name):
    def make(model):
        if name == "lars":
            return LARS(model.parameters(), lr=1.0, weight_decay=1e-4)
        if name == "lamb":
            return LAMB(model.parameters(), lr=0.01)
        return LARS(model.parameters(), lr=0.1, momentum=0.9, trust_coefficient=0.02, trust_clip=True)

    plain_model, scaled_model = small_model(torch.float32), small_model(torch.float32)
    plain, scaled = make(plain_model), make(scaled_model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    for x, y in batches(5, torch.float32):
        backward(plain_model, x, y)
        plain.step()
        scaled.zero_grad(set_to_none=True)
        scaler.scale(nn.functional.mse_loss(scaled_model(x), y)).backward()
        scaler.step(scaled)
        scaler.update()
    assert_same_weights(plain_model, scaled_model, atol=1e-5)  # trust ratios saw unscaled gradients

    weights = {k: v.clone() for k, v in scaled_model.named_parameters()}
    state = copy.deepcopy(scaled.state_dict())
    x, y = batches(1, torch.float32)[0]
    scaled.zero_grad(set_to_none=True)
    scaler.scale(nn.functional.mse_loss(scaled_model(x), y)).backward()
    next(scaled_model.parameters()).grad[0].fill_(float("inf"))
    scaler.step(scaled)  # skipped: found inf
    scaler.update()
    for key, value in scaled_model.named_parameters():  # (batch-norm statistics move in any forward pass)
        assert torch.equal(value, weights[key]), key
    assert str(scaled.state_dict()) == str(state)


@pytest.mark.parametrize("name", ["lars", "lamb", "larc"])
def test_state_dict_round_trip_continues_identically(name):
    def make(model):
        if name == "lars":
            return LARS(param_groups(model, 1e-4), lr=1.0)
        if name == "lamb":
            return LAMB(param_groups(model, 0.01), lr=0.01)
        return LARS(param_groups(model, 1e-4), lr=0.1, trust_coefficient=0.02, trust_clip=True)

    data = batches(20)
    model = small_model()
    optimizer = make(model)
    for x, y in data[:10]:
        backward(model, x, y)
        optimizer.step()
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    twin = small_model()
    twin.load_state_dict(saved_model)
    twin_optimizer = make(twin)
    twin_optimizer.load_state_dict(saved_optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(twin_optimizer, lambda t: 1.0)  # groups are live after loading
    assert scheduler.optimizer.param_groups is twin_optimizer.param_groups
    for x, y in data[10:]:
        for m, o in ((model, optimizer), (twin, twin_optimizer)):
            backward(m, x, y)
            o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


# -- the same as timm's, with equivalent settings ------------------------------------------------


def test_lamb_matches_timm():
    from dlscale.bench.optimizers import timm_optimizers

    timm = timm_optimizers()
    assert timm is not None, "timm is a test dependency (make test installs it)"
    model, other = small_model(), small_model()
    ours = LAMB(param_groups(model, 0.01), lr=0.01)
    theirs = timm["Lamb"](param_groups(other, 0.01), lr=0.01, max_grad_norm=None)
    for x, y in batches(20):
        for m, o in ((model, ours), (other, theirs)):
            backward(m, x, y)
            o.step()
    assert_same_weights(model, other)


def test_lars_matches_timm():
    from dlscale.bench.optimizers import timm_optimizers

    timm = timm_optimizers()
    assert timm is not None, "timm is a test dependency (make test installs it)"
    model, other = small_model(), small_model()
    ours = LARS(param_groups(model, 5e-3), lr=0.5, momentum=0.9)
    theirs = timm["Lars"](param_groups(other, 5e-3), lr=0.5, momentum=0.9, trust_coeff=1e-3)
    for x, y in batches(20):
        for m, o in ((model, ours), (other, theirs)):
            backward(m, x, y)
            o.step()
    assert_same_weights(model, other)
