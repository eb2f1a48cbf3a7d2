"""Write dlscale/scaling/published_layers.json: the layers of the published cases' models, for the bucket schedule.

For each model of docs/scaling-validation.md, every module that holds parameters, in the order the model registers
them (DDP fills its buckets in the reverse of that order, as the backward pass produces the gradients): its
parameter count and its forward floating-point operations on one image, counted by torch's FlopCounterMode on the
meta device (no memory, no kernel). The kit does not depend on torchvision; this script does, and is run by hand
when a case is added:

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch torchvision
    /tmp/tv/bin/python scripts/published_layers.py

(A torchvision wheel built for another torch runs too: only its pure-Python models are used, so its compiled
operators' registration is skipped.)
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "dlscale" / "scaling" / "published_layers.json"

#: name in the JSON: (torchvision builder, its keyword arguments, the input image's side)
MODELS = {
    "resnet50": ("resnet50", {}, 224),
    "resnet101": ("resnet101", {}, 224),
    "inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": False}, 299),
    "vgg16": ("vgg16", {}, 224),
    # (PyTorch's DDP benchmark, benchmarks/distributed/ddp/README.md, runs these two beside ResNet-50 and -101)
    "resnext50_32x4d": ("resnext50_32x4d", {}, 224),
    "resnext101_32x8d": ("resnext101_32x8d", {}, 224),
}


def sc22_unet():
    """The 3-D U-Net of NERSC's SC22 "Deep Learning at Scale" tutorial (NERSC/sc22-dl-tutorial, networks/UNet.py,
    ``full_scale: True``), written here from its published shape: six down-sampling 4x4x4 convolutions of stride 2
    (4 input channels to 64, 128, 256, 512, 512, 512), five up-sampling transposed convolutions that take the
    matching down-sampling output beside their input (512, 512, 256, 128, 64 channels), and a last transposed
    convolution to the 5 output channels, on crops of 64^3 (config/UNet.yaml: ``data_size: 64``)."""
    import torch
    from torch import nn

    class UNet3d(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            down = (4, 64, 128, 256, 512, 512, 512)
            self.down = nn.ModuleList(nn.Conv3d(a, b, 4, stride=2, padding=1) for a, b in zip(down, down[1:]))
            # (input channels: the layer below's output, plus the skip connection's from the second up on)
            ups = ((512, 512), (1024, 512), (1024, 256), (512, 128), (256, 64))
            self.up = nn.ModuleList(nn.ConvTranspose3d(a, b, 4, stride=2, padding=1) for a, b in ups)
            self.last = nn.ConvTranspose3d(128, 5, 4, stride=2, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            skips = []
            for conv in self.down:
                x = nn.functional.leaky_relu(conv(x))
                skips.append(x)
            skips.pop()  # (the deepest output is the first up's input, not a skip)
            for conv in self.up:
                x = torch.cat([nn.functional.relu(conv(x)), skips.pop()], dim=1)
            return torch.tanh(self.last(x))

    return UNet3d()


#: Models that torchvision does not hold: name in the JSON: (builder, the input's shape without the batch)
OWN_MODELS = {"sc22_unet": (sc22_unet, (4, 64, 64, 64))}


def layers(builder, kwargs: dict, side: int | tuple[int, ...]) -> list[list[int]]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        if callable(builder):
            model, image = builder(), torch.empty(1, *side)
        else:
            import torchvision

            model = getattr(torchvision.models, builder)(**kwargs)
            image = torch.empty(1, 3, side, side)
    with FlopCounterMode(display=False) as counter:
        model(image)
    flops = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    rows = []
    prefix = type(model).__name__
    for name, module in model.named_modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if own:
            rows.append([own, int(flops.get(f"{prefix}.{name}", 0))])
    return rows


def main() -> None:
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("skipped"))
    tables = {name: layers(*spec) for name, spec in MODELS.items()}
    tables.update({name: layers(builder, {}, shape) for name, (builder, shape) in OWN_MODELS.items()})
    OUT.write_text(json.dumps(tables, separators=(",", ":")) + "\n")
    for name, rows in tables.items():
        print(f"{name}: {len(rows)} layers, {sum(r[0] for r in rows):,} parameters, {sum(r[1] for r in rows):,} FLOPs")


if __name__ == "__main__":
    main()
