"""Which layout for a model that may not fit one GPU: DP, FSDP, TP×DP or PP×TP×DP, each priced, the cheapest chosen.

For a model (:class:`~dlscale.scaling.model_size.ModelSize`), a GPU (:class:`Gpu`: its memory, its peak and the
share of it the model's compute reaches), a site (GPUs per node, the links inside and between nodes) and a number of
GPUs, :func:`layout_rows` lists the layouts that use them all, ``tensor × pipeline × data = GPUs``:

- **DP**: every GPU holds the whole model and its optimizer state; one all-reduce of the gradient per step;
- **FSDP** (ZeRO-3): the state sharded over every GPU; each micro-batch all-gathers the parameters twice (forward,
  backward) and reduce-scatters the gradients;
- **TP×DP**: each layer split over ``t`` GPUs (inside a node while ``t`` fits one; across nodes beyond), its
  activations all-reduced four times per layer and micro-batch (six with recomputation);
- **PP×TP×DP**: tensor parallelism inside a node, the layers cut into ``p`` stages across nodes, priced by
  :mod:`~dlscale.scaling.pipeline_cost`: the schedule's bubble and the activations sent between stages.

The ranks are laid out as the kit's mesh lays them (pipeline × data × tensor, tensor-parallel ranks consecutive): a
data-parallel group holds ``g/t`` GPUs of a node (one when ``t >= g``), and a pipeline crosses nodes once it spans
more than one. Every layout's gradients (or FSDP's parameters) go out bucket by bucket on two levels as ``dlscale
project`` prices them (:func:`~dlscale.scaling.collectives.layout_communication`: NCCL's own choice on a site that
runs NCCL), after the step's last backward, nothing hidden (Megatron-LM's all-reduce of 2021; for DP an upper
bound). A layout is dropped, with the reason, when its memory per GPU exceeds the GPU's, when the global batch is
not a whole number of micro-batches per data-parallel rank, or when its schedule cannot run them. The cheapest is the
fastest step among the rest: the same GPUs for every layout, so the fastest costs the fewest GPU-hours.

Memory per GPU: the parameters' training state (16 bytes each by default: 16-bit weights and gradients, fp32 master
weights, Adam's two moments; Rajbhandari et al. 2020's 16Ψ) over ``t·p`` (FSDP: over every GPU), and the activations
of the micro-batches the schedule holds, a stage's share, split by tensor parallelism (as with sequence parallelism).
Efficiency is against the compute alone, evenly split: ``global batch × operations per sample / (GPUs × rate)``.

Not modelled: smaller matrix products under tensor parallelism (a GPU's rate is the same for every layout), FSDP's
prefetch and DP's overlap (both hide part of their communication), stages of unequal cost, memory fragmentation and
the framework's own buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import RangeError, check_range
from dlscale.reporting.tables import markdown_table
from dlscale.scaling.collectives import ALGORITHMS, hierarchical_allreduce, layout_communication
from dlscale.scaling.model_size import ModelSize
from dlscale.scaling.pipeline_cost import (
    SCHEDULES,
    PipelineStep,
    held_microbatches,
    pipeline_step,
    schedule_refusal,
    send_seconds,
)
from dlscale.scaling.sites import Site

#: The layouts, in the order the table lists them.
LAYOUTS = ("DP", "FSDP", "TP×DP", "PP×TP×DP")
#: An HBM "GB" is a GiB: an A100's 40 GB are 40 × 2**30 bytes.
GIB = 2**30
#: The share of its peak one GPU's compute reaches on a large transformer, unless told: Megatron-LM's A100s reached
#: 44-52% of their 312 TFLOP/s end to end, communication and bubble included (Narayanan et al. 2021, Table 1).
ASSUMED_UTILIZATION = 0.45


@dataclass(frozen=True)
class Gpu:
    """A GPU as the chooser sees it: its memory, its 16-bit peak and the share of that peak the model reaches."""

    name: str
    memory_gb: float  # GiB (HBM's "GB")
    peak_tflops: float  # dense 16-bit tensor operations
    utilization: float = ASSUMED_UTILIZATION
    source: str = "entered"

    def __post_init__(self) -> None:
        check_range("GPU memory (GB)", self.memory_gb, 0, 1e5, above=True)
        check_range("GPU peak (TFLOP/s)", self.peak_tflops, 0, 1e6, above=True)
        check_range("utilization (the share of the peak reached)", self.utilization, 0, 1, above=True)

    @property
    def rate(self) -> float:
        """Operations per second the model's compute reaches on one GPU."""
        return self.peak_tflops * 1e12 * self.utilization


