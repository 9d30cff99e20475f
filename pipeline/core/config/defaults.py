"""Where the values live: conf/config.yaml holds every parameter's default, params.yaml what DVC
tracks (conf/config.yaml composed with a preset, by `dvc exp run -S preset=NAME` or by hand)."""

from __future__ import annotations

import copy
import functools

from omegaconf import DictConfig, OmegaConf

from pipeline.core.config.schema import Config
from pipeline.core.errors import ConfigError
from pipeline.core.paths import REPO_ROOT

PARAMS_FILE = REPO_ROOT / "params.yaml"
CONF_DIR = REPO_ROOT / "conf"
PRIMARY = CONF_DIR / "config.yaml"
CONFIG_GROUPS = ("preset", "fault")  # conf/<group>/<name>.yaml, chosen with `group=name`


def default_values() -> DictConfig:
    """Every parameter's default, as conf/config.yaml writes it, typed by the schema (a new copy
    each call: the caller may change it)."""
    if not PRIMARY.is_file():
        raise ConfigError(f"{PRIMARY} not found: run from a checkout of the project")
    stat = PRIMARY.stat()
    return copy.deepcopy(_typed(stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _typed(mtime_ns: int, size: int) -> DictConfig:
    """conf/config.yaml parsed and typed by the schema, once per version of the file: parsing and
    typing it was most of a load's time, and every load and every refusal message asks for it."""
    values = OmegaConf.to_container(OmegaConf.load(PRIMARY))
    values.pop("defaults", None)  # Hydra's list of config groups, not a parameter
    return OmegaConf.merge(OmegaConf.structured(Config), values)
