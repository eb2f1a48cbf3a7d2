"""Training configuration: one typed dataclass, named YAML configs, ``key=value`` overrides.

Every knob of a training run lives in :class:`TrainConfig`. Named configs are small YAML
files in ``dlscale/config/configs/`` (or any path) that list only what differs from what they
``inherit``; the root of every chain is the dataclass defaults, so there is one place
where a default is written. The CLI, a notebook and a Slurm script all build a config the
same way::

    cfg = load_config("demo", ["epochs=2", "lr=3e-3"])

Used by every lesson; lesson 01 shows it first.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dlscale.errors import DlscaleError

CONFIG_DIR = Path(__file__).parent / "configs"


class ConfigError(DlscaleError, ValueError):
    """A config file or override is wrong; the message names the key and what it accepts."""


#: A run's name: one folder in runs/ (as a recipe's name is one file in recipes/), never a path out of it.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")

#: The config's sections, in the order ``dlscale train --help`` lists them: each builder is given only its own
#: (``cfg.sections.model`` to the model's builder, ``cfg.sections.optim`` to the optimizer's...). On the command line
#: and in the YAML files the keys stay flat (``lr=3e-3``); a key's section is where it is declared below.
SECTION_NAMES = ("run", "data", "model", "parallel", "training", "optim", "logging")


def _knob(section: str) -> Any:
    """The field maker of one section: ``_model(default, help)`` declares a key of the model section."""

    def knob(default: Any, help: str) -> Any:
        return field(default=default, metadata={"help": help, "section": section})

    return knob


_run, _data, _model, _parallel, _training, _optim, _logging = (_knob(name) for name in SECTION_NAMES)

#: The models a config may name: the kit's two, and each added with dlscale.models.register_model (which appends).
MODEL_NAMES: list[str] = ["cnn", "vit"]


@dataclass
class TrainConfig:
    """All settings of one training run. ``dlscale train --help`` lists them with their help."""

    # -- run: the run: its name and folder, seed, device and threads -------------------------------
    name: str = _run("demo", "Run name; the run directory defaults to runs/<name>.")
    run_dir: str = _run("", "Where metrics, plots, the resolved config and checkpoints go ('' = runs/<name>).")
    seed: int = _run(0, "Seed for model init, shuffling and the synthetic data.")
    device: str = _run("auto", "'auto' (CUDA if present, else CPU), 'cpu', 'cuda' or 'cuda:N'.")
    resume: bool = _run(
        False, "Continue from the latest checkpoint in run_dir if there is one (a fresh start otherwise)."
    )
    threads: int = _run(
        0,
        "torch threads of each training process (0 = from OMP_NUM_THREADS, Slurm's "
        "cpus-per-task or the CPUs the process may use, in that order).",
    )

    # -- data: the data: the synthetic set or shards, and how each rank loads them -----------------
    data_dir: str = _data(
        "", "Folder of shards (see dlscale.data); '' = generate the synthetic set into data/ on first use."
    )
    image_size: int = _data(32, "Side of the square synthetic maps, in pixels (power of two, >= 8).")
    train_samples: int = _data(8192, "Number of synthetic training maps.")
    val_samples: int = _data(1024, "Number of synthetic held-out maps.")
    shard_size: int = _data(1024, "Maps per shard file when generating.")
    noise: float = _data(0.3, "White-noise level added to the synthetic maps (higher = harder).")
    num_workers: int = _data(-1, "DataLoader worker processes per rank (-1 = auto: 0 on CPU, 4 on GPU).")
    prefetch_factor: int = _data(2, "Batches each worker loads ahead (only with workers > 0).")
    persistent_workers: bool = _data(True, "Keep worker processes alive between epochs (only with workers > 0).")
    stage_dir: str = _data(
        "",
        "Copy the data to this node-local folder before training and read it there "
        "(e.g. $TMPDIR or /tmp; environment variables are expanded; '' = off).",
    )
    augment: bool = _data(
        False,
        "Shift, mirror and rotate every training map at random, per sample in the loader "
        "(real CPU work per sample, as decoding and augmenting are; lesson 02).",
    )
    pin_memory: bool = _data(True, "Page-locked host buffers for faster copies to the GPU (ignored on CPU).")
    data_in_memory: bool = _data(
        False,
        "Read this rank's first epoch of batches once, keep them on the device and "
        "replay them every epoch: no loader and no copy in the step (the 'data in "
        "memory' run of dlscale bench breakdown; not for training a model).",
    )

    # -- model: the model, and how it runs ---------------------------------------------------------
    model: str = _model(
        "cnn",
        "The regressor: a CNN, a small vision transformer (vit; the model lesson 10 shards "
        "with FSDP and tensor parallelism), or a model added with dlscale.models.register_model.",
    )
    width: int = _model(
        16, "CNN: channels of the first conv block, doubled at each later block. ViT: the width of every token."
    )
    depth: int = _model(3, "CNN: number of conv blocks (each halves the map size). ViT: number of transformer blocks.")
    heads: int = _model(4, "ViT: attention heads per block (must divide width).")
    patch_size: int = _model(4, "ViT: side of the square patches that become tokens (must divide image_size).")
    activation_checkpointing: bool = _model(
        False,
        "ViT: keep only each block's input and recompute its activations in the backward pass "
        "(less memory, about one more forward pass of time).",
    )
    channels_last: bool = _model(False, "Use the NHWC memory format (faster convolutions on tensor-core GPUs).")
    cudnn_benchmark: bool = _model(
        False,
        "On a GPU, let cuDNN time its convolution algorithms on the first steps and "
        "keep the fastest (worth it when every batch has the same shape).",
    )
    norm: Literal["batch", "group"] = _model(
        "batch", "Normalisation layers: batch norm, or group norm (independent of how the batch is split)."
    )
    sync_batchnorm: bool = _model(False, "With several GPUs, compute batch-norm statistics over all ranks (CUDA only).")
    compile: bool = _model(False, "Compile the model with torch.compile (the first steps take longer).")
    cuda_graphs: bool = _model(False, "With compile on CUDA, capture steps as CUDA graphs (mode reduce-overhead).")

    # -- parallel: how the ranks share the work ----------------------------------------------------
    data_parallel: Literal["auto", "ddp", "horovod", "fsdp", "none"] = _parallel(
        "auto",
        "How the ranks share the work of one batch: PyTorch DDP, Horovod's DistributedOptimizer, or FSDP "
        "(parameters, gradients and optimizer state sharded over the ranks; auto = Horovod when launched by "
        "horovodrun, FSDP with tensor_parallel on several data-parallel ranks, DDP otherwise). none: every "
        "rank steps alone on its share, no gradient is sent (the models drift apart; the 'no "
        "communication' run of dlscale bench breakdown).",
    )
    tensor_parallel: int = _parallel(
        1,
        "ViT: split every block's attention heads and MLP over this many ranks "
        "(consecutive ranks, so inside a node); the rest of the ranks are data-parallel.",
    )
    pipeline_parallel: int = _parallel(
        1,
        "ViT: cut the blocks into this many pipeline stages, one rank each (the embedding on the first, the head "
        "and the loss on the last); the ranks form a (pipeline x data-parallel x tensor-parallel) mesh, the "
        "pipeline outermost. 1 = off.",
    )
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = _parallel(
        "1f1b",
        "Pipeline: the order of the micro-batches' forwards and backwards (torch.distributed.pipelining): gpipe "
        "(all forwards, then all backwards), 1f1b (one forward, one backward: at most pipeline_parallel "
        "micro-batches' activations held), interleaved-1f1b (pipeline_virtual_stages stages per rank).",
    )
    pipeline_microbatches: int = _parallel(
        4,
        "Pipeline: micro-batches each rank's batch is cut into per step; more fill the pipeline better (its idle "
        "share is (p-1)/(m+p-1)). Must divide the per-rank batch; 1f1b needs at least pipeline_parallel.",
    )
    pipeline_virtual_stages: int = _parallel(
        1,
        "Pipeline: stages per rank with pipeline_schedule=interleaved-1f1b (the blocks cut into pipeline_parallel x "
        "this many stages, dealt round-robin); 1 for gpipe and 1f1b.",
    )
    horovod_fp16_compression: bool = _parallel(
        False, "Horovod: send gradients as fp16 (half the bytes, rounded gradients)."
    )
    dist_backend: Literal["auto", "nccl", "gloo"] = _parallel(
        "auto", "Process-group backend: auto = NCCL on GPUs, gloo on CPUs."
    )
    dist_timeout_s: float = _parallel(
        300.0,
        "Seconds a collective may wait for the other ranks before the job stops "
        "with an error (a dead or missing rank never hangs the job). On gloo a "
        "dead peer is noticed within a second; NCCL notices it only when this "
        "runs out (the gpu config sets 120).",
    )
    setup_timeout_s: float = _parallel(
        1800.0,
        "Seconds the ranks wait for one another while a run sets up: rank 0 "
        "generating the synthetic data set, each node's first rank staging the "
        "shards (work for all, which dist_timeout_s would cut short).",
    )
    bucket_cap_mb: float = _parallel(25.0, "DDP gradient bucket size in MiB (all-reduce granularity).")
    gradient_as_bucket_view: bool = _parallel(
        True, "DDP: gradients are views into the all-reduce buckets (saves memory)."
    )
    static_graph: bool = _parallel(False, "DDP: the graph is the same every step (lets DDP skip some bookkeeping).")

    # -- training: how long, how large a batch, in what precision ----------------------------------
    epochs: int = _training(6, "Passes over the training set.")
    max_steps: int = _training(0, "Stop after this many optimizer steps (0 = run all epochs).")
    global_batch_size: int = _training(64, "Samples per optimizer step over all ranks; the per-rank batch is derived.")
    grad_accumulation: int = _training(
        1,
        "Micro-batches per optimizer step: each rank's batch is split into this many, "
        "and DDP all-reduces only after the last one (less memory, same step).",
    )
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp64"] = _training(
        "auto",
        "Forward-pass precision: auto = bf16 on Ampere+ GPUs, fp16 with loss scaling on V100, fp32 on CPU; "
        "fp64 = float64 parameters and data (slow: for checks that two runs agree to rounding).",
    )

    # -- optim: the optimizer and its learning-rate schedule ---------------------------------------
    optimizer: Literal["adamw", "sgd", "lars", "larc", "lamb"] = _optim(
        "adamw", "Optimizer; lars, larc (around SGD) and lamb adapt the step per layer for large batches."
    )
    lr: float = _optim(2e-3, "Peak learning rate at base_batch; lr_scaling adapts it to global_batch_size.")
    lr_scaling: Literal["none", "linear", "sqrt"] = _optim(
        "none", "How the LR follows the batch: lr * k or lr * sqrt(k) with k = global_batch_size / base_batch."
    )
    base_batch: int = _optim(64, "The global batch at which lr was tuned (used by lr_scaling).")
    momentum: float = _optim(0.9, "SGD/LARS momentum (adamw and lamb use beta1 = momentum).")
    weight_decay: float = _optim(1e-4, "Decoupled weight decay; biases and norm parameters are exempt.")
    trust_coefficient: float = _optim(
        0.0, "LARS/LARC trust coefficient (0 = the optimizer's default: 1e-3 LARS, 0.02 LARC)."
    )
    larc_mode: Literal["clip", "scale"] = _optim("clip", "LARC: clip the per-layer LR at the global LR, or scale it.")
    warmup_steps: int = _optim(50, "Optimizer steps of linear warmup to the peak LR.")
    warmup_epochs: float = _optim(0.0, "Warmup length in epochs; when > 0 it replaces warmup_steps.")
    warmup_start_factor: float = _optim(
        0.0,
        "Warmup starts at this fraction of the peak LR (0 = auto: the unscaled LR when lr_scaling is on, "
        "as in Goyal et al., else 1/warmup_steps).",
    )
    decay: Literal["cosine", "linear", "poly", "step", "none"] = _optim(
        "cosine", "LR decay after warmup: to 0 at the last step (cosine, linear, poly), x0.1 at 50% and 75% (step)."
    )
    grad_clip: float = _optim(0.0, "Clip the global gradient norm to this value (0 = off).")
    optimizer_impl: Literal["auto", "foreach", "fused", "loop"] = _optim(
        "auto",
        "torch SGD/AdamW implementation: one kernel per tensor (loop), multi-tensor (foreach), fused; auto = foreach.",
    )

    # -- logging: what a run writes and measures: checkpoints, metrics, plots, profiles ------------
    checkpoint_every: int = _logging(200, "Write a checkpoint every N optimizer steps (0 = only at the end).")
    keep_checkpoints: int = _logging(2, "How many recent checkpoints to keep.")
    tracking: Literal["csv", "wandb"] = _logging(
        "csv", "Metrics always go to CSV in run_dir; 'wandb' also logs to Weights & Biases."
    )
    wandb_project: str = _logging("dlscale", "Weights & Biases project (with tracking=wandb).")
    wandb_mode: Literal["offline", "online", "disabled"] = _logging(
        "offline", "Weights & Biases mode; the WANDB_MODE environment variable wins when set."
    )
    progress: bool = _logging(True, "Show a tqdm progress bar on the main process.")
    plot: bool = _logging(True, "Write loss_curve.png into run_dir at the end.")
    profile_steps: tuple = _logging(
        (),
        "Profile optimizer steps [start, stop), e.g. 10,15: a Chrome trace and a "
        "summary in run_dir; on CUDA also the window for nsys --capture-range.",
    )
    noise_scale_every: int = _logging(0, "Measure the gradient noise scale B_simple every N steps (0 = off).")

    # ------------------------------------------------------------------------
    def __post_init__(self) -> None:
        self.profile_steps = tuple(self.profile_steps)  # JSON and YAML give lists
        self.validate()

    def validate(self) -> None:
        """Check ranges and relations between fields; raise :class:`ConfigError` naming the key."""
        for key, value in vars(self).items():  # NaN passes every comparison below: refuse it (and infinities) first
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config key '{key}' must be a finite number, got {value}")
        positive = [
            "image_size",
            "train_samples",
            "val_samples",
            "shard_size",
            "width",
            "depth",
            "heads",
            "patch_size",
            "tensor_parallel",
            "pipeline_parallel",
            "pipeline_microbatches",
            "pipeline_virtual_stages",
            "grad_accumulation",
            "epochs",
            "global_batch_size",
            "prefetch_factor",
            "keep_checkpoints",
        ]
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"config key '{key}' must be >= 1, got {getattr(self, key)}")
        for key in [
            "max_steps",
            "warmup_steps",
            "checkpoint_every",
            "noise",
            "grad_clip",
            "weight_decay",
            "momentum",
            "warmup_epochs",
            "trust_coefficient",
            "noise_scale_every",
        ]:
            if getattr(self, key) < 0:
                raise ConfigError(f"config key '{key}' must be >= 0, got {getattr(self, key)}")
        for key in ["lr", "dist_timeout_s", "setup_timeout_s"]:
            if getattr(self, key) <= 0:
                raise ConfigError(f"config key '{key}' must be > 0, got {getattr(self, key)}")
        if self.base_batch < 1:
            raise ConfigError(f"config key 'base_batch' must be >= 1, got {self.base_batch}")
        if not 0 <= self.warmup_start_factor <= 1:
            raise ConfigError(
                f"config key 'warmup_start_factor' must be in [0, 1] (0 = auto), got {self.warmup_start_factor}"
            )
        if self.profile_steps and (
            len(self.profile_steps) != 2 or not 0 <= self.profile_steps[0] < self.profile_steps[1]
        ):
            raise ConfigError(
                f"config key 'profile_steps' must be two steps start,stop with 0 <= start < stop; "
                f"got {self.profile_steps}"
            )
        if self.grad_accumulation > 1 and self.noise_scale_every:
            raise ConfigError("noise_scale_every needs grad_accumulation=1 (it measures whole-batch gradients)")
        if self.noise_scale_every and self.data_parallel == "horovod":
            raise ConfigError(
                "noise_scale_every works with data_parallel=ddp or auto: under Horovod its extra "
                "backward pass would set off an all-reduce"
            )
        if self.sync_batchnorm and self.compile:
            raise ConfigError(
                "sync_batchnorm=true cannot be combined with compile=true: torch.compile does not "
                "trace SyncBatchNorm's collectives; use norm=group (no batch statistics to share) "
                "with compile, or turn compile off"
            )
        if self.cuda_graphs and not self.compile:
            raise ConfigError("config key 'cuda_graphs' needs compile=true (graphs are captured by torch.compile)")
        if not 0 <= self.seed < 2**32:  # (numpy's generators take seeds in [0, 2**32))
            raise ConfigError(f"config key 'seed' must be a whole number from 0 to {2**32 - 1}, got {self.seed}")
        if self.threads < 0:
            raise ConfigError(f"config key 'threads' must be 0 (auto) or a number of threads >= 1, got {self.threads}")
        if self.num_workers < -1:
            raise ConfigError(f"config key 'num_workers' must be -1 (auto) or >= 0, got {self.num_workers}")
        size = self.image_size
        if size < 8 or size & (size - 1):
            raise ConfigError(f"config key 'image_size' must be a power of two >= 8, got {size}")
        self._validate_model()
        if self.model == "cnn" and 2**self.depth > size:
            raise ConfigError(
                f"config key 'depth'={self.depth} halves a {size}-pixel map below 1 pixel; "
                f"use depth <= {size.bit_length() - 1}"
            )
        dev = self.device
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError(f"config key 'device' must be one of auto, cpu, cuda, cuda:N; got '{dev}'")
        self._validate_name()

    def _validate_name(self) -> None:
        """The run's name is one folder in runs/ (as a recipe's name is one file in recipes/), never a path out of it;
        empty only where run_dir names the folder."""
        if not (_PLAIN_NAME.fullmatch(self.name) or (self.run_dir and not self.name)):
            raise ConfigError(
                f"config key 'name' must be a plain name (letters, digits, _ . -, at most 100), the run's folder "
                f"in runs/; got {_shown(self.name)}: to write the run elsewhere, set run_dir instead"
            )

    def _validate_model(self) -> None:
        """A model the kit knows, the transformer's shape, and the parallelisms the CNN does not support."""
        if self.model not in MODEL_NAMES:
            raise ConfigError(
                f"config key 'model' must be one of {', '.join(MODEL_NAMES)} (or a model added with "
                f"dlscale.models.register_model); got {self.model!r}"
            )
        if self.model == "vit":
            if self.width % self.heads:
                raise ConfigError(
                    f"config key 'heads'={self.heads} must divide width={self.width} (each head gets "
                    f"width/heads numbers)"
                )
            if self.image_size % self.patch_size:
                raise ConfigError(f"config key 'patch_size'={self.patch_size} must divide image_size={self.image_size}")
            if self.heads % self.tensor_parallel:
                raise ConfigError(
                    f"tensor_parallel={self.tensor_parallel} must divide heads={self.heads}: each rank "
                    f"computes whole heads"
                )
            stages = self.pipeline_parallel * self.pipeline_virtual_stages
            if stages > self.depth:
                raise ConfigError(
                    f"config key 'pipeline_parallel'={self.pipeline_parallel} x pipeline_virtual_stages="
                    f"{self.pipeline_virtual_stages} makes {stages} stages of depth={self.depth} blocks: each stage "
                    f"needs a block; raise depth or lower them"
                )
        elif self.model == "cnn" and (
            self.tensor_parallel > 1 or self.pipeline_parallel > 1 or self.activation_checkpointing
        ):
            key = next(
                key for key in ("tensor_parallel", "pipeline_parallel", "activation_checkpointing") if self._on(key)
            )
            raise ConfigError(
                f"config key '{key}' needs model=vit: the CNN has no transformer blocks to split or recompute"
            )
        if self.tensor_parallel > 1 and self.data_parallel in ("horovod", "ddp"):
            raise ConfigError(
                f"tensor_parallel={self.tensor_parallel} needs data_parallel=fsdp or auto: DDP and "
                f"Horovod do not average gradients of sharded (DTensor) parameters"
            )
        if self.pipeline_parallel > 1 and self.data_parallel in ("horovod", "ddp", "none"):
            raise ConfigError(
                f"pipeline_parallel={self.pipeline_parallel} needs data_parallel=fsdp or auto: the stages' "
                f"data-parallel ranks average their gradients with FSDP here (not DDP, Horovod or none)"
            )
        split = self.data_parallel == "fsdp" or self.tensor_parallel > 1 or self.pipeline_parallel > 1
        if split and (self.noise_scale_every or self.compile):
            key = "noise_scale_every" if self.noise_scale_every else "compile"
            raise ConfigError(
                f"config key '{key}' is not supported with data_parallel=fsdp, tensor_parallel > 1 or "
                f"pipeline_parallel > 1 in this kit; set {key}=0/false"
            )
        self._validate_pipeline()

    def _on(self, key: str) -> bool:
        """Whether a parallelism or a switch is on (a number above 1, or true)."""
        value = getattr(self, key)
        return value is True or (not isinstance(value, bool) and value > 1)

    def _validate_pipeline(self) -> None:
        """The pipeline's schedule against its stages and micro-batches (the batch is checked with the world size)."""
        schedule, stages, micro = self.pipeline_schedule, self.pipeline_parallel, self.pipeline_microbatches
        if self.pipeline_virtual_stages > 1 and schedule != "interleaved-1f1b":
            raise ConfigError(
                f"config key 'pipeline_virtual_stages'={self.pipeline_virtual_stages} needs "
                f"pipeline_schedule=interleaved-1f1b (gpipe and 1f1b run one stage per rank)"
            )
        if stages == 1:
            return
        if schedule == "1f1b" and micro < stages:
            raise ConfigError(
                f"config key 'pipeline_microbatches'={micro} must be >= pipeline_parallel={stages} with "
                f"pipeline_schedule=1f1b (its warm-up puts a micro-batch in every stage)"
            )
        if schedule == "interleaved-1f1b" and micro > stages and micro % stages:
            raise ConfigError(
                f"config key 'pipeline_microbatches'={micro} must be at most pipeline_parallel={stages} or a multiple "
                f"of it with pipeline_schedule=interleaved-1f1b (it runs the micro-batches in rounds of {stages})"
            )
        if self.grad_accumulation > 1:
            raise ConfigError(
                f"config key 'grad_accumulation' must be 1 with pipeline_parallel > 1 (got {self.grad_accumulation}): "
                f"pipeline_microbatches already cuts each rank's batch into micro-batches"
            )

    # ------------------------------------------------------------------------
    @property
    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}")

    def per_rank_batch(self, world_size: int) -> int:
        """The batch each rank sees; the global batch must split evenly."""
        if self.global_batch_size % world_size:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} does not split evenly over "
                f"{world_size} ranks; choose a multiple of {world_size}"
            )
        return self.global_batch_size // world_size

    def micro_batch(self, world_size: int) -> int:
        """The batch of one forward pass: the per-rank batch split by ``grad_accumulation``."""
        per_rank = self.per_rank_batch(world_size)
        if per_rank % self.grad_accumulation:
            raise ConfigError(
                f"the per-rank batch {per_rank} does not split into grad_accumulation="
                f"{self.grad_accumulation} micro-batches; choose a divisor of {per_rank}"
            )
        return per_rank // self.grad_accumulation

    @property
    def sections(self) -> Sections:
        """The config as its sections (``cfg.sections.optim.lr``): what each builder is given."""
        values = vars(self)
        return Sections(*(SECTIONS[name](**{key: values[key] for key in SECTION_KEYS[name]}) for name in SECTION_NAMES))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def override(self, overrides: Iterable[str] | Mapping[str, Any]) -> "TrainConfig":
        """A new config with ``key=value`` strings (or a mapping) applied and validated."""
        changes = parse_overrides(overrides)
        return dataclasses.replace(self, **{k: _coerce(k, v) for k, v in changes.items()})

    def save(self, path: str | Path) -> Path:
        """Write the resolved config as YAML (or JSON if the name ends in .json)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        else:
            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


# ---------------------------------------------------------------------------
# typing of values

_HINTS = typing.get_type_hints(TrainConfig)
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}

#: Each section's keys, in their order in :class:`TrainConfig`.
SECTION_KEYS = {
    name: tuple(key for key, f in FIELDS.items() if f.metadata["section"] == name) for name in SECTION_NAMES
}
#: Each section as a frozen dataclass of its keys (``ModelSection`` has ``model``, ``width``, ``depth``...), made from
#: the fields above so that a key is declared once. A builder that reads a key of another section fails at once.
SECTIONS = {
    name: dataclasses.make_dataclass(
        f"{name.title()}Section", [(key, _HINTS[key]) for key in SECTION_KEYS[name]], frozen=True
    )
    for name in SECTION_NAMES
}
for _section in SECTIONS.values():
    _section.__module__ = __name__  # (make_dataclass's own module argument is Python 3.12's): pickled by name
RunSection, DataSection, ModelSection, ParallelSection, TrainingSection, OptimSection, LoggingSection = (
    SECTIONS.values()
)


class Sections(typing.NamedTuple):
    """A config's seven sections (:attr:`TrainConfig.sections`)."""

    run: Any
    data: Any
    model: Any
    parallel: Any
    training: Any
    optim: Any
    logging: Any


