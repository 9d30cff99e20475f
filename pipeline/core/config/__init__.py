"""Configuration: each parameter's facts in one place (docs/architecture.md, "Configuration: one
home per parameter"), loaded and checked before a stage works.

A stage composes `params.yaml` (what DVC tracks), or `conf/` when `preset=NAME` or `fault=NAME` is
given, with Hydra (compose.py), applies command-line overrides in Hydra's grammar
(`train.lr=0.01`), and merges the result onto the schema (schema.py), so an unknown key, a wrong
type or an impossible value stops the stage before any work, naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException

from pipeline.core.config.choices import DataFormat, EmptyText, FaultKind, Precision, ShardDtype, SplitKey, Tracking
from pipeline.core.config.compose import compose_raw
from pipeline.core.config.defaults import CONF_DIR, PARAMS_FILE, default_values
from pipeline.core.config.describe import describe
from pipeline.core.config.messages import choice_message, unknown_key_message
from pipeline.core.config.param import check_ranges, check_rules, parameters, refuse
from pipeline.core.config.schema import (
    MIN_BOOTSTRAP_RESAMPLES,
    MIN_SPIKE_WINDOW,
    SWEEP_NAME,
    Config,
    ReportConfig,
    TrainConfig,
)
from pipeline.core.errors import ConfigError
from pipeline.core.paths import outside_message, outside_project

# What the rest of the project imports from here.
__all__ = [
    "CONF_DIR",
    "MIN_BOOTSTRAP_RESAMPLES",
    "MIN_SPIKE_WINDOW",
    "PARAMS_FILE",
    "SWEEP_NAME",
    "Config",
    "DataFormat",
    "EmptyText",
    "FaultKind",
    "Precision",
    "ReportConfig",
    "ShardDtype",
    "SplitKey",
    "TrainConfig",
    "Tracking",
    "compose_raw",
    "default_values",
    "describe",
    "unknown_key_message",
]


def load_config(overrides: Sequence[str] = (), params_file: Path | None = None) -> DictConfig:
    """Compose params.yaml (or conf/ when a `preset=` override is given) with Hydra, apply the
    overrides, validate against the schema and return a read-only DictConfig."""
    raw, source = compose_raw(overrides, params_file)
    return validate(raw, source=source)


def validate(raw: Any, source: str = "config") -> DictConfig:
    """Merge onto the typed schema, a key `raw` lacks taking conf/config.yaml's value (unknown key,
    wrong type, not one of a field's choices), then check every value, rule and path."""
    try:
        cfg = OmegaConf.merge(default_values(), raw)
        # Interpolations (${...}, ${oc.env:...}) resolved now, each checked against its type, so a
        # bad one is named here rather than failing wherever the value is first read.
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or _unresolvable(raw) or _interpolated(raw) or "?"
        if isinstance(e, ConfigKeyError) and key != "?":
            raise ConfigError(f"{source}: {unknown_key_message(key)}") from None
        declared = next((p for p in parameters(Config) if p.key == key), None)
        if declared is not None and declared.choices is not None:
            raise ConfigError(choice_message(key, getattr(e, "value", None), declared.choices)) from None
        if declared is not None and hasattr(e, "value") and not isinstance(e, InterpolationResolutionError):
            # a value of the wrong type: what the key takes (an interpolation's as written)
            value = e.value if e.value is not None else _written(raw, key)
            raise refuse(key, value, declared.expected) from None
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{source}: invalid key '{key}': {msg}") from None
    check_ranges(cfg, Config)
    check_rules(cfg, Config)
    _check_paths(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _unresolvable(raw: Any, prefix: str = "") -> str | None:
    """The first key whose interpolation cannot be resolved (OmegaConf.resolve names none)."""
    if not isinstance(raw, DictConfig):
        return None
    for k in raw.keys():
        key = f"{prefix}{k}"
        try:
            node = raw[k]
        except OmegaConfBaseException:
            return key
        found = _unresolvable(node, f"{key}.")
        if found:
            return found
    return None


def _interpolated(raw: Any, prefix: str = "") -> str | None:
    """The first key whose value is an interpolation (${...}): when one resolves to a value its
    key cannot hold (`embed.splits=${train.lr}`, a number for a mapping), OmegaConf names no key."""
    if not isinstance(raw, DictConfig):
        return None
    for k in raw.keys():
        key = f"{prefix}{k}"
        if OmegaConf.is_interpolation(raw, k):
            return key
        found = _interpolated(raw._get_node(k), f"{key}.")  # noqa: SLF001 - the node, unresolved
        if found:
            return found
    return None


def _written(raw: Any, key: str) -> Any:
    """The value at `key` as written, an interpolation unresolved (None if there is none)."""
    node = raw
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        node = node._get_node(part)  # noqa: SLF001 - the node, unresolved
    return node._value() if hasattr(node, "_value") else None  # noqa: SLF001


PATH_KEYS = ("embed.dataset", "embed.out_dir", "embed.cache_dir", "train.out_dir", "train.checkpoint_dir")
_GLOB = re.compile(r"[*?\[]")


def _check_paths(cfg: DictConfig) -> None:
    """Every path from config inside the project, resolved (`..` and symlinks followed), unless
    run.allow_external_paths: a typo or a hostile params.yaml must not read or overwrite files
    elsewhere. A glob is judged by its part before the first wildcard."""
    if cfg.run.allow_external_paths:
        return
    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key)
        if not value:
            continue  # "" = off (embed.cache_dir)
        parts = Path(value).parts
        fixed = Path(*parts[: next((i for i, p in enumerate(parts) if _GLOB.search(p)), len(parts))] or ["."])
        resolved = outside_project(fixed)
        if resolved is not None:
            raise ConfigError(outside_message(f"parameter '{key}'", value, resolved))
    teacher = teacher_path(cfg.embed.teacher)
    if teacher is not None:
        resolved = outside_project(teacher)
        if resolved is not None:
            raise ConfigError(outside_message("parameter 'embed.teacher'", cfg.embed.teacher, resolved))


def teacher_path(name: str) -> Path | None:
    """embed.teacher as a filesystem path, or None for the bundled teacher or a model name. A path is
    what sentence-transformers would read from disk: an existing file or directory (relative to
    the working directory, as it resolves it), or a name written as a path (absolute, or starting
    with '.' or '~')."""
    if not name or name == "bundled":
        return None
    try:
        path = Path(name).expanduser()
        if path.is_absolute() or name.startswith((".", "~")) or path.exists():
            return path.resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL, a name too long, an unknown ~user: not a path to read
        return None
    return None


def flatten(cfg: DictConfig) -> dict[str, Any]:
    """`a.b.c -> value` for MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    # Choices as their plain strings ("fp16"), as the YAML writes them.
    walk("", OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return out
