# recipes/03_mixed_precision.py: written from notebooks/03_mixed_precision.ipynb by `dlscale recipes`; edit the lesson's cell
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 03 of the recipe (lesson 03).

Copy it, with training_tools.py beside it, into your own project: only the data set comes from dlscale
(any Dataset of (input, target) pairs will do). Each stage logs the loss and samples/s per block of
steps and resumes from its checkpoint; each later stage adds one capability (`diff` two stages).
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm:

    python recipes/03_mixed_precision.py --epochs 2 --precision bf16
"""
from typing import Literal

import torch
from torch import nn
from torch.utils.data import DataLoader

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
# the plumbing every stage shares, plain PyTorch in this folder: the device, logged losses and samples/s, checkpoints
from training_tools import Progress, load_checkpoint, parse_args, pick_device, save_checkpoint


def make_model(width: int = 8, depth: int = 2, outputs: int = 3) -> nn.Sequential:
    """Blocks of two 3x3 convolutions (group norm, ReLU) and a 2x2 max-pool, then a small MLP head."""
    channels = [1] + [width * 2 ** i for i in range(depth)]
    layers = []
    for c_in, c_out in zip(channels, channels[1:]):
        for c in (c_in, c_out):
            layers += [nn.Conv2d(c, c_out, 3, padding=1, bias=False), nn.GroupNorm(max(1, c_out // 8), c_out), nn.ReLU()]
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels[-1], 2 * channels[-1]), nn.ReLU(), nn.Linear(2 * channels[-1], outputs))


@torch.no_grad()
def r2_score(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Validation R²: 1 - squared error / variance, per target, averaged over the targets."""
    model.eval()
    ys, preds = zip(*[(y.double(), model(x.to(device)).double().cpu()) for x, y in loader])
    model.train()
    y, pred = torch.cat(ys), torch.cat(preds)
    return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "auto", width: int = 8, depth: int = 2,
         checkpoint: str = "checkpoint.pt", resume: bool = False, log_every: int = 10,
         workers: int = 2, precision: Literal["bf16", "fp16", "fp32"] = "bf16",
         clip: float = 1.0) -> dict:
    device = pick_device(device)
    torch.manual_seed(seed)  # the same initial weights in every run
    train_set, val_set = mini_cosmoflow(config)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")
    val_loader = DataLoader(val_set, batch_size=batch_size, **loading)
    model = make_model(width, depth).to(device)
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    loss_fn = nn.MSELoss()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    # fp16 keeps 5 exponent bits: small gradients underflow to 0 unless the loss is scaled up first.
    # bf16 has fp32's range and needs no scaler; disabled, the scaler's calls pass straight through.
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    run = dict(config=config, batch_size=batch_size, lr=lr, weight_decay=weight_decay, seed=seed, width=width)
    state = load_checkpoint(checkpoint, run, device) if resume else None
    if state:  # the weights, the optimizer's moments, and the epoch to go on from
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    progress, r2 = Progress(log_every, batch_size), []
    for epoch in range(state["epoch"] if state else 0, epochs):
        # a new order every epoch, the same one in every run
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        progress.begin()
        for x, y in DataLoader(train_set, batch_size=batch_size, sampler=order, drop_last=True, **loading):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(x), y)  # matmuls and convolutions in dtype, the loss in fp32
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)
            scaler.update()
            progress.step(loss)
        progress.step()
        r2.append(r2_score(model, val_loader, device))
        save_checkpoint({"run": run, "epoch": epoch + 1, "model": model.state_dict(),
                         "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, checkpoint)
        print(f"epoch {epoch + 1}: training loss {progress.losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    return {"losses": progress.losses, "r2": r2, "throughput": progress.throughput}


if __name__ == "__main__":
    main(**parse_args(main))