def describe_field(key: str) -> str:
    """One line for --help: type, default and help of a config key."""
    hint = _HINTS[key]
    kind = (
        "|".join(typing.get_args(hint))
        if typing.get_origin(hint) is Literal
        else "|".join(MODEL_NAMES)
        if key == "model"
        else hint.__name__
    )
    return f"{key} ({kind}, default {FIELDS[key].default!r}): {FIELDS[key].metadata['help']}"


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, FIELDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown config key '{key}'{hint}; `dlscale train --help` lists every key")


def _coerce(key: str, value: Any) -> Any:
    """Turn ``value`` (from YAML, the CLI or Python) into the field's type, or raise naming the key."""
    if key not in FIELDS:
        raise _unknown_key(key)
    hint = _HINTS[key]
    if typing.get_origin(hint) is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(allowed)}; got {_shown(value)}")
        return value
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
                return value.lower() in _TRUE
            raise ValueError
        if hint is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return whole_number(key, value)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if hint is tuple:
            items = value.replace(",", " ").split() if isinstance(value, str) else list(value or ())
            return tuple(whole_number(key, item) for item in items)
        if hint is str:
            if value is None:
                return ""
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):  # (OverflowError: an int too large for a float)
        pass
    else:
        raise AssertionError(f"unhandled type {hint} for {key}")  # a new field type needs a branch above
    raise ConfigError(
        f"config key '{key}' expects {hint.__name__}, got {_shown(value)} (default is {FIELDS[key].default!r})"
    )


