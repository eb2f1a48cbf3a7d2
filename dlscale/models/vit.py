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
"""

from __future__ import annotations

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
        for index, (name, parameter) in enumerate(self.named_parameters()):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.position
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens).mean(dim=1))
