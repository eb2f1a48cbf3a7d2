import json

import numpy as np
import pytest
import torch

from dlscale.data import (
    DataError,
    FieldSpec,
    ShardDataset,
    denormalize_targets,
    generate_dataset,
    generate_fields,
    make_loader,
    normalize_targets,
    prepare_data,
    write_shards,
)
from dlscale.data.synthetic import _wavenumbers


def test_generation_is_deterministic_per_seed():
    spec = FieldSpec(image_size=16)
    a, pa = generate_fields(8, spec, np.random.default_rng(1))
    b, pb = generate_fields(8, spec, np.random.default_rng(1))
    c, _ = generate_fields(8, spec, np.random.default_rng(2))
    assert a.dtype == np.float32 and a.shape == (8, 1, 16, 16)
    assert np.array_equal(a, b) and np.array_equal(pa, pb)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("log_amp, index, blur", [(0.5, 1.5, 0.3), (-0.5, 3.0, 1.2)])
def test_maps_have_the_requested_power_spectrum(log_amp, index, blur):
    """The measured P(k) of noiseless maps follows A·(k/k_pivot)^-n times the blur's exp(-(2π k σ / N)²):
    with the blur divided out, slope -n and value A at the pivot; with it left in, the fit fails."""
    spec = FieldSpec(
        image_size=64,
        log_amplitude_range=(log_amp, log_amp),
        spectral_index_range=(index, index),
        blur_range=(blur, blur),
        noise=0.0,
    )
    maps, params = generate_fields(200, spec, np.random.default_rng(0))
    assert np.all(params[:, 2] == blur)
    power = (np.abs(np.fft.rfft2(maps[:, 0])) ** 2).mean(0) / 64**2
    k = _wavenumbers(64)
    shells = np.arange(2, 17)
    measured = np.array([power[np.round(k) == s].mean() for s in shells])
    blurred = np.array([np.exp(-((2 * np.pi * k[np.round(k) == s] * blur / 64) ** 2)).mean() for s in shells])
    raw_slope, _ = np.polyfit(np.log(shells / spec.k_pivot), np.log(measured), 1)
    slope, intercept = np.polyfit(np.log(shells / spec.k_pivot), np.log(measured / blurred), 1)
    assert raw_slope < slope - 0.05  # the blur steepens the spectrum: what the model must tell apart from n
    assert slope == pytest.approx(-index, abs=0.1)
    assert intercept == pytest.approx(log_amp, abs=0.1)


def test_targets_normalise_to_unit_interval_and_back():
    spec = FieldSpec()
    _, params = generate_fields(500, spec, np.random.default_rng(0))
    normed = normalize_targets(params, spec.target_ranges)
    assert normed.min() >= -1 and normed.max() <= 1 and normed.min() < -0.9 and normed.max() > 0.9
    assert np.allclose(denormalize_targets(normed, spec.target_ranges), params, atol=1e-5)


def test_dataset_round_trips_through_shards(in_tmp):
    manifest = generate_dataset("set", FieldSpec(image_size=16), 300, 70, shard_size=128, seed=3, progress=False)
    assert manifest["splits"]["train"]["shards"] == ["shard-00000-x.npy", "shard-00001-x.npy", "shard-00002-x.npy"]
    assert manifest["generation"]["samples_per_s"] > 0
    assert json.loads((in_tmp / "set/manifest.json").read_text())["target_names"] == [
        "log_amplitude",
        "spectral_index",
        "blur",
    ]
    train = ShardDataset("set/train")
    assert len(train) == 300 and train.input_shape == (1, 16, 16) and len(ShardDataset("set/val")) == 70
    # the first shard holds exactly what the generator draws for (seed, split 0, shard 0)
    spec = FieldSpec(image_size=16)
    maps, params = generate_fields(128, spec, np.random.default_rng([3, 0, 0]))
    x, y = train[5]
    assert torch.equal(x, torch.from_numpy(maps[5]))
    assert torch.allclose(y, torch.from_numpy(normalize_targets(params, spec.target_ranges)[5]))
    x_last, _ = train[299]  # the last item of the short third shard
    assert x_last.shape == (1, 16, 16)
    # regenerating gives the same bytes
    generate_dataset("again", spec, 300, 70, shard_size=128, seed=3, progress=False)
    for name in ("train/shard-00002-x.npy", "val/shard-00000-y.npy"):
        assert (in_tmp / "set" / name).read_bytes() == (in_tmp / "again" / name).read_bytes()


@pytest.fixture
def shards(in_tmp):
    generate_dataset("set", FieldSpec(image_size=16), 256, 64, shard_size=64, seed=0, progress=False)
    return in_tmp / "set"


