"""How a parameter is declared: `param(range, doc)` puts its range and one-line meaning in the
schema's field, next to its type; its default is conf/config.yaml's. `parameters()` reads every
declaration back, for the one validator (`check_ranges`) and for `--help`."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from omegaconf import MISSING, DictConfig, OmegaConf

from pipeline.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """The values a parameter allows, and the words an error uses for them."""

    expected: str
    allows: Callable[[Any], bool]


def _words(noun: str, relation: str, why: str) -> str:
    return f"{noun + ' ' if noun else ''}{relation}{f' ({why})' if why else ''}"


def above(bound: float, noun: str = "", why: str = "") -> Range:
    return Range(_words(noun, f"> {bound}", why), lambda v: v > bound)


def at_least(bound: float, noun: str = "", why: str = "") -> Range:
    return Range(_words(noun, f">= {bound}", why), lambda v: v >= bound)


def finite_above(bound: float, noun: str, why: str = "") -> Range:
    return Range(_words(noun, f"> {bound}", why), lambda v: v > bound and math.isfinite(v))


def within(low: float, high: float, ends: str = "[]", noun: str = "", why: str = "") -> Range:
    """`ends` as an interval writes them: "[]" closed, "()" open, "(]" / "[)" half-open."""
    opened, closed = ends

    def allows(v: Any) -> bool:
        return (low < v if opened == "(" else low <= v) and (v < high if closed == ")" else v <= high)

    return Range(_words(noun, f"in {opened}{low}, {high}{closed}", why), allows)


def matching(pattern: re.Pattern, expected: str) -> Range:
    return Range(expected, lambda v: pattern.fullmatch(v) is not None)


POSITIVE_INT = above(0, "an integer")
FRACTION = within(0, 1, "[]", "a fraction")


def param(range: Range | None = None, doc: str = "") -> Any:
    """A schema field with no default (conf/config.yaml holds it): its allowed values and meaning."""
    return dataclasses.field(default=MISSING, metadata={"range": range, "doc": doc})


@dataclass(frozen=True)
class Parameter:
    """One leaf of the schema as declared: its dotted key, type, range and meaning."""

    key: str
    type: Any
    range: Range | None
    doc: str

    @property
    def type_name(self) -> str:
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        name = getattr(args[0] if args else self.type, "__name__", str(self.type))
        return f"{name} or null" if args else name


def parameters(schema: type, prefix: str = "") -> Iterator[Parameter]:
    """Every leaf parameter of the dataclass tree `schema`, in declaration order."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(kind):
            yield from parameters(kind, f"{key}.")
        else:
            yield Parameter(key, kind, f.metadata.get("range"), f.metadata.get("doc", ""))


def refuse(key: str, value: Any, expected: str) -> ConfigError:
    """The one wording of a refused value: "parameter 'train.lr' = 0.0: expected a finite number > 0"."""
    return ConfigError(f"parameter '{key}' = {value!r}: expected {expected}")


def check_ranges(cfg: DictConfig, schema: type) -> None:
    """Each value against its declared range, in declaration order; the first outside it stops."""
    for p in parameters(schema):
        value = OmegaConf.select(cfg, p.key)
        if p.range is not None and not p.range.allows(value):
            raise refuse(p.key, value, p.range.expected)
