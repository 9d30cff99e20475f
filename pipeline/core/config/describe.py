"""Parameter help: each parameter's default (conf/config.yaml), type, range and meaning (the schema)
side by side, for `python -m stages.<name> --help`."""

from __future__ import annotations

from enum import Enum
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.core.config.defaults import default_values
from pipeline.core.config.param import Parameter, parameters
from pipeline.core.config.schema import Config


def describe(sections: str) -> str:
    """One entry per parameter under `sections` ("run, embed.out_dir, model": sections or keys):
    `key = default  (type; range)` and its meaning under it."""
    wanted = [s.strip() for s in sections.split(",") if s.strip()]
    defaults = default_values()
    lines = []
    for p in parameters(Config):
        if not any(p.key == w or p.key.startswith(f"{w}.") for w in wanted):
            continue
        lines.append(f"  {p.key} = {_as_yaml(OmegaConf.select(defaults, p.key))}  ({_kind(p, defaults)})")
        if p.doc:
            lines.append(f"      {p.doc}")
    return "\n".join(lines)


def _kind(p: Parameter, defaults: DictConfig) -> str:
    if p.choices is not None:
        return "one of " + ", ".join(c.name for c in p.choices)
    ranges = ([p.range.expected] if p.range else []) + ([p.rule.expected(defaults)] if p.rule else [])
    return "; ".join([p.type_name, *ranges])


def _as_yaml(value: Any) -> str:
    """The value as YAML writes it: '' for an empty string, null for None, a mapping on one line."""
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value)
    if isinstance(value, Enum):
        value = value.name
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).removesuffix("...\n").strip()
