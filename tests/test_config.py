import yaml
import pytest
from omegaconf import OmegaConf

from pipeline.config import CONF_DIR, PARAMS_FILE, Config, flatten, load_config
from pipeline.errors import ConfigError
from pipeline.paths import REPO_ROOT


def keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out |= keys(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "splits" else {f"{prefix}{k}"}
    return out


def test_params_yaml_is_conf_composed_with_the_default_preset():
    # What `dvc exp run` would write must be what `dvc repro` reads, or the two disagree.
    composed = OmegaConf.to_container(load_config(["preset=default"]))
    assert yaml.safe_load(PARAMS_FILE.read_text()) == composed


def test_conf_holds_every_schema_key_and_no_other():
    conf = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    conf.pop("defaults")
    assert keys(conf) == keys(OmegaConf.to_container(OmegaConf.structured(Config)))


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml")))
def test_every_preset_composes_and_validates(preset):
    cfg = load_config([f"preset={preset}"])
    assert cfg.run.preset == preset


def test_overrides_apply_and_are_typed():
    cfg = load_config(["train.lr=0.01", "model.lattice_depth=4"])
    assert cfg.train.lr == 0.01 and cfg.model.lattice_depth == 4
    assert load_config(["preset=smoke", "train.epochs=1"]).train.epochs == 1


@pytest.mark.parametrize("override, named", [
    ("train.lr=abc", "train.lr"),  # wrong type
    ("train.lr=0", "train.lr"),  # impossible value
    ("train.foo=1", "train.foo"),  # unknown key (Hydra refuses to add it)
    ("+train.foo=1", "train.foo"),  # unknown key (schema refuses it)
    ("model.lattice_width=0", "model.lattice_width"),
    ("model.min_forward=0", "model.min_forward"),
    ("embed.splits.val=0.3", "embed.splits"),  # fractions not summing to 1
    ("embed.format=xml", "embed.format"),
    ("train.batch_size=-4", "train.batch_size"),
])
def test_bad_values_stop_with_the_key_named(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config([override])


def test_unknown_key_in_params_file_is_named(tmp_path):
    bad = yaml.safe_load(PARAMS_FILE.read_text())
    bad["model"]["lattice_widht"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"model\.lattice_widht"):
        load_config([], params_file=tmp_path / "params.yaml")


def test_dvc_yaml_params_exist_in_params_yaml():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    params = yaml.safe_load(PARAMS_FILE.read_text())
    flat = set(flatten(OmegaConf.create(params))) | set(params) | {k.rsplit(".", 1)[0] for k in flatten(OmegaConf.create(params))}
    for name, stage in dvc["stages"].items():
        for key in stage.get("params", []):
            assert key in flat, f"stage {name} lists param {key} that params.yaml lacks"
