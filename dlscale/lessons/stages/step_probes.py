"""Probes more than one stage asks of its training step: each step's gradients are its own batch's, one backward
pass per optimizer step (``accumulate`` with gradient accumulation), and the optimizer steps once per logged step.

They read what the step did (:func:`~dlscale.lessons.stage_probes.watch`), not which calls made it so: gradients
cleared by ``optimizer.zero_grad()``, ``model.zero_grad()`` or ``p.grad = None`` all leave the next backward pass
nothing to add to.
"""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import steps_of


def own_gradients(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Each step's first backward pass finds no gradient left from the step before, and each optimizer step finds
    some gradient (they were not cleared between the backward pass and the step)."""
    steps = max(steps_of(result), seen["optimizer_steps"])
    if seen["stale_backwards"]:
        return (
            f"{seen['stale_backwards']} of {steps} steps began their backward pass with the last step's gradients "
            f"still there, so each step's gradients added to the last one's: clear them before each backward pass"
        )
    if seen["empty_steps"]:
        return (
            f"{seen['empty_steps']} of {seen['optimizer_steps']} optimizer steps found every gradient cleared: "
            f"they were cleared after the backward pass and before the step, which then moved the weights by nothing"
        )
    return None


def one_backward_per_step(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """``accumulate`` backward passes (1 without gradient accumulation) between two optimizer steps."""
    want = int(args.get("accumulate", 1) or 1)
    counts = {int(n): times for n, times in seen["backwards_per_step"].items()}
    wrong = {n: times for n, times in counts.items() if n != want}
    if wrong:
        said = ", ".join(f"{times} step(s) with {n}" for n, times in sorted(wrong.items()))
        return (
            f"backward passes per optimizer step: {said}, want {want}: one backward pass of each batch's loss "
            f"per step, or its gradients count twice"
        )
    return None


def one_step_per_batch(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The optimizer stepped once per logged step."""
    steps = steps_of(result)
    if seen["optimizer_steps"] != steps and not seen["skipped_steps"]:
        return f"the optimizer stepped {seen['optimizer_steps']} times in {steps} logged steps: once per batch"
    return None


def whole_step(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """The three above, in the order a reader would look: the gradients, the backward passes, the steps."""
    for probe in (own_gradients, one_backward_per_step, one_step_per_batch):
        wrong = probe(seen, args, result)
        if wrong:
            return wrong
    return None
