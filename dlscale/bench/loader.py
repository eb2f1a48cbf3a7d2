"""``dlscale bench loader``: samples/s of the input pipeline alone, no model (lesson 02)."""

from __future__ import annotations

import time

import torch


def bench_loader(cfg, batches: int = 50, warmup: int = 3, device: str | torch.device | None = None) -> dict:
    """Samples/s of the input pipeline alone (read, collate, copy to the device), no model.

    Compare it with the full training throughput: if the loader alone is not much faster
    than training, the device is starved and waits for data.
    """
    from dlscale.data import make_loader
    from dlscale.runtime.devices import resolve_device

    device = resolve_device(cfg.device) if device is None else torch.device(device)
    loader = make_loader(cfg, split="train", device=device)
    loader.sampler.set_position(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seen, start = 0, None
    for index, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if index == warmup:
            sync()
            start = time.perf_counter()
        elif index > warmup:
            seen += len(x)
        if index >= warmup + batches:
            break
    sync()
    elapsed = time.perf_counter() - start if start else float("nan")
    return {
        "samples_per_s": seen / elapsed if seen else float("nan"),
        "batches": index - warmup,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "batch_size": loader.batch_size,
    }
