"""What the layout chooser needs of a model that may not fit one GPU: its weights, its compute and its activations.

A model is five numbers (:class:`ModelSize`): its parameters, the operations of one sample's training step, the
activations it holds for one sample's backward pass, the activations that cross one layer boundary (what a pipeline
stage sends the next, and what tensor parallelism all-reduces), and its layers (the most stages it cuts into).

For a GPT-style transformer they follow from its shape (:func:`gpt`), by the formulas of Narayanan et al. 2021
(arXiv:2104.04473, the Megatron-LM paper: its equations (2) and (3)) and Korthikanti et al. 2022 (arXiv:2205.05198,
the activations of a layer):

- parameters ``P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))``;
- operations per sample: each layer's forward ``24·s·h²·(1 + s/(6h))``, the backward twice that, and with full
  activation recomputation the forward once more (4 passes; 3 without), plus the logit layer's ``6·s·h·V``;
- activations: with full recomputation (as Megatron-LM trains) each layer keeps only its input, ``2·s·h`` bytes in
  16-bit, and the layer being recomputed holds its whole working set, ``s·h·(34 + 5·a·s/h)`` bytes, one at a time;
  without recomputation every layer keeps that working set;
- a layer boundary: ``s·h`` values, 2 bytes each.

:data:`PRESETS` are GPT-3's shapes (Brown et al. 2020, Table 2.1) at Megatron-LM's sequence (2,048) and padded
vocabulary (51,200), for ``dlscale project --layouts``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import check_range

#: Megatron-LM's GPT vocabulary (GPT-2's 50,257 padded to a multiple of 1,024) and sequence, as in its paper's tables.
MEGATRON_VOCABULARY = 51_200
MEGATRON_SEQUENCE = 2_048


@dataclass(frozen=True)
class ModelSize:
    """A model as the layout chooser sees it (per sample; bytes of 16-bit activations)."""

    name: str
    parameters: int
    flops_per_sample: float  # one sample's forward and backward (and the recomputed forward, if any)
    activation_bytes_per_sample: float  # held from a sample's forward to its backward, the whole model
    boundary_bytes_per_sample: float  # one layer's output: what a stage sends, what tensor parallelism all-reduces
    layers: int  # a pipeline stage needs at least one
    working_bytes_per_sample: float = 0.0  # held by the one layer being recomputed (full recomputation), else 0
    heads: int | None = None  # tensor parallelism splits the attention heads: at most this many ranks (None: any)
    # per layer and micro-batch: the attention's and the MLP's outputs forward, their input gradients backward (4),
    # and the recomputed forward's two more (6)
    tensor_allreduces_per_layer: int = 4
    source: str = "entered"

    def __post_init__(self) -> None:
        check_range("parameters", self.parameters, 1)
        check_range("operations per sample", self.flops_per_sample, 0, above=True)
        check_range("activation bytes per sample", self.activation_bytes_per_sample, 0)
        check_range("boundary bytes per sample", self.boundary_bytes_per_sample, 0)
        check_range("working bytes per sample", self.working_bytes_per_sample, 0)
        check_range("layers", self.layers, 1)
        check_range("tensor-parallel all-reduces per layer", self.tensor_allreduces_per_layer, 0)
        if self.heads is not None:
            check_range("attention heads", self.heads, 1)

    def describe(self) -> str:
        """The model in one line, as the chooser's assumptions print it."""
        working = self.working_bytes_per_sample / 2**30
        return (
            f"{self.name}: {self.parameters / 1e9:.3g} B parameters, {self.flops_per_sample / 1e12:.3g} TFLOP per "
            f"sample, {self.activation_bytes_per_sample / 2**30:.3g} GiB of activations held per sample"
            + (f" (+{working:.3g} GiB recomputed)" if working else "")
            + f", {self.boundary_bytes_per_sample / 2**20:.3g} MiB across a layer boundary, {self.layers} layers"
            + f" ({self.source})"
        )


def gpt(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    sequence: int = MEGATRON_SEQUENCE,
    vocabulary: int = MEGATRON_VOCABULARY,
    recompute: bool = True,
    source: str = "",
) -> ModelSize:
    """A GPT-style transformer's :class:`ModelSize` from its shape (the module docstring gives the formulas)."""
    for label, value in (("layers", layers), ("hidden size", hidden), ("heads", heads), ("sequence", sequence)):
        check_range(label, value, 1)
    check_range("vocabulary", vocabulary, 1)
    n, h, s, v, a = layers, hidden, sequence, vocabulary, heads  # (the paper's l, h, s, V, a)
    parameters = round(12 * n * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * n * h)))
    passes = 4 if recompute else 3  # forward, backward (twice the forward), and the recomputed forward
    flops = passes * 24 * s * h**2 * (1 + s / (6 * h)) * n + 6 * s * h * v
    layer_working = s * h * (34 + 5 * a * s / h)  # one layer's activations, 16-bit (Korthikanti et al. 2022)
    boundary = 2 * s * h
    return ModelSize(
        name,
        parameters,
        flops,
        n * boundary if recompute else n * layer_working,
        boundary,
        n,
        layer_working if recompute else 0.0,
        heads,
        6 if recompute else 4,
        source
        or f"GPT, {n} layers, hidden {h}, {a} heads, sequence {s}, vocabulary {v}"
        + (", full recomputation" if recompute else ""),
    )


#: GPT-3's shapes (Brown et al. 2020, Table 2.1: layers and hidden size; heads of 128, so 1.3B has 16 and 13B's
#: hidden size is rounded from 5,140 to 40 heads of 128) at Megatron-LM's sequence and vocabulary, with full
#: recomputation: what ``dlscale project --layouts`` offers.
PRESETS = {
    "gpt-1.3b": gpt("GPT-3 1.3B", 24, 2048, 16),
    "gpt-13b": gpt("GPT-3 13B", 40, 5120, 40),
    "gpt-175b": gpt("GPT-3 175B", 96, 12288, 96),
}
