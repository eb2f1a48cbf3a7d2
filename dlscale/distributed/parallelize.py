"""How the ranks split the work (the parallel plan), and the functions that apply it to the model.

:func:`plan_parallelism` reads the config and the job (world size) and returns a :class:`ParallelPlan`: which
data parallelism runs (none, DDP, Horovod, FSDP), how many ranks split each layer (tensor
parallelism) and the device mesh they form. :func:`build_step_model` then prepares the
module the training step calls, in PyTorch's order:

- tensor parallelism first (:func:`apply_tensor_parallel`): the ViT's attention and MLP
  projections become DTensors split over the ``tp`` dimension of the mesh;
- then data parallelism: FSDP2's ``fully_shard`` per transformer block and at the root
  over the ``dp`` dimension (:func:`apply_fsdp`), or DDP (:func:`apply_ddp`) and then
  ``torch.compile`` of the DDP module.

FSDP and tensor parallelism change the model in place (its parameters become DTensors),
so the training loop's ``model`` and ``step_model`` are then the same module; under DDP
the loop keeps the plain module for checkpoints and evaluation. Horovod wraps the
optimizer instead (:func:`dlscale.distributed.grad_sync.gradient_sync`), and the step asks the
:class:`~dlscale.distributed.grad_sync.GradientSync` of the plan, whatever it is.

The mesh is (data-parallel × tensor-parallel), tensor-parallel ranks consecutive, so
``tensor_parallel=4`` on Perlmutter's 4-GPU nodes keeps each layer's collectives inside a
node (NVLink) and FSDP's across nodes. With pipeline parallelism it is (pipeline × data-parallel ×
tensor-parallel): the pipeline outermost, since a stage sends only a micro-batch's activations
to the next. Each of a rank's stages (:mod:`dlscale.distributed.pipeline`) is then prepared as a
model is: :func:`build_step_model` on each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlscale.config import ConfigError
from dlscale.config.train_config import ModelSection, ParallelSection
from dlscale.distributed.launch_variables import DistEnv
from dlscale.runtime.precision import Precision


@dataclass(frozen=True)
class ParallelPlan:
    """How one job's ranks share the work: the data parallelism, the tensor-parallel size, this rank's place."""

    data_parallel: str  # "none" (one rank, or each rank alone), "ddp", "horovod" or "fsdp"
    tensor_parallel: int  # ranks that split each layer (1 = off)
    data_rank: int  # this rank's index among the data-parallel ranks (which samples it reads)
    data_ranks: int  # how many ranks read different samples: world size / (tensor_parallel × pipeline)
    mesh: Any = None  # the (dp, tp) DeviceMesh when FSDP or TP runs, (pp, dp, tp) with a pipeline, else None
    pipeline: int = 1  # pipeline stages, a rank each (1 = off)
    pipeline_rank: int = 0  # this rank's place in its pipeline (which stages it holds)

    @property
    def sharded(self) -> bool:
        """Whether no rank holds the whole model, as plain tensors (FSDP, TP or a pipeline): checkpoints are then
        sharded too (every rank writes its part)."""
        return self.data_parallel == "fsdp" or self.tensor_parallel > 1 or self.pipeline > 1

    @property
    def model_ranks(self) -> int:
        """The ranks that share one sample's work (its FLOPs): tensor parallel × pipeline stages."""
        return self.tensor_parallel * self.pipeline

    def describe(self) -> str:
        if self.tensor_parallel == 1 and self.pipeline == 1:
            return self.data_parallel
        words = [] if self.data_parallel == "none" else [f"{self.data_parallel} over {self.data_ranks}"]
        if self.tensor_parallel > 1:
            words.append(f"tensor parallel over {self.tensor_parallel}")
        if self.pipeline > 1:
            words.append(f"pipeline of {self.pipeline} stages")
        return " × ".join(words)


