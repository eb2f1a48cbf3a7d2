"""Published pipeline-parallel results, predicted by the layout model from their published inputs.

Narayanan et al. 2021 (arXiv:2104.04473, the Megatron-LM paper), Table 2, "PTD Parallelism": GPT models of 174.6 and
529.6 billion parameters trained with tensor, pipeline and data parallelism on Selene's DGX A100 nodes, each at one
global batch on more and more GPUs (384 to 1,536; 560 to 2,240). Only the data-parallel size grows, so each
data-parallel rank's share of the batch shrinks and its pipeline runs fewer micro-batches: the bubble
``(p - 1)/(m + p - 1)`` grows from 3% to 10%, and the per-GPU throughput the paper reports falls (153 → 141 and
171 → 159 teraFLOP/s). That fall is what the pipeline term predicts here, each case against the smallest run of its
series (as a weak-scaling case is against one node): one GPU's compute rate is what makes the model's smallest run
the published one, and nothing else is fitted (:func:`validate`).

The inputs (:data:`CASES`): the models' shapes from the paper's Table 1 (174.6B: GPT-3's; 529.6B: 105 layers of
hidden size 20,480 and 128 heads; sequence 2,048, vocabulary 51,200), its equations (2) and (3) for their parameters
and operations (as :func:`~dlscale.scaling.model_size.gpt`), Table 2's model-parallel sizes, batch, GPUs and
micro-batch size (1), and §5's cluster: 8 A100s of 80 GB per node on NVLink and NVSwitch, 8 HDR InfiniBand HCAs of
200 Gbit/s per node. What the paper does not give is named in each case's ``assumed``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dlscale.reporting.tables import markdown_table
from dlscale.scaling.layouts import Gpu, Training, layout_row
from dlscale.scaling.model_size import ModelSize, gpt
from dlscale.scaling.nccl import NcclNode
from dlscale.scaling.sites import machine

#: Narayanan et al. 2021's source line.
MEGATRON_2021 = "Narayanan et al. 2021, arXiv:2104.04473, Table 2"
#: Selene's DGX A100 nodes (§5): 8 A100 80 GB joined by NVSwitch (12 NVLink 3 links each: 300 GB/s per direction),
#: 8 HDR InfiniBand HCAs of 200 Gbit/s (25 GB/s per GPU); AMD EPYC CPUs (DGX A100's).
SELENE = machine(
    "Selene (DGX A100)",
    8,
    300,
    25,
    source="Narayanan et al. 2021, §5; NVIDIA DGX A100 datasheet",
    nccl=NcclNode(compute_capability=8.0, cpu="amd", nvlink=True),
)
#: An A100's dense 16-bit peak (the paper's "312 teraFLOP/s").
A100_PEAK_TFLOPS = 312.0

_INPUTS = (
    "Selene: DGX A100 nodes of 8 A100 80 GB (NVSwitch, 300 GB/s per direction), 8 HDR InfiniBand HCAs of 200 Gbit/s "
    "per node (25 GB/s per GPU) (§5); Table 2: model-parallel size {mp} (t = {t}, p = {p}), batch {batch}, "
    "micro-batch 1, {gpus} GPUs (d = {d}) against {base} (d = {base_d}): {published:g} against {baseline:g} teraFLOP/s "
    "per GPU; the model's shape from Table 1 ({shape}), sequence 2,048, vocabulary 51,200; its operations by "
    "equation (3), which counts the recomputed forward"
)
_ASSUMED = (
    "t = 8, the GPUs of a node (the table gives t·p; Megatron-LM's README: 'typically tensor parallel of size 8')",
    "Megatron-LM's default schedule, 1F1B without interleaving (Table 2 does not say; the interleaved schedule at "
    "2 stages per rank is the last column)",
    "the gradients all-reduced in 16 bits as one buffer after the pipeline's flush, nothing hidden (Megatron-LM's "
    "local DDP of 2021)",
    "the send between stages with Megatron-LM's scatter/gather (§4.1), each GPU on its own HCA",
)


@dataclass(frozen=True)
class PipelineCase:
    """One published run of a series at a fixed batch, and the series' smallest run it is measured against."""

    name: str
    model: ModelSize
    tensor: int
    pipeline: int
    gpus: int
    baseline_gpus: int
    global_batch: int
    published_tflops: float  # teraFLOP/s per GPU, as the paper counts them (its equation (3))
    baseline_tflops: float
    inputs: str
    assumed: tuple[str, ...] = field(default_factory=tuple)
    micro_batch: int = 1
    source: str = MEGATRON_2021

    @property
    def published_efficiency(self) -> float:
        """The per-GPU throughput against the smallest run's."""
        return self.published_tflops / self.baseline_tflops

    def training(self, schedule: str = "1f1b", virtual: int = 1) -> Training:
        """The step the paper ran, as the layout model takes it (one buffer of 16-bit gradients)."""
        return Training(self.global_batch, self.micro_batch, schedule, virtual, bucket_mb=None)

    def row(self, gpus: int, gpu: Gpu, schedule: str = "1f1b", virtual: int = 1) -> dict:
        """The layout model's row for this case's model on ``gpus`` GPUs, with its achieved teraFLOP/s per GPU."""
        data = gpus // (self.tensor * self.pipeline)
        row = layout_row(
            "PP×TP×DP",
            self.tensor,
            self.pipeline,
            data,
            self.model,
            gpu,
            SELENE,
            self.training(schedule, virtual),
        )
        row["tflops"] = self.global_batch * self.model.flops_per_sample / (gpus * row["step_s"]) / 1e12
        return row

    def gpu(self, schedule: str = "1f1b", virtual: int = 1) -> Gpu:
        """An A100 whose compute rate makes the model's smallest run of the series reach its published
        teraFLOP/s: the one input taken from the series itself, as the baseline of an efficiency is."""
        gpu = Gpu("A100 80 GB", 80, A100_PEAK_TFLOPS, 0.5, "its rate from the series' smallest run")
        for _ in range(30):  # (the rate moves the communication's share a little: a few rounds settle it)
            reached = self.row(self.baseline_gpus, gpu, schedule, virtual)["tflops"]
            utilization = gpu.utilization * self.baseline_tflops / reached
            gpu = dataclasses.replace(gpu, utilization=min(1.0, utilization))
        return gpu

    def predict(self, schedule: str = "1f1b", virtual: int = 1) -> dict:
        """The model's row at this case's GPUs, its compute rate from the series' smallest run (:meth:`gpu`)."""
        return self.row(self.gpus, self.gpu(schedule, virtual), schedule, virtual)


