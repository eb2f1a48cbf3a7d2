"""``dlscale data generate`` and ``dlscale data check``: the synthetic maps, and a folder of shards checked."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path
from typing import Any

from dlscale.config import load_config


def _data_generate(args: argparse.Namespace) -> int:
    from dlscale.data import FieldSpec, generate_dataset

    cfg = load_config(args.config, args.overrides)
    manifest = generate_dataset(
        args.out,
        FieldSpec(image_size=cfg.image_size, noise=cfg.noise),
        cfg.train_samples,
        cfg.val_samples,
        cfg.shard_size,
        seed=cfg.seed,
        progress=cfg.progress,
        shared=args.shared,
    )
    speed = manifest["generation"]
    print(
        f"wrote {cfg.train_samples} training and {cfg.val_samples} validation maps of "
        f"{cfg.image_size}x{cfg.image_size} to {args.out} in {speed['seconds']:.2f} s "
        f"({speed['samples_per_s']:,.0f} maps/s)"
    )
    print(_who_reads(Path(args.out)))
    return 0


def _who_reads(out: Path) -> str:
    """One line: whether other users can read the data set, and if not, why (its mode, or a folder above it)."""
    mode = stat.S_IMODE(out.stat().st_mode)
    if mode & 0o005 != 0o005:
        return (
            f"{out} has mode {mode:04o}: other users cannot read it (your umask); generate with --shared for a "
            f"data set the room reads"
        )
    closed = next((p for p in out.resolve().parents if stat.S_IMODE(p.stat().st_mode) & 0o001 == 0), None)
    if closed is not None:
        return (
            f"{out} is readable by everyone, but other users cannot pass through {closed} "
            f"(mode {stat.S_IMODE(closed.stat().st_mode):04o}): chmod o+x it, or generate elsewhere"
        )
    return f"{out} is readable by every user of this machine (mode {mode:04o})"


def _data_check(args: argparse.Namespace) -> int:
    from dlscale.data import DataError, ShardDataset, non_finite_values
    from dlscale.data.loader import check_splits

    bad, splits = [], []
    for split in ("train", "val"):
        dataset = ShardDataset(f"{args.data_dir}/{split}")
        splits.append(dataset)
        damaged = [(path, count) for path in (*dataset.x_paths, *dataset.y_paths) if (count := non_finite_values(path))]
        for path, count in damaged:
            print(f"{split}: {path} holds {count:,} NaN or infinite value(s)")
        bad += damaged
        print(
            f"{split}: {len(dataset)} maps of shape {dataset.input_shape}, {dataset.num_targets} targets, "
            f"{len(dataset.x_paths)} shards: {'NOT ok' if damaged else 'ok'}"
        )
    check_splits(*splits, args.data_dir)
    if bad:
        raise DataError(
            f"{len(bad)} shard file(s) in {args.data_dir} hold NaN or infinite values (listed above); "
            f"regenerate or clean them before training, since one such map makes the loss NaN"
        )
    return 0


def add_data(commands: Any) -> None:
    data = commands.add_parser("data", help="generate or check a data folder")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    generate = data_commands.add_parser(
        "generate",
        help="write the synthetic mini-CosmoFlow maps as shards",
        description="Generate the synthetic maps into OUT. Sizes come from the config and its overrides "
        "(image_size, train_samples, val_samples, shard_size, noise, seed).",
        epilog="example: dlscale data generate --out data/big image_size=64 train_samples=65536",
    )
    generate.add_argument("--out", required=True, help="folder to create")
    generate.add_argument("--config", default=None, help="config name or YAML path for the sizes")
    generate.add_argument(
        "--shared",
        action="store_true",
        help="make the data set readable by everyone, whatever your umask (a set generated once for a room); "
        "without it the files get the modes your umask gives",
    )
    generate.add_argument("overrides", nargs="*", metavar="key=value")
    generate.set_defaults(handler=_data_generate)
    check = data_commands.add_parser(
        "check", help="open every shard of a data folder and report damaged, mismatched and non-finite (NaN, inf) ones"
    )
    check.add_argument("data_dir")
    check.set_defaults(handler=_data_check)