def test_missing_folder_is_one_clear_error(in_tmp):
    with pytest.raises(DataError, match=r"data folder nowhere/train does not exist.*dlscale data generate"):
        ShardDataset("nowhere/train")
    (in_tmp / "empty").mkdir()
    with pytest.raises(DataError, match="holds no shard"):
        ShardDataset("empty")


def test_truncated_shard_is_named(shards):
    path = shards / "train/shard-00002-x.npy"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"shard .*shard-00002-x.npy is truncated or corrupt"):
        ShardDataset(shards / "train")


def test_corrupt_shard_is_named(shards):
    (shards / "train/shard-00001-y.npy").write_bytes(b"this is not a numpy file at all" * 10)
    with pytest.raises(DataError, match=r"shard-00001-y.npy is truncated or corrupt"):
        ShardDataset(shards / "train")


def test_mismatched_shapes_are_named(shards):
    write_shards(
        shards / "train", np.zeros((10, 1, 8, 8), np.float32), np.zeros((10, 2), np.float32), 10, first_index=7
    )
    with pytest.raises(DataError, match=r"shard-00007-x.npy holds maps of shape \(1, 8, 8\).*must match"):
        ShardDataset(shards / "train")


def test_missing_targets_and_count_mismatch_are_named(shards):
    np.save(shards / "train/shard-00001-y.npy", np.zeros((3, 2), np.float32))
    with pytest.raises(DataError, match=r"shard-00001-x.npy has 64 maps but shard-00001-y.npy has 3"):
        ShardDataset(shards / "train")
    (shards / "train/shard-00001-y.npy").unlink()
    with pytest.raises(DataError, match=r"shard .*shard-00001-y.npy is missing"):
        ShardDataset(shards / "train")


def test_loader_gives_each_rank_a_disjoint_share(tiny):
    cfg = tiny(global_batch_size=32)
    root = prepare_data(cfg)
    seen = []
    for rank in range(2):
        loader = make_loader(cfg, rank, 2, "train", data_dir=root)
        loader.sampler.set_position(epoch=0)
        assert loader.batch_size == 16
        seen.append(torch.cat([x for x, _ in loader]))
    assert len(seen[0]) == len(seen[1]) == cfg.train_samples // 2
    flat = [s.flatten(1) for s in seen]
    assert not (torch.cdist(flat[0], flat[1]) == 0).any()  # no map on both ranks
    val = [make_loader(cfg, r, 2, "val", data_dir=root) for r in range(2)]
    assert sum(len(v.dataset) for v in val) == cfg.val_samples  # nothing dropped or repeated


def test_sampler_resumes_mid_epoch(tiny):
    cfg = tiny()
    loader = make_loader(cfg, split="train")
    loader.sampler.set_position(epoch=1)
    full = torch.cat([y for _, y in loader])
    loader.sampler.set_position(epoch=1, start_index=5 * loader.batch_size)
    rest = torch.cat([y for _, y in loader])
    assert torch.equal(rest, full[5 * loader.batch_size :])
    loader.sampler.set_position(epoch=2)
    assert not torch.equal(torch.cat([y for _, y in loader]), full)  # a new order each epoch


def test_user_data_dir_must_exist(tiny):
    with pytest.raises(DataError, match=r"data_dir missing/folder does not exist"):
        prepare_data(tiny(data_dir="missing/folder"))


def test_too_few_samples_for_a_batch(tiny):
    with pytest.raises(DataError, match="fewer than one global batch"):
        make_loader(tiny(train_samples=16, global_batch_size=32, shard_size=16))


def test_the_staging_benchmark_stages_every_shard_and_says_when_staging_pays(tmp_path):
    from dlscale.bench.staging import bench_staging

    source = tmp_path / "set"
    generate_dataset(source, FieldSpec(image_size=8), 64, 16, shard_size=32, progress=False)
    result = bench_staging(source, tmp_path / "packed/set.tar.gz", tmp_path / "local")
    assert sorted(p.relative_to(result["staged"]) for p in result["staged"].rglob("*.npy")) == sorted(
        p.relative_to(source) for p in source.rglob("*.npy")
    )
    assert result["packed_mib"] == (tmp_path / "packed/set.tar.gz").stat().st_size / 2**20
    saving = result["read_packed_s"] - result["read_local_s"]
    if saving > 0:  # staging once costs stage_once_s; each epoch then saves `saving`
        epochs = result["epochs_to_pay_off"]
        assert epochs * saving > result["stage_once_s"] >= (epochs - 1) * saving
    else:
        assert result["epochs_to_pay_off"] is None