def _case(
    name: str,
    model: tuple[ModelSize, str],
    pipeline: int,
    batch: int,
    gpus: int,
    base: int,
    tflops: float,
    base_tflops: float,
) -> PipelineCase:
    """One of Table 2's PTD-P rows (t = 8) against its series' smallest; ``model``: the model and its shape in words."""
    model, shape = model
    return PipelineCase(
        name,
        model,
        8,
        pipeline,
        gpus,
        base,
        batch,
        tflops,
        base_tflops,
        _INPUTS.format(
            mp=8 * pipeline,
            t=8,
            p=pipeline,
            batch=f"{batch:,}",
            gpus=f"{gpus:,}",
            d=gpus // (8 * pipeline),
            base=base,
            base_d=base // (8 * pipeline),
            published=tflops,
            baseline=base_tflops,
            shape=shape,
        ),
        _ASSUMED,
    )


#: GPT-3's shape, as Table 1 gives it (174.6 billion parameters by equation (2)), and Table 1's 529.6B model.
GPT_175B = (gpt("GPT 174.6B", 96, 12288, 96), "96 layers, hidden size 12,288, 96 heads")
GPT_530B = (gpt("GPT 529.6B", 105, 20480, 128), "105 layers, hidden size 20,480, 128 heads")

#: Table 2's PTD-P rows: each series' larger runs against its smallest.
CASES = (
    _case("Megatron-LM 174.6B, 768 GPUs", GPT_175B, 12, 1536, 768, 384, 149, 153),
    _case("Megatron-LM 174.6B, 1,536 GPUs", GPT_175B, 12, 1536, 1536, 384, 141, 153),
    _case("Megatron-LM 529.6B, 1,120 GPUs", GPT_530B, 35, 2240, 1120, 560, 167, 171),
    _case("Megatron-LM 529.6B, 2,240 GPUs", GPT_530B, 35, 2240, 2240, 560, 159, 171),
)


