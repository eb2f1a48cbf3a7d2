"""Layer-wise adaptive optimizers for large batches: LARS (with LARC as its clip mode) and LAMB.

Each scales every tensor's update by a *trust ratio* that compares the size of the
weights with the size of the step, so no layer moves by more than a fraction of its own
norm however large the learning rate — the property that lets a large batch use a large
learning rate (lesson 07).

Conventions, where implementations differ (see ``shared/REFERENCE.md``):

- *Adaptation* (the trust ratio) and *weight decay* are independent per-group settings
  (``adapt`` and ``weight_decay``); setting ``weight_decay=0`` does not turn adaptation off.
- With ``exclude_1d=True`` (the default) tensors with one dimension or fewer — biases and
  norm weights — get neither adaptation nor weight decay, whatever their group says.
- A trust ratio is 1 where the weight norm or the update norm is 0 (a zero-initialised
  layer still trains), computed with ``torch.where`` so the device never syncs.
- The updates are multi-tensor (``torch._foreach_*``): per-tensor norms with
  ``_foreach_norm``, all trust ratios of a group as one tensor.
- Called through ``GradScaler.step`` they see unscaled gradients, and a step that the
  scaler skips for inf/NaN leaves their state untouched.
- The last trust ratios of each group are kept in ``optimizer.trust_ratios`` (a list of
  tensors, one per group, aligned with the group's parameters that had gradients) for plots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from dlscale.distributed.dtensors import clip_factor, full_norms, is_sharded, local


def _norms(tensors: list[Tensor], masks: _GroupMasks | None = None) -> Tensor:
    """Per-tensor L2 norms as one tensor: float32 at least, float64 for float64 tensors.

    Of the whole tensors, also where each rank holds a shard (FSDP, tensor parallelism):
    ``masks.sharded`` then names the DTensors the local ``tensors`` belong to.
    """
    return full_norms(tensors, masks.sharded if masks is not None else None)


def _trust_ratios(
    weight_norms: Tensor, step_norms: Tensor, adapt: Tensor, scale: float = 1.0, denominator: Tensor | None = None
) -> Tensor:
    """``scale * ‖w‖ / denominator`` (default ``‖step‖``) where ``adapt`` and both norms are positive, else 1."""
    denominator = step_norms if denominator is None else denominator
    usable = adapt & (weight_norms > 0) & (step_norms > 0)
    return torch.where(usable, scale * weight_norms / denominator.clamp_min(torch.finfo(torch.float32).tiny), 1.0)


@dataclass
class _GroupMasks:
    """Which tensors of a group adapt and decay, worked out once and reused while the group is unchanged."""

    adapt: Tensor | None  # bool mask on the parameters' device; None when no tensor of the group adapts
    decay: list[bool]
    chosen: list[int]  # indices of the tensors that decay
    decay_mask: Tensor
    chosen_index: Tensor  # ``chosen`` as a tensor on the parameters' device
    all_decay: bool
    originals: list[Tensor]  # the parameters as the optimizer holds them (DTensors under FSDP/TP): state keys
    sharded: list[Tensor] | None  # the same, when any of them is split over ranks; else None


def _lars_ratios(
    params: list[Tensor],
    grads: list[Tensor],
    masks: _GroupMasks,
    weight_decay: float,
    trust_coefficient: float,
    eps: float,
) -> Tensor:
    """LARS's ``η‖w‖ / (‖g‖ + λ‖w‖ + eps)`` per tensor (λ only where the tensor decays), 1 where unusable."""
    w_norm, g_norm = _norms(params, masks), _norms(grads, masks)
    decay_norm = weight_decay * w_norm if masks.all_decay else torch.where(masks.decay_mask, weight_decay * w_norm, 0.0)
    return _trust_ratios(w_norm, g_norm, masks.adapt, trust_coefficient, g_norm + decay_norm + eps)


