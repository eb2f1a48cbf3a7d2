"""How the model is prepared for the training step: compiled, then wrapped for data parallelism.

:func:`build_step_model` is where a parallelism is applied to the model (PyTorch's order:
``torch.compile`` on the plain module, then DDP around it); the training loop calls whatever
it returns and keeps the plain module for checkpoints and evaluation. Horovod wraps the
optimizer instead (:func:`dlscale.distributed.wrap_optimizer`).
"""

from __future__ import annotations

import torch
from torch import nn

from . import distributed
from .config import TrainConfig


def build_step_model(model: nn.Module, env: distributed.DistEnv, cfg: TrainConfig) -> nn.Module:
    """The module the training step calls: ``model`` compiled when asked, then wrapped in DDP.

    The order is PyTorch's guidance: torch.compile does not trace DDP's hooks well, so the
    inner module is compiled and DDP wraps the result. ``model`` itself stays plain, for
    checkpoints and evaluation.
    """
    inner = torch.compile(model, mode="reduce-overhead" if cfg.cuda_graphs else None) if cfg.compile else model
    return distributed.wrap_model(inner, env, cfg.bucket_cap_mb, cfg.gradient_as_bucket_view, cfg.static_graph)


def cuda_graph_skips() -> int:
    """How many times inductor has declined to capture a CUDA graph in this process."""
    from torch._dynamo.utils import counters
    return counters["inductor"]["cudagraph_skips"]


