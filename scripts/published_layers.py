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
}


def layers(builder: str, kwargs: dict, side: int) -> list[list[int]]:
    import torch
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
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
    OUT.write_text(json.dumps(tables, separators=(",", ":")) + "\n")
    for name, rows in tables.items():
        print(f"{name}: {len(rows)} layers, {sum(r[0] for r in rows):,} parameters, {sum(r[1] for r in rows):,} FLOPs")


if __name__ == "__main__":
    main()