class _LayerwiseMixin:
    """What LARS and LAMB share: which tensors adapt and decay, and the ratios kept for plots."""

    exclude_1d: bool
    trust_ratios: list[Tensor]

    def _split(self, group: dict) -> tuple[list[Tensor], list[Tensor], _GroupMasks]:
        """Parameters with gradients, their gradients, and the group's masks.

        Under FSDP or tensor parallelism the tensors returned are this rank's shards: the
        arithmetic is element-wise, and only the norms need the other ranks (:func:`_norms`).
        """
        originals = [p for p in group["params"] if p.grad is not None]
        params, grads = [local(p) for p in originals], [local(p.grad) for p in originals]
        key = (tuple(map(id, originals)), bool(group["adapt"]), group["weight_decay"] != 0)
        maskss = self.__dict__.setdefault("_maskss", {})
        masks = maskss.get(key)
        if masks is None:
            if any(g.is_sparse for g in grads):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            eligible = [not (self.exclude_1d and p.ndim <= 1) for p in params]
            device = params[0].device if params else "cpu"
            adapt = [group["adapt"] and e for e in eligible]
            decay = [e and group["weight_decay"] != 0 for e in eligible]
            chosen = [i for i, d in enumerate(decay) if d]
            masks = _GroupMasks(
                torch.tensor(adapt, dtype=torch.bool, device=device) if any(adapt) else None,
                decay,
                chosen,
                torch.tensor(decay, device=device),
                torch.tensor(chosen, device=device, dtype=torch.long),
                all(decay),
                originals,
                originals if any(map(is_sharded, originals)) else None,
            )
            if len(maskss) > 64:  # groups whose parameters keep changing: do not grow without bound
                maskss.clear()
            maskss[key] = masks
        return params, grads, masks

    @staticmethod
    def _evaluate(closure: Callable[[], Any] | None) -> Any:
        """Run torch's optional closure (re-evaluates the loss, with gradients on)."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _state(self, masks: _GroupMasks, key: str) -> list[Tensor]:
        """The ``key`` state tensor of each parameter (this rank's shard), created (zeros) only where missing.

        The state is made like the parameter (a DTensor under FSDP/TP), so that sharded
        checkpoints save and reshard it with the parameter.
        """
        out = []
        for p in masks.originals:
            state = self.state[p]
            if key not in state:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            out.append(local(state[key]))
        return out

    def _keep(self, index: int, ratios: Tensor) -> None:
        while len(self.trust_ratios) <= index:
            self.trust_ratios.append(torch.empty(0))
        self.trust_ratios[index] = ratios.detach()


def _with_decay(grads: list[Tensor], params: list[Tensor], decay: list[bool], weight_decay: float) -> list[Tensor]:
    """New tensors ``grad + weight_decay * param`` (just ``grad`` copied where a tensor does not decay)."""
    if all(decay):
        return list(torch._foreach_add(grads, params, alpha=weight_decay))
    out = list(torch._foreach_mul(grads, 1.0))
    _add_decay(out, params, decay, weight_decay)
    return out


def _add_decay(
    targets: list[Tensor],
    params: list[Tensor],
    decay: list[bool],
    weight_decay: float,
    scales: list[Tensor] | None = None,
) -> None:
    """``target += weight_decay * scale * param`` in place, for the tensors that decay."""
    chosen = [i for i, d in enumerate(decay) if d]
    if not chosen:
        return
    sources = [params[i] for i in chosen]
    if scales is not None:
        sources = torch._foreach_mul(sources, [scales[i] for i in chosen])
    torch._foreach_add_([targets[i] for i in chosen], sources, alpha=weight_decay)


class LARS(_LayerwiseMixin, Optimizer):
    """Layer-wise Adaptive Rate Scaling: SGD with momentum and a per-tensor trust ratio.

    You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks" (arXiv:1708.03888).
    For each tensor ``w`` with gradient ``g``::

        r = trust_coefficient * ‖w‖ / (‖g‖ + weight_decay * ‖w‖ + eps)     (1 if a norm is 0)
        d = r * (g + weight_decay * w)
        buf = momentum * buf + d
        w = w - lr * buf                      (nesterov: w - lr * (d + momentum * buf))

    The global LR sits outside the momentum buffer, as in the PyTorch implementations
    (identical to the paper at a constant LR). Because the per-tensor step is about
    ``lr * trust_coefficient * ‖w‖``, useful global LRs are large (1 to 30), not SGD's.

    ``trust_clip=True`` is NVIDIA apex's LARC in its clip mode (as timm's ``Lars(trust_clip=True)``):
    ``r = min(r / lr, 1)``, so a tensor's adaptive LR never exceeds the global one, and SGD's
    LRs apply (``optimizer=larc``, with apex's trust coefficient 0.02). Unlike apex, decay is
    applied even where a norm is zero. Without the clip, LARC's scale mode is LARS itself.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 1e-3,
        eps: float = 1e-8,
        nesterov: bool = False,
        adapt: bool = True,
        exclude_1d: bool = True,
        trust_clip: bool = False,
    ):
        if lr <= 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError(
                f"LARS needs lr > 0, momentum >= 0, weight_decay >= 0, trust_coefficient > 0; got "
                f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, "
                f"trust_coefficient={trust_coefficient}"
            )
        self.exclude_1d = exclude_1d
        self.trust_ratios = []
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                trust_coefficient=trust_coefficient,
                eps=eps,
                nesterov=nesterov,
                adapt=adapt,
                trust_clip=trust_clip,
            ),
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate(closure)
        for index, group in enumerate(self.param_groups):
            params, grads, masks = self._split(group)
            if not params:
                continue
            wd, lr, momentum = group["weight_decay"], group["lr"], group["momentum"]
            if masks.adapt is None and (momentum == 0 or not group["nesterov"]):  # no trust ratio: plain SGD
                self._keep(index, torch.ones(len(params), device=params[0].device))
                steps = _with_decay(grads, params, masks.decay, wd) if masks.chosen else grads
                if momentum:
                    buffers = self._state(masks, "momentum_buffer")
                    torch._foreach_mul_(buffers, momentum)
                    torch._foreach_add_(buffers, steps)
                    steps = buffers
                torch._foreach_add_(params, steps, alpha=-lr)
                continue
            if masks.adapt is None:
                ratios = torch.ones(len(params), device=params[0].device)
            else:
                ratios = _lars_ratios(params, grads, masks, wd, group["trust_coefficient"], group["eps"])
                if group.get("trust_clip"):  # LARC's clip mode: the adaptive LR never exceeds the global one
                    ratios = torch.where(masks.adapt, (ratios / lr).clamp(max=1.0), ratios)
            self._keep(index, ratios)
            ratios = ratios.to(params[0].dtype)
            chosen = masks.chosen
            # Everything in place (fresh full-size tensors cost more than the arithmetic):
            # d = r * (g + wd * w) goes straight into the momentum buffer.
            if momentum:
                buffers = self._state(masks, "momentum_buffer")
                torch._foreach_mul_(buffers, momentum)
                torch._foreach_addcmul_(buffers, grads, list(ratios.unbind()))
                if masks.all_decay:
                    torch._foreach_addcmul_(buffers, params, list((ratios * wd).unbind()))
                elif chosen:
                    torch._foreach_addcmul_(
                        [buffers[i] for i in chosen],
                        [params[i] for i in chosen],
                        list((ratios[masks.chosen_index] * wd).unbind()),
                    )
                if not group["nesterov"]:
                    torch._foreach_add_(params, buffers, alpha=-lr)
                    continue
            # w -= lr * r * (g + wd * w): w *= (1 - lr * r * wd) first (it needs the old w), then w -= lr * r * g
            if chosen:
                torch._foreach_mul_(
                    [params[i] for i in chosen], list((1 - lr * wd * ratios[masks.chosen_index]).unbind())
                )
            torch._foreach_addcmul_(params, grads, list((-lr * ratios).unbind()))
            if momentum:  # nesterov: w -= lr * (d + momentum * buf)
                torch._foreach_add_(params, buffers, alpha=-lr * momentum)
        return loss


