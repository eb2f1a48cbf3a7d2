"""Comparing two trainings: the largest difference between their weights.

Lessons 05 and 06 check that N ranks compute what one process computes; the tests do the
same with a tolerance (``tests/conftest.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn


def _state(model: nn.Module | Mapping[str, torch.Tensor] | Any) -> Mapping[str, torch.Tensor]:
    model = getattr(model, "model", model)  # a Result: its trained model
    return model.state_dict() if isinstance(model, nn.Module) else model


def largest_weight_difference(a: Any, b: Any) -> float:
    """max |a - b| over every tensor of two models (or state dicts, or training Results) of one architecture."""
    first, second = _state(a), _state(b)
    if list(first) != list(second):
        missing = sorted(set(first) ^ set(second))
        raise ValueError(f"the two models differ in their tensors ({', '.join(missing[:4])} ...)")
    return max(
        (  # (on the CPU: the two may come from different devices)
            (x.detach().cpu().double() - second[name].detach().cpu().double()).abs().max().item()
            for name, x in first.items()
            if x.is_floating_point()
        ),
        default=0.0,
    )