def validate(cases: tuple[PipelineCase, ...] = CASES) -> list[dict]:
    """Each case's published per-GPU throughput beside the model's, against the series' smallest run; the step's
    parts (bubble, sends, data-parallel all-reduce) as shares of the step; the same with 2 stages per rank."""
    rows = []
    for case in cases:
        row = case.predict()
        interleaved = case.predict("interleaved-1f1b", 2)
        rows.append(
            {
                "case": case.name,
                "source": case.source,
                "gpus": case.gpus,
                "layout": f"{row['tensor']}×{row['pipeline']}×{row['data']}",
                "microbatches": row["microbatches"],
                "published_tflops": case.published_tflops,
                "predicted_tflops": row["tflops"],
                "published": case.published_efficiency,
                "predicted": row["tflops"] / case.baseline_tflops,
                "points_off": 100 * (row["tflops"] - case.published_tflops) / case.baseline_tflops,
                "bubble_share": row["bubble_s"] / row["step_s"],
                "send_share": row["send_s"] / row["step_s"],
                "data_parallel_share": row["data_parallel_s"] / row["step_s"],
                "memory_gb": row["memory_bytes"] / 2**30,
                "fits": row["dropped"] is None,
                "interleaved": interleaved["tflops"] / case.baseline_tflops,
                "inputs": case.inputs,
                "assumed": case.assumed,
            }
        )
    return rows


def format_validation(rows: list[dict]) -> str:
    """The pipeline cases as a Markdown table: the published per-GPU throughput and the estimate, both against the
    series' smallest run, the step's parts, and the estimate with the interleaved schedule."""
    return markdown_table(
        [
            "case",
            "t×p×d",
            "micro-batches",
            "published (TFLOP/s per GPU)",
            "estimate",
            "published efficiency",
            "estimate",
            "points off",
            "bubble",
            "sends",
            "DP all-reduce",
            "interleaved, 2 stages per rank",
        ],
        [
            (
                f"{r['case']} ({r['source']})",
                r["layout"],
                r["microbatches"],
                f"{r['published_tflops']:g}",
                f"{r['predicted_tflops']:.1f}",
                f"{r['published']:.1%}",
                f"{r['predicted']:.1%}",
                f"{r['points_off']:+.1f}",
                f"{r['bubble_share']:.1%}",
                f"{r['send_share']:.1%}",
                f"{r['data_parallel_share']:.1%}",
                f"{r['interleaved']:.1%}",
            )
            for r in rows
        ],
    )


def format_inputs(rows: list[dict]) -> str:
    """Each pipeline case's inputs and what is assumed, as a Markdown table."""
    return markdown_table(
        ["case", "inputs and their sources", "assumed"],
        [(f"{r['case']} ({r['source']})", r["inputs"], "; ".join(r["assumed"])) for r in rows],
    )


#: Table 2's ZeRO-3 rows of the 174.6B model (no model parallelism, batch 1,536): GPUs, micro-batch, teraFLOP/s.
ZERO3_175B = ((384, 4, 144.0), (768, 2, 88.0), (1536, 1, 44.0))


def fsdp_beside_zero3(bucket_mb: float | None = 25.0) -> list[dict]:
    """The layout model's FSDP row for Table 2's ZeRO-3 runs of the 174.6B model (at the 384-GPU PTD-P run's compute
    rate), beside their published teraFLOP/s: not a case (the model hides none of FSDP's all-gathers, DeepSpeed
    prefetches them, and its unit sizes are not Table 2's), a check of the direction only."""
    case = CASES[0]
    gpu = case.gpu()
    rows = []
    for gpus, micro_batch, published in ZERO3_175B:
        training = Training(case.global_batch, micro_batch, bucket_mb=bucket_mb)
        row = layout_row("FSDP", 1, 1, gpus, case.model, gpu, SELENE, training)
        estimate = case.global_batch * case.model.flops_per_sample / (gpus * row["step_s"]) / 1e12
        rows.append({"gpus": gpus, "micro_batch": micro_batch, "published": published, "estimate": estimate})
    return rows


def format_zero3() -> str:
    """:func:`fsdp_beside_zero3` as a Markdown table: FSDP's units of 25 MiB, and each collective as one message."""
    units, whole = fsdp_beside_zero3(25.0), fsdp_beside_zero3(None)
    return markdown_table(
        [
            "ZeRO-3, 174.6B (Table 2)",
            "micro-batch",
            "published (TFLOP/s per GPU)",
            "FSDP row: units of 25 MiB",
            "one message per collective",
        ],
        [
            (
                f"{a['gpus']:,} GPUs",
                a["micro_batch"],
                f"{a['published']:g}",
                f"{a['estimate']:.0f}",
                f"{b['estimate']:.0f}",
            )
            for a, b in zip(units, whole)
        ],
    )
