"""A small vision transformer for the maps (``model=vit``): the model lesson 10 shards.

The map is cut into ``patch_size`` × ``patch_size`` patches, each embedded as a token of
``width`` numbers with a learned position; ``depth`` pre-norm blocks of self-attention and an
MLP follow, then the mean token goes through a linear head. The layers are named as
tensor parallelism addresses them (:func:`dlscale.distributed.parallelize.apply_tensor_parallel`): the
attention's ``wq``/``wk``/``wv`` and the MLP's ``w1`` split column-wise, ``wo`` and ``w2``
row-wise. The attention reads its number of heads from the width of ``wq``'s output, so a
rank that holds half of the columns computes half of the heads without knowing it.

Its weights come from :meth:`ViTRegressor.init_weights`, one parameter at a time from a seed, so that
a model built whole and one built on the meta device, sharded, then materialized (FSDP2's pattern:
no rank ever holds the whole model) start from the same values.

Pipeline parallelism cuts it by blocks (:meth:`ViTRegressor.pipeline_stage`): a :class:`ViTStage` holds some
blocks, the patch embedding if it begins the model, the norm and the head if it ends it. Its parameters keep the
whole model's names (``blocks.3.mlp.w1.weight`` on whichever rank holds block 3), so a checkpoint written by the
stages loads into any layout, and its :meth:`ViTStage.init_weights` draws each parameter's value of the whole model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from dlscale.data.synthetic import TARGET_NAMES
from dlscale.distributed.dtensors import is_sharded


class Attention(nn.Module):
    """Multi-head self-attention with separate query, key, value and output projections."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.head_dim = width // heads
        self.wq, self.wk, self.wv = (nn.Linear(width, width) for _ in range(3))
        self.wo = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        # -1 heads: all of them in one process, this rank's share under tensor parallelism
        q, k, v = (w(x).view(batch, tokens, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    """Two linear layers with a GELU, four times wider in the middle."""

    def __init__(self, width: int, ratio: int = 4):
        super().__init__()
        self.w1 = nn.Linear(width, ratio * width)
        self.w2 = nn.Linear(ratio * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """``x + attention(norm(x))``, then ``x + mlp(norm(x))``; optionally recomputed in the backward pass."""

    def __init__(self, width: int, heads: int, activation_checkpointing: bool = False):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(width), Attention(width, heads)
        self.mlp_norm, self.mlp = nn.LayerNorm(width), MLP(width)
        self.activation_checkpointing = activation_checkpointing

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            # Keep only the block's input; its activations are computed again during backward. Inside the
            # block, so that FSDP's hooks on the block stay outside the recomputed region.
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class ViTRegressor(nn.Module):
    """Maps of shape (N, in_channels, H, W) to (N, num_outputs) regression targets, through a transformer."""

    #: Tensor parallelism inside each unit (dlscale.distributed.parallelize): the projections into the attention and
    #: the MLP column-wise (a rank keeps whole heads), the ones out of them row-wise (one all-reduce each).
    tensor_parallel_plan = {
        "attention.wq": "colwise",
        "attention.wk": "colwise",
        "attention.wv": "colwise",
        "attention.wo": "rowwise",
        "mlp.w1": "colwise",
        "mlp.w2": "rowwise",
    }

    def parallel_units(self) -> list[nn.Module]:
        """The units FSDP shards one at a time and tensor parallelism splits: the transformer blocks."""
        return list(self.blocks)

    def __init__(
        self,
        in_channels: int = 1,
        num_outputs: int = len(TARGET_NAMES),
        image_size: int = 32,
        patch_size: int = 4,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        activation_checkpointing: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        self.heads = heads
        self.patch = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)
        self.position = nn.Parameter(torch.randn(1, (image_size // patch_size) ** 2, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, activation_checkpointing) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_outputs)
        if not self.head.weight.is_meta:  # (on the meta device: after sharding and to_empty, by the caller)
            self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Every parameter from ``seed``: weights from a normal distribution of std 0.02 cut at 2 std (ViT's
        usual start), biases 0, norm scales 1. Each parameter's whole value is drawn on the CPU from a
        generator of its own, and a sharded parameter (a DTensor) keeps its shard of it: the same start
        whole, on the meta device then materialized, or sharded any way."""
        _init_parameters(
            self.named_parameters(), seed, {name: i for i, (name, _) in enumerate(self.named_parameters())}
        )

    def pipeline_stage(self, blocks: Iterable[int], first: bool, last: bool) -> ViTStage:
        """The blocks numbered ``blocks`` as one pipeline stage, with the patch embedding if ``first`` and the norm
        and head if ``last``: a :class:`ViTStage` that shares this model's layers and keeps their names."""
        return ViTStage(self, blocks, first, last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.position
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens).mean(dim=1))


def _init_parameters(named: Iterable[tuple[str, nn.Parameter]], seed: int, index: dict[str, int]) -> None:
    """Each parameter's starting value (see :meth:`ViTRegressor.init_weights`), drawn from a generator seeded by the
    parameter's place ``index[name]`` in the whole model: a stage of it draws the values the whole model would."""
    for name, parameter in named:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index[name])
        if "norm" in name:
            whole = torch.ones(parameter.shape) if name.endswith("weight") else torch.zeros(parameter.shape)
        elif name.endswith("bias"):
            whole = torch.zeros(parameter.shape)
        else:
            whole = torch.randn(parameter.shape, generator=generator).clamp_(-2, 2) * 0.02
        if is_sharded(parameter):  # every rank holds the same whole value: no data to send
            from torch.distributed.tensor import distribute_tensor  # (imported here: it costs half a second)

            whole = distribute_tensor(whole, parameter.device_mesh, parameter.placements, src_data_rank=None)
        parameter.copy_(whole.to(parameter.dtype))


class ViTStage(nn.Module):
    """Some of a :class:`ViTRegressor`'s blocks, run in order: one stage of a pipeline, or a rank's stages together.

    The first stage (``first``) takes the maps and embeds them; the others take the previous stage's tokens. The
    last (``last``) ends in the norm, the mean token and the head, so its output is the predictions; the others hand
    on tokens. The layers are the whole model's own modules (shared, not copied), kept under the whole model's names:
    ``blocks`` is a dict keyed by the block's number in the whole model, so ``blocks.3.mlp.w1.weight`` is named the
    same whether one process or the second stage holds it.
    """

    tensor_parallel_plan = ViTRegressor.tensor_parallel_plan

    def __init__(self, whole: ViTRegressor, blocks: Iterable[int], first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.patch, self.position = whole.patch, whole.position
        self.blocks = nn.ModuleDict({str(i): whole.blocks[i] for i in blocks})
        if last:
            self.norm, self.head = whole.norm, whole.head
        # each parameter's place in the whole model, from which init_weights seeds its value
        self.whole_index = {name: i for i, (name, _) in enumerate(whole.named_parameters())}

    def parallel_units(self) -> list[nn.Module]:
        """The units FSDP shards one at a time and tensor parallelism splits: this stage's blocks."""
        return list(self.blocks.values())

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """This stage's parameters with the values :meth:`ViTRegressor.init_weights` gives them in the whole model."""
        _init_parameters(self.named_parameters(), seed, self.whole_index)

    @classmethod
    def together(cls, stages: Sequence[ViTStage]) -> ViTStage:
        """One module of several stages' layers (a rank's stages under an interleaved schedule), for the optimizer
        and the checkpoint: the stages' current parameters, once sharded and materialized, under the whole model's
        names. It is never called: each stage runs on its own."""
        # (a ViTStage, not cls: FSDP makes each sharded stage an instance of a subclass of its own, whose __new__ calls
        # __init__; the stages' layers are taken as they are, without ViTStage.__init__'s whole model)
        joined = ViTStage.__new__(ViTStage)
        nn.Module.__init__(joined)
        firsts, lasts = [s for s in stages if s.first], [s for s in stages if s.last]
        joined.first, joined.last, joined.whole_index = bool(firsts), bool(lasts), stages[0].whole_index
        if firsts:  # (the position is a parameter of the stage itself: taken from it, as sharding left it)
            joined.patch, joined.position = firsts[0].patch, firsts[0].position
        held = {key: block for stage in stages for key, block in stage.blocks.items()}
        joined.blocks = nn.ModuleDict({key: held[key] for key in sorted(held, key=int)})
        if lasts:
            joined.norm, joined.head = lasts[0].norm, lasts[0].head
        return joined

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.position if self.first else x
        for block in self.blocks.values():
            tokens = block(tokens)
        if self.last:
            return self.head(self.norm(tokens).mean(dim=1))
        # (the embedding's transpose leaves the tokens strided; gloo sends only contiguous tensors, and the next stage
        # receives into a buffer of the strides this one sends)
        return tokens.contiguous()
