"""The loader benchmark, and staging data to node-local storage (lesson 04's test checks the optimization ladder)."""

import pytest
import torch

from dlscale.bench.loader import bench_loader
from dlscale.data import prepare_data, stage_data
from dlscale.train import train


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_benchmark_times_the_input_pipeline(tiny, workers):
    report = bench_loader(tiny(num_workers=workers), batches=10)
    assert report["samples_per_s"] > 0 and report["batches"] == 10 and report["num_workers"] == workers


def test_staging_copies_once_and_training_reads_the_copy(tiny, in_tmp, monkeypatch):
    cfg = tiny(stage_dir="$NODE_LOCAL/stage", max_steps=3)
    monkeypatch.setenv("NODE_LOCAL", str(in_tmp / "local"))
    source = prepare_data(cfg)
    staged = stage_data(source, cfg.stage_dir)
    assert staged == in_tmp / "local/stage" / source.name
    assert sorted(p.name for p in (staged / "train").iterdir()) == sorted(p.name for p in (source / "train").iterdir())
    marker = staged / "train/shard-00000-x.npy"
    mtime = marker.stat().st_mtime_ns
    assert stage_data(source, cfg.stage_dir) == staged and marker.stat().st_mtime_ns == mtime  # reused, not copied
    result = train(cfg)
    assert result.applied["data_dir"] == str(staged)
    monkeypatch.delenv("NODE_LOCAL")
    with pytest.raises(Exception, match="names an environment variable that is not set"):
        stage_data(source, "$NODE_LOCAL/stage")


def test_a_packed_data_set_is_unpacked_once_to_node_local_storage_and_trained_on(tiny, in_tmp):
    from dlscale.data import pack_data

    source = prepare_data(tiny())
    archive = pack_data(source, in_tmp / "shared/set.tar.gz")
    assert archive.is_file() and not list(archive.parent.glob("*.part"))
    staged = stage_data(archive, str(in_tmp / "local"))
    assert staged == in_tmp / "local/set" and sorted(p.name for p in (staged / "train").iterdir()) == sorted(
        p.name for p in (source / "train").iterdir()
    )
    marker = (staged / "train/shard-00000-x.npy").stat().st_mtime_ns
    assert stage_data(archive, str(in_tmp / "local")) == staged
    assert (staged / "train/shard-00000-x.npy").stat().st_mtime_ns == marker  # unpacked once
    result = train(tiny(data_dir=str(archive), stage_dir=str(in_tmp / "local"), max_steps=2))
    assert result.applied["data_dir"] == str(staged)
    (in_tmp / "notes.txt").write_text("not data")
    with pytest.raises(Exception, match="is a file"):
        stage_data(in_tmp / "notes.txt", str(in_tmp / "local"))


def test_resampling_is_exact_on_the_grid_and_adds_no_blur():
    """The augmentation reads each map from its Fourier series: a quarter turn, a whole-pixel shift and a
    mirror give back the map's own pixels, and a rotation by any angle keeps the small-scale power
    the blur target is read from (a bicubic rotation loses about a fifth of it at the sharpest maps)."""
    import math

    import numpy as np
    import torch.nn.functional as F

    from dlscale.data import FieldSpec, generate_fields
    from dlscale.data.augment import augment_map, resample, sample_rng

    maps, _ = generate_fields(200, FieldSpec(image_size=16, blur_range=(0.3, 0.3)), np.random.default_rng(0))
    x = torch.from_numpy(maps[0])
    assert torch.allclose(resample(x, math.pi / 2), torch.rot90(x, 1, (-2, -1)), atol=1e-5)
    assert torch.allclose(resample(x, shift=(3.0, 5.0)), torch.roll(x, (-3, -5), (-2, -1)), atol=1e-5)
    assert torch.allclose(resample(x, math.pi, mirror=True), torch.rot90(x, 2, (-2, -1)).flip(-1), atol=1e-5)

    def small_scale_power(batch):  # squared neighbour differences away from the edges
        inner = batch[..., 3:-3, 3:-3].double()
        return float(inner.diff(dim=-1).pow(2).mean() + inner.diff(dim=-2).pow(2).mean())

    def bicubic(m, rng):
        angle = rng.uniform(0, 2 * math.pi)
        theta = torch.tensor([[[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0]]])
        grid = F.affine_grid(theta, (1, *m.shape), align_corners=False)
        return F.grid_sample(m[None], grid, mode="bicubic", padding_mode="reflection", align_corners=False)[0]

    batch = torch.from_numpy(maps)
    ours = torch.stack([augment_map(m, sample_rng(0, 0, i)) for i, m in enumerate(batch)])
    theirs = torch.stack([bicubic(m, sample_rng(0, 0, i)) for i, m in enumerate(batch)])
    assert small_scale_power(ours) == pytest.approx(small_scale_power(batch), rel=0.06)
    assert small_scale_power(theirs) < 0.9 * small_scale_power(batch)  # what the exact version avoids


def test_augmentation_changes_each_epoch_and_repeats_exactly(tiny, in_tmp):
    """Per-sample augmentation: a new draw every epoch, the same draw for the same (seed, epoch, index)."""
    from dlscale.data import make_loader
    from dlscale.data.loader import ShardDataset

    cfg = tiny(augment=True)
    root = prepare_data(cfg)
    plain, augmented = ShardDataset(root / "train"), ShardDataset(root / "train", augment_seed=0)
    x, y = plain[7]
    first, y_first = augmented[7]  # epoch 0
    again, _ = augmented[7]
    second, _ = augmented[len(plain) + 7]  # epoch 1
    assert torch.equal(y_first, y) and torch.equal(first, again)
    assert not torch.allclose(first, x) and not torch.allclose(first, second)
    # the map's statistics survive: a shift, mirror and rotation keep its variance to a few per cent
    assert float(first.var()) == pytest.approx(float(x.var()), rel=0.3)
    loader = make_loader(cfg)
    loader.sampler.set_position(1)
    indices = list(loader.sampler)
    assert min(indices) >= len(plain) and max(indices) < 2 * len(plain)  # the epoch travels with the index
    assert make_loader(cfg, split="val").dataset.dataset.augment_seed is None  # validation is never augmented