#: The GPUs of the kit's sites, by their vendors' sheets: memory and dense 16-bit peak.
GPUS = {
    "a100-40gb": Gpu("A100 40 GB", 40, 312, source="NVIDIA A100 datasheet (bf16 tensor core, dense)"),
    "a100-80gb": Gpu("A100 80 GB", 80, 312, source="NVIDIA A100 datasheet (bf16 tensor core, dense)"),
    "h100-80gb": Gpu("H100 80 GB (SXM)", 80, 989, source="NVIDIA H100 datasheet (bf16 tensor core, dense)"),
    "mi250x-gcd": Gpu("MI250X, one GCD", 64, 191.5, source="AMD MI250X datasheet (383 TFLOP/s bf16 over 2 GCDs)"),
}
#: Each site's GPU: Perlmutter's nodes have A100s of 40 GB (docs.nersc.gov; a few of 80), Frontier's GCDs 64 GB.
SITE_GPUS = {"Perlmutter": "a100-40gb", "Frontier": "mi250x-gcd"}


@dataclass(frozen=True)
class Training:
    """The step every layout runs: its global batch, cut into micro-batches, and what is kept and sent."""

    global_batch: int
    micro_batch: int = 1
    schedule: str = "1f1b"  # of the pipeline layouts (SCHEDULES)
    virtual: int = 1  # stages per rank (interleaved 1F1B: 2 or more)
    state_bytes_per_parameter: float = 16.0  # mixed-precision Adam (ZeRO's 16Ψ)
    gradient_bytes: int = 2  # of each gradient (and FSDP parameter) value sent
    bucket_mb: float | None = 25.0  # the data-parallel gradients' buckets (None: one message)
    algorithm: str = "auto"  # between nodes (auto: NCCL's choice on an NCCL site, else the cheapest)

    def __post_init__(self) -> None:
        check_range("global batch", self.global_batch, 1, 1e9)
        check_range("micro-batch", self.micro_batch, 1, self.global_batch)
        check_range("stages per rank", self.virtual, 1, 64)
        check_range("bytes of state per parameter", self.state_bytes_per_parameter, 0, 64, above=True)
        check_range("bytes per gradient value", self.gradient_bytes, 1, 8)
        if self.bucket_mb is not None:
            check_range("bucket size (MiB)", self.bucket_mb, 0, above=True)
        if self.schedule not in SCHEDULES:
            raise RangeError(f"schedule must be one of {', '.join(SCHEDULES)}, not {self.schedule!r}")
        if self.algorithm not in ALGORITHMS:
            raise RangeError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def candidates(model: ModelSize, gpus: int, gpus_per_node: int) -> list[tuple[str, int, int, int]]:
    """(layout, tensor, pipeline, data) for every layout of ``gpus``: DP, FSDP, tensor parallelism over 2, 4, ...
    (across nodes too), and pipelines of 2 or more stages (at most the layers) with tensor parallelism inside a node."""
    heads = model.heads or gpus
    rows = [("DP", 1, 1, gpus)] + ([("FSDP", 1, 1, gpus)] if gpus > 1 else [])
    rows += [("TP×DP", t, 1, gpus // t) for t in _powers_of_two(min(gpus, heads)) if t > 1 and gpus % t == 0]
    for t in _powers_of_two(min(gpus_per_node, heads)):
        if gpus % t:
            continue
        rows += [
            ("PP×TP×DP", t, p, gpus // t // p)
            for p in range(2, min(gpus // t, model.layers) + 1)
            if (gpus // t) % p == 0
        ]
    return rows


def group_placement(size: int, stride: int, gpus_per_node: int) -> tuple[int, int]:
    """(members per node, nodes) of a group of ``size`` ranks ``stride`` apart, the ranks filling nodes in order: a
    tensor-parallel group (stride 1), or a data-parallel one (stride ``t``, the kit's mesh putting tensor-parallel
    ranks consecutive and the pipeline outermost)."""
    per_node = max(1, min(size, gpus_per_node // stride))
    return per_node, -(-size // per_node)


def layout_row(
    layout: str, tensor: int, pipeline: int, data: int, model: ModelSize, gpu: Gpu, site: Site, training: Training
) -> dict:
    """One layout priced: memory per GPU, the step's parts, efficiency, and why it is dropped (None: it runs)."""
    g, b = site.gpus_per_node, training.micro_batch
    gpus = tensor * pipeline * data
    virtual = training.virtual if pipeline > 1 else 1
    row = {"layout": layout, "tensor": tensor, "pipeline": pipeline, "data": data, "gpus": gpus, "dropped": None}
    microbatches, left = divmod(training.global_batch, data * b)
    row["microbatches"] = microbatches
    if left or not microbatches:
        row["dropped"] = (
            f"the global batch {training.global_batch} is not a whole number of micro-batches of {b} on each of "
            f"{data} data-parallel ranks"
        )
        microbatches = max(1, microbatches)
    refusal = schedule_refusal(training.schedule, pipeline, microbatches, virtual) if pipeline > 1 else None
    if pipeline * virtual > model.layers:
        refusal = f"{pipeline * virtual} stages need {pipeline * virtual} layers, the model has {model.layers}"
    row["dropped"] = row["dropped"] or refusal
    if tensor > g and tensor % g:
        row["dropped"] = row["dropped"] or f"tensor parallelism across nodes needs a multiple of {g} GPUs"

    # memory per GPU: the training state, sharded; the activations the schedule holds, a stage's share, split by TP
    sharded_over = gpus if layout == "FSDP" else tensor * pipeline
    states = model.parameters * training.state_bytes_per_parameter / sharded_over
    held = held_microbatches(training.schedule, pipeline, microbatches, virtual)
    activations = b * (held * model.activation_bytes_per_sample / pipeline + model.working_bytes_per_sample) / tensor
    row.update(memory_bytes=states + activations, state_bytes=states, activation_bytes=activations)
    if row["memory_bytes"] > gpu.memory_gb * GIB and not row["dropped"]:
        row["dropped"] = f"needs {row['memory_bytes'] / GIB:.3g} GB per GPU, has {gpu.memory_gb:g}"

    step = _step(layout, tensor, pipeline, data, microbatches, virtual, model, gpu, site, training)
    # (against the samples the step runs: the global batch, or what a batch that does not divide leaves of it)
    ideal = microbatches * data * b * model.flops_per_sample / (gpus * gpu.rate)
    row.update(
        compute_s=step.compute,
        tensor_s=step.tensor,
        bubble_s=step.bubble,
        send_s=step.send,
        data_parallel_s=step.data_parallel,
        step_s=step.step,
        efficiency=ideal / step.step,
        samples_per_s=microbatches * data * b / step.step,
        stages_across_nodes=pipeline > 1 and gpus > g,
    )
    return row


def _step(
    layout: str,
    tensor: int,
    pipeline: int,
    data: int,
    microbatches: int,
    virtual: int,
    model: ModelSize,
    gpu: Gpu,
    site: Site,
    training: Training,
) -> PipelineStep:
    """The step's parts (:func:`~dlscale.scaling.pipeline_cost.pipeline_step`) for one layout."""
    g, b = site.gpus_per_node, training.micro_batch
    gpus = tensor * pipeline * data
    compute = b * model.flops_per_sample / (tensor * pipeline * gpu.rate)
    activation = b * model.boundary_bytes_per_sample
    tensor_s = 0.0
    if tensor > 1:  # (t consecutive ranks: one node's, or whole nodes' when t > g)
        per_node, nodes = group_placement(tensor, 1, g)
        one = hierarchical_allreduce(activation, per_node, nodes, site.inside, site.between, "auto", site.nccl)
        tensor_s = model.layers / pipeline * model.tensor_allreduces_per_layer * one
    send = send_seconds(activation, tensor, gpus > g, site.inside, site.between) if pipeline > 1 else 0.0
    per_node, nodes = group_placement(data, tensor, g)  # (a data-parallel group: ranks t apart)
    bucket = training.bucket_mb * 2**20 if training.bucket_mb else None
    data_parallel = 0.0
    if data > 1:
        share = model.parameters * training.gradient_bytes / (tensor * pipeline)
        if layout == "FSDP":  # (every micro-batch: two all-gathers of the parameters, a reduce-scatter of gradients)
            kind, times = "fsdp", microbatches
        else:
            kind, times = "ddp", 1
        sent = layout_communication(
            kind, share, per_node, nodes, site.inside, site.between, training.algorithm, bucket, site.nccl
        )
        data_parallel = times * sent.seconds
    return pipeline_step(compute, tensor_s, send, microbatches, pipeline, virtual, data_parallel)


def layout_rows(model: ModelSize, gpu: Gpu, site: Site, gpus: int, training: Training) -> list[dict]:
    """Every layout of ``gpus`` GPUs (:func:`candidates`) priced by :func:`layout_row`, in the table's order."""
    check_range("GPUs", gpus, 1, 10**6)
    g = site.gpus_per_node
    if gpus > g and gpus % g:
        raise RangeError(f"{gpus} GPUs is not a whole number of nodes of {g} GPUs")
    return [layout_row(layout, t, p, d, model, gpu, site, training) for layout, t, p, d in candidates(model, gpus, g)]


def cheapest(rows: list[dict]) -> dict | None:
    """The fastest layout that runs (the fewest model-parallel ranks among equals), or None if none fits."""
    running = [r for r in rows if not r["dropped"]]
    return min(running, key=lambda r: (r["step_s"], r["tensor"] * r["pipeline"])) if running else None


def choose_layout(
    model: ModelSize, gpu: Gpu, site: Site, gpus: int, training: Training
) -> tuple[list[dict], dict | None]:
    """The rows of every layout and the cheapest of those that run (None: none fits these GPUs)."""
    rows = layout_rows(model, gpu, site, gpus, training)
    return rows, cheapest(rows)


def shape(row: dict) -> str:
    """A layout's degrees as the table writes them: ``t×p×d``."""
    return f"{row['tensor']}×{row['pipeline']}×{row['data']}"


def format_layouts(rows: list[dict], choice: dict | None, gpu: Gpu) -> str:
    """The layouts as a Markdown table (the dropped ones with why), then the choice in one sentence."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:,.0f}" if seconds else "-"

    table = markdown_table(
        [
            "layout",
            "t×p×d",
            "micro-batches",
            "memory per GPU (GB)",
            "step (ms)",
            "bubble (ms)",
            "sends (ms)",
            "TP (ms)",
            "DP/FSDP (ms)",
            "efficiency",
            "dropped because",
        ],
        [
            (
                r["layout"] + (" ←" if r is choice else ""),
                shape(r),
                r["microbatches"],
                f"{r['memory_bytes'] / GIB:,.1f}",
                ms(r["step_s"]),
                ms(r["bubble_s"]),
                ms(r["send_s"]),
                ms(r["tensor_s"]),
                ms(r["data_parallel_s"]),
                f"{r['efficiency']:.0%}",
                r["dropped"] or "",
            )
            for r in rows
        ],
    )
    return table + "\n\n" + describe_choice(rows, choice, gpu)


def describe_choice(rows: list[dict], choice: dict | None, gpu: Gpu) -> str:
    """One sentence: the cheapest layout, and the best of each kind that lost to it."""
    if choice is None:
        least = min(rows, key=lambda r: r["memory_bytes"])
        return (
            f"**No layout fits:** the least memory per GPU is {least['layout']} {shape(least)}'s "
            f"{least['memory_bytes'] / GIB:.3g} GB, on GPUs of {gpu.memory_gb:g} GB. Ask for more GPUs, a smaller "
            "micro-batch, or recompute activations."
        )
    others = []
    for layout in LAYOUTS:
        kind = [r for r in rows if r["layout"] == layout]
        if not kind or choice["layout"] == layout:
            continue
        running = [r for r in kind if not r["dropped"]]
        if running:
            best = min(running, key=lambda r: r["step_s"])
            others.append(f"{layout} at best {best['efficiency']:.0%} ({shape(best)})")
        else:
            others.append(f"{layout} does not fit")
    return (
        f"**Cheapest:** {choice['layout']} {shape(choice)} (tensor × pipeline × data): {choice['step_s']:.3g} s a "
        f"step, {choice['efficiency']:.0%} efficient, {choice['memory_bytes'] / GIB:.3g} GB per GPU of "
        f"{gpu.memory_gb:g}" + (f"; {', '.join(others)}" if others else "") + "."
    )


def layout_assumptions(model: ModelSize, gpu: Gpu, site: Site, gpus: int, training: Training) -> str:
    """The lines the layout table rests on."""
    return "\n".join(
        [
            f"model: {model.describe()}",
            f"GPU: {gpu.name}, {gpu.memory_gb:g} GB, {gpu.peak_tflops:g} TFLOP/s peak ({gpu.source}); its compute "
            f"at {gpu.utilization:.0%} of the peak, the same in every layout",
            f"step: global batch {training.global_batch} in micro-batches of {training.micro_batch}; pipelines run "
            f"{training.schedule}"
            + (f" with {training.virtual} stages per rank" if training.schedule == "interleaved-1f1b" else "")
            + "; bubble (p - 1)/(v·m + p - 1), a send forward and back per slot, Megatron-LM's scatter/gather",
            f"memory: {training.state_bytes_per_parameter:g} bytes of state per parameter (mixed-precision Adam), "
            "activations of the micro-batches the schedule holds, split by tensor parallelism",
            f"communication: {training.gradient_bytes}-byte gradients in "
            + (f"{training.bucket_mb:g} MiB buckets" if training.bucket_mb else "one message")
            + ", after the last backward, nothing hidden; tensor parallelism's all-reduces "
            f"({model.tensor_allreduces_per_layer} per layer and micro-batch) on the critical path",
            f"site: {site.name}, {gpus} GPUs = {max(1, gpus // site.gpus_per_node)} node(s) of "
            f"{site.gpus_per_node}; inside a node {site.inside.describe()}; between nodes, per GPU, "
            f"{site.between.describe()}",
            "not modelled: smaller matrix products under tensor parallelism, FSDP's prefetch and DP's overlap, "
            "stages of unequal cost, the framework's own buffers",
        ]
    )
