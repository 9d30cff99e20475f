"""A run's name when DVC gives it none: the preset and what differs from it, e.g. `default lr=0.001`.

`dvc repro` after an edit of params.yaml, or a stage started by hand with overrides, makes a
model that is not the preset's; naming the run `train` (what the stage is) said nothing about
which model it is. The preset as committed in conf/ is the reference: params.yaml is the default
preset's composition, so an unchanged `dvc repro` is plainly `default`.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.core.config import Config, flatten, load_config
from pipeline.core.config.param import Role, keys_with
from pipeline.core.errors import ConfigError

# Keys that label a run rather than make it (which store, which sweep): never part of its name.
LABEL_KEYS = keys_with(Role.LABEL, Config)
# MLflow keeps 250 characters of a name; the runs table shows about 40. The full list of
# differences is the tag `run.overrides` (store.overrides_tag), so the name may be cut.
MAX_NAME = 80
MAX_VALUE = 32


def differences(cfg: DictConfig) -> dict[str, Any]:
    """`key -> value` for every key of `cfg` that differs from its preset (and fault) as conf/
    composes it, in the config's order ({} when the preset cannot be composed: a params.yaml of one's own)."""
    reference = _reference(tuple(_groups(cfg)))
    if reference is None:
        return {}
    mine = flatten(cfg)
    return {k: v for k, v in mine.items() if k not in LABEL_KEYS and reference.get(k, object()) != v}


@functools.lru_cache(maxsize=8)
def _reference(groups: tuple[str, ...]) -> dict[str, Any] | None:
    """The preset's (and fault's) config as conf/ composes it, flattened; None if it cannot be
    composed. Once per process: a stage names its run and tags its overrides from it."""
    try:
        return flatten(load_config(list(groups)))
    except ConfigError:
        return None


def _groups(cfg: DictConfig) -> list[str]:
    """`preset=<name>`, then `fault=<kind>` for a deliberate fault (conf/fault/)."""
    fault = str(OmegaConf.select(cfg, "fault.kind", default="none"))
    return [f"preset={cfg.run.preset}", *([f"fault={fault}"] if fault != "none" else [])]


def _show(value: Any) -> str:
    if isinstance(value, float):
        text = format(value, "g")
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(",", ":"))
    else:
        text = str(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def short_keys(keys: list[str], all_keys: list[str]) -> dict[str, str]:
    """Each key by its last part where no other key of the config ends the same (`lr` for
    train.lr), else in full (`train.batch_size`: embed has a batch_size too)."""
    leaves = Counter(k.rsplit(".", 1)[-1] for k in all_keys)
    return {k: k.rsplit(".", 1)[-1] if leaves[k.rsplit(".", 1)[-1]] == 1 else k for k in keys}


_PLAIN = re.compile(r"^[A-Za-z0-9_.:/+-]+$")


def _hydra_value(value: Any) -> str:
    """A value as a Hydra override takes it back (`true`, `null`, `0.001`, `[4,8]`, 'a b')."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    text = str(value)
    return text if _PLAIN.match(text) else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_overrides(cfg: DictConfig, diff: dict[str, Any] | None = None) -> str:
    """What makes the run, as the overrides that compose it again: `preset=smoke`, then
    `fault=<kind>` for a deliberate fault, then `key=value` for each difference from the two, keys
    in full (`preset=smoke fault=nan_loss train.epochs=3`)."""
    diff = differences(cfg) if diff is None else diff
    return " ".join([*_groups(cfg), *(f"{k}={_hydra_value(v)}" for k, v in diff.items())])


def run_label(cfg: DictConfig, diff: dict[str, Any] | None = None) -> str:
    """`<preset>`, then `fault=<kind>` for a deliberate fault (conf/fault/), then `key=value` for
    each difference from the two, cut to MAX_NAME characters."""
    diff = differences(cfg) if diff is None else diff
    names = short_keys(list(diff), list(flatten(cfg)))
    label = " ".join([str(cfg.run.preset), *_groups(cfg)[1:], *(f"{names[k]}={_show(v)}" for k, v in diff.items())])
    return label if len(label) <= MAX_NAME else label[: MAX_NAME - 1] + "…"