#: The largest whole number a config key takes: a step, a size or a seed fits in 64 bits (torch's and numpy's integers).
MAX_WHOLE = 2**63 - 1


def whole_number(key: str, value: Any) -> int:
    """``value`` (a number or its text) as an int, or a :class:`ConfigError` naming ``key`` and the range where it has
    more digits than any key takes (Python turns no more than 4,300 digits of text into a number)."""
    text = str(value).strip().lstrip("+-").lstrip("0_") if isinstance(value, str) else None
    if text is not None and text.isdigit() and len(text) > len(str(MAX_WHOLE)):
        raise _too_large(key, f"a number of {len(text):,} digits")
    number = int(value)
    if abs(number) > MAX_WHOLE:
        raise _too_large(key, _shown(number))
    return number


def _too_large(key: str, shown: str) -> ConfigError:
    return ConfigError(
        f"config key '{key}' takes whole numbers from -(2**63 - 1) to 2**63 - 1 (19 digits), got {shown}"
    )


def _shown(value: Any, limit: int = 80) -> str:
    """A value as an error message shows it: its repr, cut to ``limit`` characters (a value can be huge)."""
    if isinstance(value, int) and abs(value) > MAX_WHOLE:  # (repr refuses an int of more than 4,300 digits)
        return f"a number of {int(math.log10(abs(value))) + 1:,} digits"
    text = repr(value) if not isinstance(value, (dict, list)) or len(value) < 20 else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def parse_overrides(overrides: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``key=value`` strings (the CLI's, a batch script's) or a mapping, as a dict of raw values."""
    if isinstance(overrides, Mapping):
        return dict(overrides)
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. epochs=2)")
        parsed[key] = raw.strip()
    return parsed


# ---------------------------------------------------------------------------
# named configs


def config_names() -> list[str]:
    """Names of the configs shipped in dlscale/configs/."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _find(name_or_path: str, relative_to: Path | None = None) -> Path:
    candidates = [Path(name_or_path)]
    if relative_to is not None:
        candidates.insert(0, relative_to / name_or_path)
        candidates.insert(1, relative_to / f"{name_or_path}.yaml")
    candidates.append(CONFIG_DIR / f"{name_or_path}.yaml")
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(
        f"no config named '{name_or_path}': not a file, and not one of the shipped configs "
        f"({', '.join(config_names())})"
    )


#: The largest config file read (a shipped one is under 1 KiB).
MAX_CONFIG_BYTES = 64 * 1024


#: The deepest a config's values nest: a key's value is a number, a word or a list of numbers (two levels).
MAX_CONFIG_DEPTH = 8


class _Refused(yaml.YAMLError):
    """What a config may not hold: a YAML alias, values nested too deep (its line is the message)."""


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a config has no use for them, and nested aliases expand a few hundred
    bytes into gigabytes (the "billion laughs"). Nesting stops at :data:`MAX_CONFIG_DEPTH`: PyYAML composes a node
    by recursion, so thousands of nested brackets would end in a ``RecursionError``."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise _Refused(
                f"line {event.start_mark.line + 1} uses the YAML alias *{event.anchor}: configs take "
                f"no aliases; write the value out"
            )
        if self.depth >= MAX_CONFIG_DEPTH:
            raise _Refused(
                f"line {event.start_mark.line + 1} nests values more than {MAX_CONFIG_DEPTH} levels deep: a key's "
                f"value is a number, a word or a list"
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        """An int, or its text where it has more digits than Python turns into a number: the key's type then names
        the key and its range (:func:`whole_number`)."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return self.construct_scalar(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def _read_chain(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Values of a YAML config merged over those it inherits, parent first."""
    if path.resolve() in seen:
        raise ConfigError(f"config {path} inherits from itself (through {' -> '.join(map(str, seen))})")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config {path} is {path.stat().st_size:,} bytes: a config lists a few keys; is it the right file?"
        )
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_ConfigLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError(
            f"config {path} is not UTF-8 text: a config is a YAML file of key: value lines (save it as UTF-8)"
        ) from None
    except _Refused as err:
        raise ConfigError(f"config {path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(err).split())[:300]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of key: value, got {type(data).__name__}")
    parent = data.pop("inherit", None)
    if parent is not None and not isinstance(parent, str):
        raise ConfigError(f"{path}: 'inherit' names a config (a shipped name or a YAML path), got {_shown(parent)}")
    merged = _read_chain(_find(parent, path.parent), seen + (path.resolve(),)) if parent else {}
    for key in data:
        if key not in FIELDS:
            raise ConfigError(f"{path}: " + str(_unknown_key(key)))
    merged.update(data)
    return merged


def load_config(name_or_path: str | None = None, overrides: Iterable[str] | Mapping[str, Any] = ()) -> TrainConfig:
    """Build a validated config from a named or file config and overrides.

    ``name_or_path`` is a shipped config name (``"demo"``, ``"tiny"``), a YAML path, or
    None for the defaults. ``overrides`` are ``"key=value"`` strings or a mapping.
    """
    values = _read_chain(_find(name_or_path)) if name_or_path else {}
    values.update(parse_overrides(overrides))
    return TrainConfig(**{key: _coerce(key, val) for key, val in values.items()})
