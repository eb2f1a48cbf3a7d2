import json

import pytest
import yaml

from dlscale.config import ConfigError, TrainConfig, config_names, load_config


def test_shipped_configs_load_and_inherit():
    assert {"demo", "tiny", "gpu"} <= set(config_names())
    tiny = load_config("tiny")
    assert tiny.name == "tiny" and tiny.image_size == 16
    # inherited from demo (the dataclass defaults), not restated in tiny.yaml
    assert tiny.optimizer == TrainConfig().optimizer


def test_overrides_are_typed_against_fields():
    cfg = load_config("tiny", ["epochs=3", "lr=1e-3", "resume=true", "run_dir=runs/x", "noise=0"])
    assert cfg.epochs == 3 and isinstance(cfg.epochs, int)
    assert cfg.lr == 1e-3 and isinstance(cfg.lr, float)
    assert cfg.resume is True and cfg.run_dir == "runs/x" and cfg.noise == 0.0
    assert load_config(None, {"epochs": 5}).epochs == 5


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'epoch'.*did you mean 'epochs'"):
        load_config("tiny", ["epoch=2"])


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("epochs=three", r"'epochs' expects int, got 'three'"),
        ("epochs=2.5", r"'epochs' expects int"),
        ("lr=fast", r"'lr' expects float"),
        ("resume=maybe", r"'resume' expects bool"),
        ("optimizer=adam", r"'optimizer' must be one of adamw, sgd, lars, larc, lamb; got 'adam'"),
        ("lr_scaling=quadratic", r"'lr_scaling' must be one of none, linear, sqrt"),
        ("warmup_start_factor=2", r"'warmup_start_factor' must be in \[0, 1\]"),
        ("global_batch_size=0", r"'global_batch_size' must be >= 1"),
        ("image_size=48", r"power of two"),
        ("depth=6", r"'depth'=6 halves"),
        ("device=gpu", r"'device' must be one of auto, cpu, cuda"),
        ("epochs", r"not of the form key=value"),
    ],
)
def test_bad_values_name_the_key(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", [override])


def test_yaml_files_inherit_and_errors_name_the_file(tmp_path):
    (tmp_path / "base.yaml").write_text("inherit: tiny\nepochs: 7\nlr: 0.01\n")
    (tmp_path / "child.yaml").write_text("inherit: base\nlr: 0.02\n")
    cfg = load_config(str(tmp_path / "child.yaml"))
    assert (cfg.epochs, cfg.lr, cfg.image_size) == (7, 0.02, 16)

    (tmp_path / "typo.yaml").write_text("inherit: tiny\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*unknown config key 'learning_rate'"):
        load_config(str(tmp_path / "typo.yaml"))
    (tmp_path / "loop.yaml").write_text("inherit: loop\n")
    with pytest.raises(ConfigError, match="inherits from itself"):
        load_config(str(tmp_path / "loop.yaml"))
    (tmp_path / "broken.yaml").write_text("epochs: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(tmp_path / "broken.yaml"))
    with pytest.raises(ConfigError, match="no config named 'nope'"):
        load_config("nope")


def test_saved_config_reloads_identically(tmp_path):
    cfg = load_config("tiny", ["lr=0.005", "name=saved"])
    yaml_path = cfg.save(tmp_path / "config.yaml")
    assert load_config(str(yaml_path)) == cfg
    json_path = cfg.save(tmp_path / "config.json")
    assert TrainConfig(**json.loads(json_path.read_text())) == cfg
    assert yaml.safe_load(yaml_path.read_text())["lr"] == 0.005


def test_per_rank_batch_is_derived_from_the_global_batch():
    cfg = load_config("tiny", ["global_batch_size=64"])
    assert cfg.per_rank_batch(4) == 16
    with pytest.raises(ConfigError, match="does not split evenly over 3 ranks"):
        cfg.per_rank_batch(3)


def test_the_keys_are_flat_outside_and_in_sections_inside():
    """Every key belongs to exactly one section; a section holds the config's values and nothing else, so a builder
    given one section cannot read another's key; the command line and the files stay flat."""
    import dataclasses

    from dlscale.config import FIELDS, SECTION_KEYS

    assert sorted(key for keys in SECTION_KEYS.values() for key in keys) == sorted(FIELDS)
    assert list(SECTION_KEYS) == ["run", "data", "model", "parallel", "training", "optim", "logging"]
    cfg = load_config("tiny", ["lr=3e-3", "width=12", "bucket_cap_mb=5"])
    sections = cfg.sections
    assert (sections.optim.lr, sections.model.width, sections.parallel.bucket_cap_mb) == (3e-3, 12, 5.0)
    for name, keys in SECTION_KEYS.items():
        section = getattr(sections, name)
        assert {f.name for f in dataclasses.fields(section)} == set(keys)
        assert all(getattr(section, key) == getattr(cfg, key) for key in keys)
    with pytest.raises(AttributeError):
        sections.model.lr  # noqa: B018  (the model's builder sees the model's keys only)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sections.optim.lr = 1.0
    assert "lr" in cfg.to_dict() and "optim" not in cfg.to_dict()  # saved flat, as the YAML files are written
