"""Published weak-scaling results, predicted by the model from their published inputs, and assumptions named.

Each case gives what a paper, a benchmark's README or a tutorial states — the model and the bytes of
its gradients, one GPU's (or one node's) throughput, the per-GPU batch, the GPUs per node and the
links — and the efficiency it reported. :func:`validate` runs :func:`~dlscale.scaling.projection.project`
on those inputs with the same rules for every case (the overlap the model estimates from the bucket schedule of
the case's own model — none of the papers reports a measured one; each bucket priced as NCCL's tuning model prices
its own choice of algorithm and protocol (:mod:`~dlscale.scaling.nccl`), read with the case's GPU and its links
inside the node, chosen among those the run's NCCL release had (``nccl_version``: a run of NCCL 2.0 had rings and
Simple only); buckets as DDP makes them, unless the case's framework documents its own; DDP's own cost per bucket
and per byte at the prices PyTorch's DDP benchmark gives a V100 (:mod:`~dlscale.scaling.ddp_cost`), also for the
frameworks that copy their gradients into buffers of their own; the overlapped compute slowed by the published
18.9% (:mod:`~dlscale.scaling.slowdown`)) and sets the prediction beside the report, between its two bounds: no
overlap, and every second of communication hidden for free (the most the backward pass can hide). Nothing here was
tuned to a case: an input a paper does not give is named in ``assumed``, and the compute is varied by ±25% to show
how much it matters.

Two groups (:data:`CASES`). On the slow networks of 2017–18 (:data:`SLOW_NETWORK_CASES`): four train ResNet-50
on ImageNet (the developers' own), with the efficiencies the papers report, as tabulated by Mikami et al. (2018) and
NVIDIA's summary of it
(https://developer.nvidia.com/blog/sony-breaks-resnet-50-training-record-with-nvidia-v100-tensor-core-gpus/); three
were held out while the overlap estimate was built: Horovod's 512-GPU benchmark of three models of different shapes
(ResNet-101, Inception V3, VGG-16, whose 120 M fully connected parameters come last in the forward pass and so first
in the backward). On fast networks (:data:`FAST_NETWORK_CASES`): PyTorch's own DDP benchmark on two DGX-1
(four models; its one-GPU runs are also where DDP's own cost is fitted, so these four test the rest of the model)
and NERSC's SC22 tutorial's U-Net on 32 Perlmutter nodes (fitted to nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.reporting.tables import markdown_table
from dlscale.scaling.ddp_cost import DDP_BENCHMARK_ONE_GPU
from dlscale.scaling.nccl import NCCL_VERSION, NcclNode
from dlscale.scaling.overlap import published_layers
from dlscale.scaling.projection import AUTO, Workload, project_efficiency
from dlscale.scaling.sites import machine

#: ImageNet-1k's training images: 90 epochs of them in a published wall time give a throughput.
IMAGENET_TRAIN_IMAGES = 1_281_167


@dataclass(frozen=True)
class PublishedCase:
    """One published weak-scaling result and the inputs the model takes from it."""

    name: str
    source: str
    gpus: int
    gpus_per_node: int
    per_gpu_batch: int
    images_per_s: float  # one GPU's training throughput (the compute the model starts from)
    bytes_per_value: int  # of each gradient value sent
    inside_gbs: float  # between GPUs of a node, GB/s per direction
    between_gbs: float  # each GPU's share of the node's network, GB/s per direction
    baseline: str  # what the reported efficiency is against: "gpu" or "node"
    published_efficiency: float
    inputs: str  # where each input comes from
    assumed: tuple[str, ...] = field(default_factory=tuple)  # inputs the sources do not give
    model: str = "resnet50"  # its layer table (dlscale/scaling/published_layers.json)
    bucket_mb: float | None = 25.0  # its framework's messages (DDP's buckets unless the source says otherwise)
    first_bucket_mb: float | None = 1.0  # DDP's small first bucket; None where the framework has none
    overlaps: bool = True  # False where the framework sends the gradient only after the backward pass
    compute_capability: float = 6.0  # the GPUs' (NCCL's tuning model reads it: 6.0 P100, 6.1 P40, 7.0 V100)
    nvlink: bool = False  # the node's GPUs joined by NVLink (else PCIe)
    cpu: str = "intel"  # the nodes' CPUs (NCCL's network overhead per step reads it)
    channels: int | None = None  # NCCL's channels (None: its default for the node)
    # The NCCL release the run had: NCCL's choice is made among the algorithms and protocols it had. Today's where the
    # case's all-reduce between nodes is its framework's own (Gloo, a 2-D torus, a hierarchical one): no NCCL release
    # ran it, and today's choice stands in for it, as it does for every case's constants.
    nccl_version: str = NCCL_VERSION
    fitted_here: bool = False  # its source also gave one of the model's own inputs (DDP's cost on a GPU)

    def predict(
        self, compute_factor: float = 1.0, overlap: float | str | None = None, slowdown: float | None = None
    ) -> dict:
        """The model's row at this case's GPU count (``compute_factor`` scales one GPU's compute time; ``overlap``
        the share hidden: by default estimated from the bucket schedule, or none where the framework does not
        overlap; ``slowdown`` the overlapped compute's, by default the published one)."""
        if overlap is None:
            overlap = AUTO if self.overlaps else 0.0
        nccl = NcclNode(self.compute_capability, self.cpu, self.nvlink, self.channels, version=self.nccl_version)
        site = machine(self.name, self.gpus_per_node, self.inside_gbs, self.between_gbs, source=self.source, nccl=nccl)
        layers = published_layers(self.model)
        workload = Workload(
            self.name,
            sum(layer.parameters for layer in layers),
            compute_factor / self.images_per_s,
            self.per_gpu_batch,
            self.bytes_per_value,
            overlap=overlap,
            compute_source="published throughput",
            bucket_mb=self.bucket_mb,
            layers=layers,
            layers_source=f"torchvision's {self.model}",
            first_bucket_mb=self.first_bucket_mb,
            **({} if slowdown is None else {"slowdown": slowdown}),
        )
        return project_efficiency(workload, site, nodes=(self.gpus // self.gpus_per_node,), baseline=self.baseline)[0]

    def bounds(self) -> tuple[float, float]:
        """The efficiency with no overlap and with the most overlap the backward pass allows, hidden for free (no
        slow-down): how wide the truth can be, DDP's own cost in both."""
        return self.predict(overlap=0.0)["efficiency"], self.predict(overlap=1.0, slowdown=0.0)["efficiency"]


#: P100, ResNet-50, batch 32 per GPU: He et al.'s 90 epochs in 29 hours on 8 P100 (the baseline Goyal et al. cut to
#: one hour) is 90 × 1,281,167 / (29 × 3600) = 1,104 images/s per 8-GPU server, 138 per GPU.
P100_IMAGES_PER_S = 90 * IMAGENET_TRAIN_IMAGES / (29 * 3600) / 8

#: One P100's training throughput at batch 64, synthetic data, in TensorFlow's benchmark of May 2017 (the
#: tf_cnn_benchmarks script Horovod's benchmark runs; tensorflow.org/performance/benchmarks, "Details for NVIDIA
#: DGX-1 (NVIDIA Tesla P100)", one GPU), images per second.
TF_P100_IMAGES_PER_S = {"inception_v3": 142.0, "resnet50": 219.0, "resnet152": 91.8, "vgg16": 154.0}
#: ResNet-101 is not in that table: its time per image put between ResNet-50's and ResNet-152's by its bottleneck
#: blocks (16, 33, 50): 1 / (1/219 + (33 - 16) / (50 - 16) · (1/91.8 - 1/219)) = 131 images/s. An assumption.
RESNET101_P100_IMAGES_PER_S = 1 / (
    1 / TF_P100_IMAGES_PER_S["resnet50"]
    + (33 - 16) / (50 - 16) * (1 / TF_P100_IMAGES_PER_S["resnet152"] - 1 / TF_P100_IMAGES_PER_S["resnet50"])
)

_HOROVOD_INPUTS = (
    "128 servers of 4 Pascal GPUs, RoCE at 25 Gbit/s per server (3.1 GB/s, 0.78 per GPU), 512 GPUs "
    "(Horovod's docs, benchmarks: 'Horovod achieves 90% scaling efficiency for both Inception V3 and ResNet-101, "
    "and 68% scaling efficiency for VGG-16'; Sergeev and Del Balso 2018, arXiv:1802.05799); tf_cnn_benchmarks at "
    "batch 64 per GPU (the docs' command), fp32 gradients; Horovod's tensor fusion sends buckets of up to 64 MiB "
    "(HOROVOD_FUSION_THRESHOLD's default), each sent as one NCCL all-reduce over all 512 GPUs (Horovod's only path "
    "then: its hierarchical all-reduce came in July 2018); efficiency against one GPU's rate times the GPUs"
)
_HOROVOD_ASSUMED = (
    "the Pascal GPUs are P100s, and one computes as fast as in TensorFlow's DGX-1 benchmark",
    "PCIe 3 between the GPUs of a server, 12 GB/s",
    "the fusion buffer fills in the backward order as DDP's buckets do (its 5 ms cycle not modelled)",
    "NCCL 2.1: the sources name NCCL 2, not its release; the 512-GPU chart came into Horovod's docs in May 2018, "
    "before NCCL 2.4's tree (December 2018), so rings only; 2.0 (no LL) gives the same estimates",
)


def _horovod_case(
    name: str, model: str, images_per_s: float, efficiency: float, assumed_compute: str | None
) -> PublishedCase:
    """One model of Horovod's 512-GPU benchmark: the same servers, links, batch and fusion buffer; its own model and
    one P100's throughput (from TensorFlow's table, or ``assumed_compute`` where the table has none)."""
    return PublishedCase(
        name,
        "Horovod docs; arXiv:1802.05799",
        gpus=512,
        gpus_per_node=4,
        per_gpu_batch=64,
        images_per_s=images_per_s,
        bytes_per_value=4,
        inside_gbs=12,
        between_gbs=25 / 8 / 4,
        baseline="gpu",
        published_efficiency=efficiency,
        inputs=_HOROVOD_INPUTS
        + ("" if assumed_compute else f"; compute: {images_per_s:.0f} images/s per P100 (TensorFlow's benchmark)"),
        assumed=(*_HOROVOD_ASSUMED, assumed_compute) if assumed_compute else _HOROVOD_ASSUMED,
        model=model,
        bucket_mb=64,  # (HOROVOD_FUSION_THRESHOLD)
        first_bucket_mb=None,
        nccl_version="2.1",
    )


SLOW_NETWORK_CASES = (
    PublishedCase(
        "Goyal et al. 2017",
        "arXiv:1706.02677",
        gpus=256,
        gpus_per_node=8,
        per_gpu_batch=32,
        images_per_s=P100_IMAGES_PER_S,
        bytes_per_value=4,
        inside_gbs=20,
        between_gbs=50 / 8 / 8,
        baseline="node",
        published_efficiency=0.90,
        inputs="32 Big Basin servers of 8 P100 joined by NVLink, 50 Gbit/s Ethernet per server (6.25 GB/s, 0.78 per "
        "GPU), batch 8,192 = 32 per GPU, fp32 gradients; compute: 138 images/s per P100 (29 h for 90 epochs "
        "on 8 P100); efficiency from 8 to 256 GPUs (one node is the baseline)",
        assumed=(
            "NVLink 1 ring at one link's 20 GB/s per direction",
            "between servers the paper's own all-reduce with Gloo (recursive halving and doubling: a ring's bytes, a "
            "latency that grows as log p), not NCCL's: NCCL's choice today stands in for it",
        ),
        nvlink=True,
    ),
    PublishedCase(
        "Akiba et al. 2017",
        "arXiv:1711.04325",
        gpus=1024,
        gpus_per_node=8,
        per_gpu_batch=32,
        images_per_s=P100_IMAGES_PER_S,
        bytes_per_value=2,
        inside_gbs=12,
        between_gbs=2 * 56 / 8 / 8,
        baseline="gpu",
        published_efficiency=0.80,
        inputs=(
            "128 MN-1 nodes of 8 P100, two InfiniBand FDR links per node (2 × 56 Gbit/s: 14 GB/s, 1.75 per GPU; "
            "PFN's blog on MN-1, tech.preferred.jp/en/blog/mn-1-a-gpu-cluster-behind-15-min-imagenet), batch 32,768 "
            "= 32 per GPU, NCCL 2.0.5 and Open MPI 1.10.2, gradients sent in half precision (the paper): NCCL 2.0 "
            "had rings and Simple only; compute: 138 images/s per P100, the same GPU and batch as Goyal et al."
        ),
        assumed=(
            "PCIe 3 between the GPUs of a node, 12 GB/s",
            "one GPU's throughput taken from Goyal et al.'s baseline (the paper gives none)",
            "ChainerMN's multi-node optimizer (the paper's framework) runs the backward pass, then all-reduces the "
            "whole gradient packed in one buffer: one message, nothing hidden (as every communicator of ChainerMN "
            "1.1.0 does)",
            "that message sent as one NCCL all-reduce over all 1,024 GPUs, as ChainerMN's pure_nccl communicator "
            "sends it (the one that all-reduces half-precision gradients in its later releases; the paper does not "
            "name its communicator)",
        ),
        bucket_mb=None,
        first_bucket_mb=None,
        overlaps=False,
        nccl_version="2.0.5",
    ),
    PublishedCase(
        "Mikami et al. 2018",
        "arXiv:1811.05233",
        gpus=1088,
        gpus_per_node=4,
        per_gpu_batch=32,
        images_per_s=1000,
        bytes_per_value=2,
        inside_gbs=50,
        between_gbs=2 * 100 / 8 / 4,
        baseline="gpu",
        published_efficiency=0.9162,
        inputs="272 ABCI nodes of 4 V100 joined by NVLink 2, two InfiniBand EDR ports per node (25 GB/s, 6.25 per "
        "GPU), batch about 34K = 32 per GPU, mixed precision",
        assumed=(
            "fp16 gradients sent",
            "1,000 images/s per V100 with mixed precision at batch 32 (no source gives it: a round figure)",
            "NVLink 2 at 50 GB/s per pair",
            "the paper's own 2-D torus all-reduce (inside the node, then between the nodes) priced as NCCL's choice "
            "today (its tree): the NCCL of November 2018 had rings only",
        ),
        compute_capability=7.0,
        nvlink=True,
    ),
    PublishedCase(
        "Jia et al. 2018",
        "arXiv:1807.11205",
        gpus=2048,
        gpus_per_node=8,
        per_gpu_batch=32,
        images_per_s=160,
        bytes_per_value=2,
        inside_gbs=12,
        between_gbs=100 / 8 / 8,
        baseline="gpu",
        published_efficiency=0.879,
        inputs="256 nodes of 8 P40, 100 Gbit/s Ethernet per node (12.5 GB/s, 1.56 per GPU), batch 65,536 = 32 per "
        "GPU, mixed precision; 2,048 GPUs, just above this validation's 2,000",
        assumed=(
            "160 images/s per P40 (no source gives it, and it is about what the paper's own 87.9% implies: "
            "this case is a consistency check, not a prediction)",
            "fp16 gradients sent",
            "PCIe 3 between the GPUs of a node, 12 GB/s",
            "the paper's own hierarchical all-reduce (up to 11 times NCCL-based training's speed for ResNet-50 on "
            "1,024 P40, its abstract) priced as NCCL's choice today (its tree): the NCCL of July 2018 had rings only",
        ),
        compute_capability=6.1,
    ),
    *(
        _horovod_case(name, model, images_per_s, efficiency, compute)
        for name, model, images_per_s, efficiency, compute in (
            (
                "Horovod ResNet-101",
                "resnet101",
                RESNET101_P100_IMAGES_PER_S,
                0.90,
                "131 images/s per P100: ResNet-101 is not in TensorFlow's table; its time per image put between "
                "ResNet-50's (219 images/s) and ResNet-152's (91.8) by its bottleneck blocks",
            ),
            ("Horovod Inception V3", "inception_v3", TF_P100_IMAGES_PER_S["inception_v3"], 0.90, None),
            ("Horovod VGG-16", "vgg16", TF_P100_IMAGES_PER_S["vgg16"], 0.68, None),
        )
    ),
)


#: PyTorch's DDP benchmark (pytorch/pytorch, benchmarks/distributed/ddp/README.md): PyTorch 1.4, NCCL, DGX-1 servers
#: of 8 V100 joined by NVLink (the hybrid cube-mesh of its ``nvidia-smi topo -m``), four 100 Gbit/s InfiniBand
#: ports per server ("4x 100Gb InfiniBand per machine"), batch 32 per GPU, fp32; 16 GPUs are two servers.
DDP_BENCHMARK_README = "pytorch/pytorch benchmarks/distributed/ddp/README.md"
#: Its images/s per GPU on 16 GPUs (p50; ResNeXt-101 by seconds per step: 0.415 s on one GPU, 0.450 s on 16).
DDP_BENCHMARK_16_GPUS = {"resnet50": 306.0, "resnet101": 178.0, "resnext50_32x4d": 203.0, "resnext101_32x8d": 71.1}
#: How much slower its bucket_cap_mb=1 ran than the default 25 (p75 of its "diff" table), on 8 and 16 GPUs.
DDP_BENCHMARK_1MIB_SLOWER = {"resnet50": {8: 0.026, 16: 0.038}, "resnet101": {8: 0.035, 16: 0.001}}


def _ddp_benchmark_case(name: str, model: str) -> PublishedCase:
    """One model of PyTorch's DDP benchmark on two DGX-1: its one-GPU throughput without DDP, its 16 GPUs'."""
    alone = DDP_BENCHMARK_ONE_GPU[model][0]
    return PublishedCase(
        name,
        DDP_BENCHMARK_README,
        gpus=16,
        gpus_per_node=8,
        per_gpu_batch=32,
        images_per_s=alone,
        bytes_per_value=4,
        inside_gbs=50,
        between_gbs=4 * 100 / 8 / 8,
        baseline="gpu",
        published_efficiency=DDP_BENCHMARK_16_GPUS[model] / alone,
        inputs=f"2 DGX-1 of 8 V100 joined by NVLink, 4 InfiniBand ports of 100 Gbit/s per server (50 GB/s, 6.25 per "
        f"GPU), batch 32 per GPU, fp32, DDP's default buckets (PyTorch 1.4, NCCL); compute: {alone:.0f} images/s "
        f"on one V100 without DDP; efficiency: the 16 GPUs' {DDP_BENCHMARK_16_GPUS[model]:.0f} images/s each "
        "against it (all from the README)",
        assumed=(
            "NVLink between a DGX-1's GPUs at 50 GB/s (a bonded pair of NVLink 2 links; the network's 6.25 GB/s per "
            "GPU is the slower link)",
            "its one-GPU runs with and without DDP are where DDP's own cost on a GPU is fitted: this case checks the "
            "rest of the model",
            "NCCL 2.4.8, the one PyTorch bundled from July 2019 to June 2020 (the README's build, 1.4.0a0, names "
            "none): ring and tree with LL and Simple, no LL128; a 2.5 gives today's choice, 0.1-0.2 points higher",
        ),
        model=model,
        compute_capability=7.0,
        nvlink=True,
        fitted_here=True,
        nccl_version="2.4.8",
    )


#: NERSC's SC22 "Deep Learning at Scale" tutorial (NERSC/sc22-dl-tutorial, README "Weak and Strong Throughput
#: Scaling"): the 3-D U-Net on crops of 64^3, batch 64 per A100, DALI and AMP, on 1 to 32 Perlmutter nodes.
SC22_SOURCE = "NERSC/sc22-dl-tutorial README"

FAST_NETWORK_CASES = (
    _ddp_benchmark_case("DDP benchmark ResNet-50", "resnet50"),
    _ddp_benchmark_case("DDP benchmark ResNet-101", "resnet101"),
    _ddp_benchmark_case("DDP benchmark ResNeXt-50", "resnext50_32x4d"),
    _ddp_benchmark_case("DDP benchmark ResNeXt-101", "resnext101_32x8d"),
    PublishedCase(
        "NERSC SC22 U-Net",
        SC22_SOURCE,
        gpus=128,
        gpus_per_node=4,
        per_gpu_batch=64,
        images_per_s=820,
        bytes_per_value=4,
        inside_gbs=100,
        between_gbs=25,
        baseline="gpu",
        published_efficiency=0.866,
        inputs="32 Perlmutter nodes of 4 A100 (NVLink 3, 100 GB/s per pair; AMD EPYC), batch 64 per GPU, AMP (fp32 "
        "gradients), PyTorch DDP at bucket_cap_mb=25 (NGC 22.10, whose NCCL is later than 2.5: NGC 19.11 already had "
        "2.5.6, so every algorithm and protocol NCCL prices for an A100); compute: 820 samples/s on one A100 with "
        "synthetic data, DALI and AMP (the README's benchy summary); efficiency: synthetic data with DDP against "
        "synthetic data with DDP off (--noddp) at 32 nodes, about 90,500 against 104,500 samples/s (104,500 / 128 = "
        "816 per GPU, the compute above), read from the tutorial's plot tutorial_images/scale_perfComm.png; the 3-D "
        "U-Net's layers (117 M parameters in 12 convolutions) from its networks/UNet.py",
        assumed=(
            "the published efficiency is read from a plot (about ±1 point); the README says the communication "
            "overhead at 32 nodes is 'around 12%'",
            "Slingshot 11, one 25 GB/s NIC per GPU (as Perlmutter is documented today; the run's date is not given)",
            "the U-Net's backward time per layer in proportion to its forward operations, as for every case",
        ),
        model="sc22_unet",
        compute_capability=8.0,
        nvlink=True,
        cpu="amd",
        channels=4,
    ),
)

#: Every case: the slow networks' first, then the fast networks'.
CASES = SLOW_NETWORK_CASES + FAST_NETWORK_CASES


def bucket_direction(model: str, gpus: int, small_mb: float = 1.0) -> tuple[float, float]:
    """The model's efficiency for one of the DDP benchmark's models on ``gpus`` V100 of its DGX-1s, at DDP's
    default buckets and at ``bucket_cap_mb=small_mb`` (an explicit cap: the first bucket as large as the others)."""
    import dataclasses

    case = dataclasses.replace(_ddp_benchmark_case(model, model), gpus=gpus)
    small = dataclasses.replace(case, bucket_mb=small_mb, first_bucket_mb=None)
    return case.predict()["efficiency"], small.predict()["efficiency"]


def validate(cases: tuple[PublishedCase, ...] = CASES) -> list[dict]:
    """Each case's published efficiency beside the model's, the points between them, and the prediction with one
    GPU's compute 25% faster and 25% slower."""
    rows = []
    for case in cases:
        row = case.predict()
        none_hidden, perfect = case.bounds()
        rows.append(
            {
                "case": case.name,
                "source": case.source,
                "gpus": case.gpus,
                "published": case.published_efficiency,
                "predicted": row["efficiency"],
                "overlap": row["overlap"],
                "no_overlap": none_hidden,
                "points_off": 100 * (row["efficiency"] - case.published_efficiency),
                "points_off_no_overlap": 100 * (none_hidden - case.published_efficiency),
                "perfect_overlap": perfect,
                "ddp_share": row["ddp_s"] / row["step_s"],
                "slowdown_share": row["slowdown_s"] / row["step_s"],
                "fitted_here": case.fitted_here,
                "compute_range": (case.predict(0.75)["efficiency"], case.predict(1.25)["efficiency"]),
                "algorithm": row["algorithm"],
                "nccl_version": case.nccl_version,
                "assumed": case.assumed,
                "inputs": case.inputs,
            }
        )
    return rows


def format_validation(rows: list[dict]) -> str:
    """The validation as a Markdown table: each case's estimate beside the published figure, its two bounds (no
    overlap; all the backward pass can hide, hidden for free), the two terms beside the communication as shares of
    the estimated step, and what the estimate rests on."""
    return markdown_table(
        [
            "case",
            "GPUs",
            "published",
            "estimate",
            "points off",
            "bounds: no overlap to perfect overlap",
            "DDP's own cost",
            "overlap slow-down",
            "overlap (estimated)",
            "compute ±25%",
            "algorithm",
        ],
        [
            (
                f"{r['case']} ({r['source']})" + (" †" if r["fitted_here"] else ""),
                r["gpus"],
                f"{r['published']:.1%}",
                f"{r['predicted']:.1%}",
                f"{r['points_off']:+.1f}",
                f"{r['no_overlap']:.1%} to {r['perfect_overlap']:.1%}"
                + ("" if r["no_overlap"] - 1e-9 <= r["published"] <= r["perfect_overlap"] + 1e-9 else " (outside)"),
                f"{r['ddp_share']:.1%}",
                f"{r['slowdown_share']:.1%}",
                f"{r['overlap']:.0%}",
                f"{r['compute_range'][0]:.0%}-{r['compute_range'][1]:.0%}",
                r["algorithm"] + ("" if r["nccl_version"] == NCCL_VERSION else f" (NCCL {r['nccl_version']})"),
            )
            for r in rows
        ],
    )
