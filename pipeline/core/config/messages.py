"""The errors a mistyped key or choice gets: what was written and what to write instead (OmegaConf's
own messages name neither the parameter nor the alternatives)."""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.core.config.defaults import default_values


def choice_message(key: str, value: Any, choices: type[Enum]) -> str:
    """ "parameter 'train.precision' = 'f16': expected one of auto, fp32, tf32, bf16, fp16 (did you mean
    train.precision=fp16?)"."""
    names = [c.name for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    hint = f" (did you mean {key}={close[0]}?)" if close else ""
    return f"parameter '{key}' = {value!r}: expected one of {', '.join(names)}{hint}"


def unknown_key_message(key: str) -> str:
    """ "unknown key 'embed.foo'; expected one of the keys of 'embed': ..." with the nearest
    spelling when there is one (train.batchsize -> train.batch_size)."""
    section, _, name = key.rpartition(".")
    defaults = default_values()  # (the schema alone has no keys under a mapping such as embed.splits)
    node = OmegaConf.select(defaults, section) if section else defaults
    known = sorted(node.keys()) if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, [k for k in known if k != name], n=1)  # never the key itself
    hint = f" (did you mean '{section + '.' if section else ''}{close[0]}'?)" if close else ""
    where = f"the keys of '{section}'" if section else "the sections"
    return f"unknown key '{key}'{hint}; expected one of {where}: {', '.join(known)}"
