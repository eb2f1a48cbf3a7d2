"""Stage 01, the plain loop (lesson 01): the validation R², and one training step."""

from __future__ import annotations

from dlscale.lessons.stage_record import Gap, Stage, Variant
from dlscale.lessons.stages.step_probes import whole_step

STAGE = Stage(
    lesson="01",
    file="01_baseline.py",
    runs_on="kernel",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "precision": "fp32",
        "norm": "group",
        "channels_last": False,
    },  # (a constant LR, fp32, the recipe's group norm)
    by_numbers=(("01.a",), ("01.b",)),
    gaps=(
        Gap(
            id="01.a",
            title="the validation R²",
            first="return float((1 - ((y - pred)",
            last="return float((1 - ((y - pred)",
            asks="return the validation R² as one float: for each target, the share of its variance that the "
            "predictions explain (sums over the rows), then the mean over the targets",
            question="R² is 1 minus a ratio: which two sums of squares, over which rows, and is it averaged per "
            "target or over every number at once?",
            api="torch sums over dim 0: ((y - pred) ** 2).sum(0) and ((y - y.mean(0)) ** 2).sum(0); .mean(); float()",
            mistakes=(
                Variant(
                    "1 minus the ratio forgotten",
                    (
                        (
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                            "return float((((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                        ),
                    ),
                ),
                Variant(
                    "over the predictions' variance",
                    (
                        (
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((pred - pred.mean(0)) ** 2).sum(0)).mean())",
                        ),
                    ),
                ),
                Variant(
                    "the mean squared error",
                    (
                        (
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                            "return float(((y - pred) ** 2).mean())",
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "the variance by torch",
                    (
                        (
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                            "return float((1 - ((y - pred) ** 2).mean(0) / y.var(0, unbiased=False)).mean())",
                        ),
                    ),
                ),
                Variant(
                    "a loop over the targets",
                    (
                        (
                            "return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())",
                            "scores = [1 - ((y[:, t] - pred[:, t]) ** 2).sum() / ((y[:, t] - y[:, t].mean()) ** 2).sum()"
                            " for t in range(y.shape[1])]\nreturn float(sum(scores) / len(scores))",
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="01.b",
            title="one training step",
            first="optimizer.zero_grad()",
            last="optimizer.step()",
            asks="one training step on this batch: gradients of this batch alone (none left from the last one), "
            "then the weights moved against them",
            question="PyTorch adds each backward pass's gradients to what is already there: what must happen "
            "before this batch's backward pass, and what moves the weights after it?",
            api="optimizer.zero_grad() (or model.zero_grad()), loss_fn(model(x), y), loss.backward(), optimizer.step()",
            probe=whole_step,
            mistakes=(
                Variant("gradients never cleared", (("optimizer.zero_grad()", "pass"),)),
                Variant(
                    "cleared after the backward pass", (("loss.backward()", "loss.backward()\noptimizer.zero_grad()"),)
                ),
                Variant(
                    "two backward passes", (("loss.backward()", "loss.backward(retain_graph=True)\nloss.backward()"),)
                ),
            ),
            alternatives=(
                Variant("model.zero_grad()", (("optimizer.zero_grad()", "model.zero_grad()"),)),
                Variant(
                    "p.grad = None", (("optimizer.zero_grad()", "for p in model.parameters():\n    p.grad = None"),)
                ),
                Variant(
                    "cleared after the step",
                    (
                        ("optimizer.zero_grad()", "pass"),
                        ("optimizer.step()", "optimizer.step()\noptimizer.zero_grad()"),
                    ),
                ),
            ),
        ),
    ),
)