def plan_parallelism(cfg: ParallelSection, env: DistEnv) -> ParallelPlan:
    """The :class:`ParallelPlan` for the config's parallel section (``cfg.sections.parallel``) on this job; a
    :class:`ConfigError` if the world does not fit it."""
    tp, pp = cfg.tensor_parallel, cfg.pipeline_parallel
    if env.world_size % tp:
        raise ConfigError(
            f"tensor_parallel={tp} does not divide the {env.world_size} ranks of this job; launch a "
            f"multiple of {tp} ranks, or change tensor_parallel"
        )
    if env.world_size % (tp * pp):
        raise ConfigError(
            f"pipeline_parallel={pp} x tensor_parallel={tp} does not divide the {env.world_size} ranks of this job; "
            f"launch a multiple of {tp * pp} ranks, or change pipeline_parallel"
        )
    dp = env.world_size // (tp * pp)
    if cfg.data_parallel == "none":  # every rank alone (the breakdown's run without communication)
        if tp > 1:
            raise ConfigError(
                "data_parallel=none cannot run with tensor_parallel > 1: the ranks of a tensor-parallel "
                "layer must communicate; set tensor_parallel=1"
            )
        return ParallelPlan("none", 1, env.rank, env.world_size)
    if env.backend == "horovod" and pp > 1:
        raise ConfigError(
            f"pipeline_parallel={pp} needs torch.distributed's ranks (torchrun, srun or mpirun), not Horovod's: "
            f"its stages send to one another with torch's point-to-point calls"
        )
    if env.backend == "horovod":
        kind = "horovod"
    elif cfg.data_parallel == "fsdp" or (cfg.data_parallel == "auto" and (tp > 1 or pp > 1)):
        kind = "fsdp"
    else:
        kind = "ddp"
    if (kind == "ddp" and dp == 1) or (kind == "fsdp" and dp == 1 and tp == 1):
        kind = "none"  # one data-parallel rank: nothing to average or shard over
    # (with tensor parallelism FSDP stays on, also over one data-parallel rank: it makes every parameter a
    # DTensor of the one mesh, which the optimizers' multi-tensor kernels and gradient clipping need)
    mesh = None
    if kind == "fsdp" or tp > 1 or pp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        device = torch.device(env.device).type
        if pp > 1:  # (rank = (stage × dp + data rank) × tp + tensor rank: tensor-parallel ranks consecutive)
            mesh = init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        else:
            mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
    return ParallelPlan(kind, tp, (env.rank // tp) % dp, dp, mesh, pp, env.rank // (tp * dp))


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any) -> None:
    """Split each of the model's units over ``tp_mesh`` by its ``tensor_parallel_plan``; for the ViT, column-wise
    into, row-wise out of, the attention and the MLP of each block.

    ``wq``/``wk``/``wv`` and ``w1`` keep whole input rows and a share of the output columns
    (so a rank holds whole heads); ``wo`` and ``w2`` take that share back and sum the partial
    results with one all-reduce each. The rest (patches, norms, head) stays whole on every rank.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    # (the model says which units and which layers: dlscale.models.registry; nothing here names a model's attribute)
    plan, units = getattr(model, "tensor_parallel_plan", None), _units(model)
    if not plan or not units:
        raise ConfigError(
            f"tensor_parallel needs a model with a tensor-parallel plan, as model=vit has; "
            f"{type(model).__name__} has none"
        )
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for unit in units:
        parallelize_module(unit, tp_mesh, {path: styles[style]() for path, style in plan.items()})


def _units(model: nn.Module) -> list[nn.Module]:
    """The model's units (``parallel_units()``: a transformer's blocks), or none."""
    units = getattr(model, "parallel_units", None)
    return list(units()) if callable(units) else []


def apply_fsdp(model: nn.Module, dp_mesh: Any, bf16: bool = False, reshard_after_forward: bool = True) -> None:
    """Shard ``model`` over ``dp_mesh`` with FSDP2: each of its units (a transformer's blocks) apart, the rest at the
    root.

    A unit's parameters are gathered just before its forward (and backward) and freed after,
    so at most one block is whole at a time. With ``bf16`` the gathered parameters and the
    compute are bfloat16 while the gradients are reduced, and the shards kept, in float32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    inner = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    # the model's output (the predictions) in float32, so that the loss is computed in float32
    outer = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)
        if bf16
        else inner
    )
    for unit in _units(model):
        fully_shard(unit, mesh=dp_mesh, mp_policy=inner, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=outer, reshard_after_forward=reshard_after_forward)


def apply_ddp(
    model: nn.Module,
    env: DistEnv,
    bucket_cap_mb: float = 25.0,
    gradient_as_bucket_view: bool = True,
    static_graph: bool = False,
) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when there are several ranks, else unchanged.

    Under Horovod the model stays as it is: Horovod wraps the optimizer instead
    (:func:`dlscale.distributed.grad_sync.gradient_sync`).
    """
    if not env.distributed or env.backend == "horovod":
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.device(env.device).index] if env.device.startswith("cuda") else None
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
    )


def build_step_model(
    model: nn.Module,
    env: DistEnv,
    parallel: ParallelSection,
    model_section: ModelSection,
    plan: ParallelPlan | None = None,
    policy: Precision | None = None,
) -> nn.Module:
    """The module the training step calls, from the config's parallel section (DDP's buckets) and its model
    section (whether to compile).

    FSDP and tensor parallelism shard ``model`` in place and return it. Otherwise ``model`` is
    wrapped in DDP and the DDP module compiled when asked, and ``model`` itself stays plain, for
    checkpoints and evaluation.
    """
    if plan is not None and plan.sharded:
        if policy is not None and policy.name == "fp16":
            raise ConfigError(
                "precision=fp16 is not supported with data_parallel=fsdp, tensor_parallel > 1 or pipeline_parallel > 1 "
                "(its loss scaler does not handle sharded gradients here); use precision=bf16 or fp32"
            )
        if plan.tensor_parallel > 1:
            apply_tensor_parallel(model, plan.mesh["tp"])
        # (a pipeline stage is a model to FSDP: its own root, so that its forward gathers the embedding or the head)
        if plan.data_parallel == "fsdp":
            apply_fsdp(model, plan.mesh["dp"], bf16=policy is not None and policy.name == "bf16")
        return model
    alone = plan is not None and plan.data_parallel == "none"  # (one rank, or every rank stepping alone)
    wrapped = (
        model
        if alone
        else apply_ddp(model, env, parallel.bucket_cap_mb, parallel.gradient_as_bucket_view, parallel.static_graph)
    )
    if not model_section.compile:
        return wrapped
    # DDP first, then compile (PyTorch's DDP notes, "TorchDynamo DDPOptimizer"): Dynamo sees DDP and
    # breaks the graph at its bucket boundaries, so each bucket's all-reduce starts while the rest of
    # the backward runs. Compiled first and wrapped after, the backward is one autograd node and
    # every all-reduce waits for its end.
    return torch.compile(wrapped, mode="reduce-overhead" if model_section.cuda_graphs else None)


def uncompiled(module: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (the DDP module, or the model), or ``module`` itself."""
    return getattr(module, "_orig_mod", module)


def cuda_graph_skips() -> int:
    """How many times inductor has declined to capture a CUDA graph in this process."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]
