# recipes/01_baseline.py
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 01 of the recipe (lesson 01).

Copy it into your own project: only the data set comes from dlscale (any Dataset of (input,
target) pairs will do). Each later stage adds one capability; `diff` two stages to see it.

    python recipes/01_baseline.py --epochs 2
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files


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
def r2_score(model: nn.Module, loader: DataLoader, device: str) -> float:
    """Validation R²: 1 - squared error / variance, per target, averaged over the targets."""
    model.eval()
    ys, preds = zip(*[(y.double(), model(x.to(device)).double().cpu()) for x, y in loader])
    model.train()
    y, pred = torch.cat(ys), torch.cat(preds)
    return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "cuda" if torch.cuda.is_available() else "cpu",
         checkpoint: str = "checkpoint.pt") -> dict:
    torch.manual_seed(seed)  # the same initial weights in every run
    train_set, val_set = mini_cosmoflow(config)
    val_loader = DataLoader(val_set, batch_size=batch_size)
    model = make_model().to(device)
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    loss_fn = nn.MSELoss()
    losses, r2 = [], []
    for epoch in range(epochs):
        # a new order every epoch, the same one in every run
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        for x, y in DataLoader(train_set, batch_size=batch_size, sampler=order, drop_last=True):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        r2.append(r2_score(model, val_loader, device))
        torch.save({"epoch": epoch + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
        print(f"epoch {epoch + 1}: training loss {losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    return {"losses": losses, "r2": r2}


def parse_args() -> dict:
    parser = argparse.ArgumentParser(description="Train the lesson's CNN in plain PyTorch.")
    parser.add_argument("--config", default="tiny", help="the data set's size: a dlscale config (tiny, demo)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    return vars(parser.parse_args())


if __name__ == "__main__":
    main(**parse_args())