class LAMB(_LayerwiseMixin, Optimizer):
    """Layer-wise Adaptive Moments for Batch training: Adam moments with a per-tensor trust ratio.

    You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
    (arXiv:1904.00962), Algorithm 2. At step ``t``, for each tensor ``w`` with gradient ``g``::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        u = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)     (bias correction optional)
        u = u + weight_decay * w                  (decoupled decay, inside the trust ratio)
        r = ‖w‖ / ‖u‖                             (1 if a norm is 0; clamped to trust_clip if given)
        w = w - lr * r * u

    ``max_grad_norm`` (default None: off, as in the paper) first scales all gradients of all
    groups so that their global norm is at most that value; apex's and timm's "NVLAMB" turn
    this on by default, which clips twice if you also call ``clip_grad_norm_``. The step
    count ``t`` is kept per group.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        trust_clip: float | None = None,
        max_grad_norm: float | None = None,
        adapt: bool = True,
        exclude_1d: bool = True,
    ):
        if lr <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps <= 0 or weight_decay < 0:
            raise ValueError(
                f"LAMB needs lr > 0, 0 <= betas < 1, eps > 0, weight_decay >= 0; got lr={lr}, "
                f"betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        self.exclude_1d = exclude_1d
        self.max_grad_norm = max_grad_norm
        self.trust_ratios = []
        self._scratch: dict[Tensor, Tensor] = {}  # per-parameter work space, not state: never checkpointed
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=tuple(betas),
                eps=eps,
                weight_decay=weight_decay,
                bias_correction=bias_correction,
                trust_clip=trust_clip,
                adapt=adapt,
                step=0,
            ),
        )

    def _scratch_for(self, params: list[Tensor]) -> list[Tensor]:
        out = []
        for p in params:
            buffer = self._scratch.get(p)
            if buffer is None or buffer.shape != p.shape or buffer.dtype != p.dtype:
                buffer = self._scratch[p] = torch.empty_like(p)
            out.append(buffer)
        return out

    def _global_clip(self) -> Tensor | None:
        """The factor that brings the global gradient norm down to ``max_grad_norm`` (None if off)."""
        if self.max_grad_norm is None:
            return None
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return None
        return clip_factor(grads, self.max_grad_norm)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate(closure)
        clip = self._global_clip()
        for index, group in enumerate(self.param_groups):
            params, grads, masks = self._split(group)
            if not params:
                continue
            if clip is not None:
                grads = torch._foreach_mul(grads, clip.to(grads[0].dtype))
            group["step"] += 1
            beta1, beta2 = group["betas"]
            exp_avg, exp_avg_sq = self._state(masks, "exp_avg"), self._state(masks, "exp_avg_sq")
            torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
            c1, c2 = (
                ((1 - beta1 ** group["step"]), (1 - beta2 ** group["step"])) if group["bias_correction"] else (1.0, 1.0)
            )
            # The paper's update is u = m/c1 / (sqrt(v/c2) + eps) + wd*w. Written as
            # u = (sqrt(c2)/c1) * q with q = m / (sqrt(v) + eps*sqrt(c2)) + (c1*wd/sqrt(c2)) * w,
            # the scalar in front cancels in the trust ratio ‖w‖/‖u‖, which saves two passes.
            root_c2 = math.sqrt(c2)
            q = self._scratch_for(params)  # q = m / (sqrt(v) + eps*sqrt(c2)), all in place
            torch._foreach_copy_(q, exp_avg_sq)
            torch._foreach_sqrt_(q)
            torch._foreach_add_(q, group["eps"] * root_c2)
            torch._foreach_reciprocal_(q)
            torch._foreach_mul_(q, exp_avg)
            _add_decay(q, params, masks.decay, group["weight_decay"] * c1 / root_c2)
            if masks.adapt is None:  # no trust ratio in this group: w -= lr * u, a plain Adam step
                self._keep(index, torch.ones(len(params), device=params[0].device))
                torch._foreach_add_(params, q, alpha=-group["lr"] * root_c2 / c1)
                continue
            w_norm, q_norm = _norms(params, masks), _norms(q, masks)
            usable = masks.adapt & (w_norm > 0) & (q_norm > 0)
            ratios = torch.where(
                usable, w_norm / q_norm.clamp_min(torch.finfo(torch.float32).tiny) * (c1 / root_c2), 1.0
            )  # the paper's r = ‖w‖/‖u‖, 1 where unusable
            if group["trust_clip"] is not None:
                ratios = ratios.clamp(max=group["trust_clip"])
            self._keep(index, ratios)
            multipliers = ratios * (-group["lr"] * root_c2 / c1)  # w -= lr * r * u
            torch._foreach_addcmul_(params, q, list(multipliers.to(q[0].dtype).unbind()))
        return loss
