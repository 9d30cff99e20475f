"""How a parameter is declared: `param(range, doc, role, stages)` puts its range, one-line meaning,
role and the DVC stages that depend on it in the schema's field, next to its type; its default is
conf/config.yaml's. `parameters()` reads every declaration back, for the one validator
(`check_ranges`), `--help`, the arm (pipeline/core/arm.py), the run's name (run_label.py), the
resume fingerprint (pipeline/train/resume_state.py) and the test of dvc.yaml's `params:` lists."""

from __future__ import annotations

import dataclasses
import enum
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


def matching(pattern: re.Pattern, expected: str, empty_ok: bool = False) -> Range:
    """A string that `pattern` matches whole (`empty_ok`: or "", where "" means none or off)."""
    return Range(expected, lambda v: (empty_ok and v == "") or pattern.fullmatch(v) is not None)


POSITIVE_INT = above(0, "an integer")
FRACTION = within(0, 1, "[]", "a fraction")
# numpy's legacy and torch's generators, and every tool that re-seeds from the value, accept it.
SEED = within(0, 2**32 - 1, "[]", "an integer", "what numpy's and torch's random generators accept")
# A name that is also an MLflow experiment name, a tag value and a command-line word: it starts with
# a letter or digit (an experiment named "-embed" reads as an option), and is short enough that
# MLflow's limits hold with the suffixes the project adds ("-embed").
NAME = matching(
    re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"),
    "a name of letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters",
)
# A path: a file name cannot hold a NUL, and "" would mean the project's root.
PATH = Range("a path (not empty, no NUL character)", lambda v: v != "" and "\0" not in v)
OPTIONAL_PATH = Range('"" (off) or a path (no NUL character)', lambda v: "\0" not in v)
# A column or dotted JSON path of the dataset: one line of text.
FIELD = Range(
    "a column name or dotted JSON path: not empty, one line, at most 256 characters",
    lambda v: 0 < len(v) <= 256 and not any(c in v for c in "\r\n\0"),
)
OPTIONAL_FIELD = Range('null, "" (none) or ' + FIELD.expected, lambda v: v is None or v == "" or FIELD.allows(v))
# The values every field of a type must hold, whatever its own range: a float that is a number, an
# integer a tensor or a generator can hold, text that can be written to YAML, MLflow and a file name.
INT64 = 2**63 - 1


def _type_rule(kind: Any, value: Any) -> str | None:
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if kind is int and isinstance(value, int) and not -INT64 - 1 <= value <= INT64:
        return "an integer that fits in 64 bits"
    if kind is str and isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text that is valid UTF-8"
    return None


class Role(enum.Flag):
    """What a key is to a run besides its value (docs/architecture.md, "Roles"). A key with no role
    makes the run: it is part of the arm (pipeline/core/arm.py), so a new key splits arms until it
    is declared otherwise, rather than silently pooling runs that differ in it as replicates."""

    ARM = 0
    LABEL = enum.auto()  # names a run, makes nothing: in neither a run's name (run_label.py) nor its arm
    OPERATIONAL = enum.auto()  # how or where a run is carried out, not what it computes: out of the arm
    RESUME_NEUTRAL = enum.auto()  # a train key a resumed run may change: out of the checkpoint's fingerprint
    RIVAL = enum.auto()  # makes a learned baseline (pipeline/baselines/), not the model: out of the model's arm


LABEL, OPERATIONAL, RESUME_NEUTRAL, RIVAL = Role.LABEL, Role.OPERATIONAL, Role.RESUME_NEUTRAL, Role.RIVAL


@dataclass(frozen=True)
class Rule:
    """A range that depends on other keys (0 < min_forward <= model.max_forward), checked once every
    value is in its own range: `holds(cfg)`, and `expected(cfg)` says so with the other values."""

    expected: Callable[[DictConfig], str]
    holds: Callable[[DictConfig], bool]

    def check(self, cfg: DictConfig, key: str) -> None:
        if not self.holds(cfg):
            raise refuse(key, OmegaConf.select(cfg, key), self.expected(cfg))


def param(
    range: Range | None = None, doc: str = "", rule: Rule | None = None, role: Role = Role.ARM, stages: tuple = ()
) -> Any:
    """A schema field with no default (conf/config.yaml holds it): its allowed values (`range`, and
    a `rule` that depends on other keys), meaning, role and the dvc.yaml stages that list it
    besides its section's."""
    metadata = {"range": range, "doc": doc, "rule": rule, "role": role, "stages": stages}
    return dataclasses.field(default=MISSING, metadata=metadata)


def section(kind: type, role: Role = Role.ARM, stages: tuple[str, ...] = ()) -> Any:
    """A section of the schema: `role` and `stages` hold for each of its keys (a key adds its own)."""
    return dataclasses.field(default_factory=kind, metadata={"role": role, "stages": stages})


@dataclass(frozen=True)
class Parameter:
    """One leaf of the schema as declared: its dotted key, type, range and meaning."""

    key: str
    type: Any
    range: Range | None
    doc: str
    rule: Rule | None = None
    role: Role = Role.ARM
    stages: frozenset[str] = frozenset()

    @property
    def base_type(self) -> Any:
        """str for Optional[str]: the type a value has when it is not null."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        return args[0] if args else self.type

    @property
    def choices(self) -> type[enum.Enum] | None:
        """The Enum of a choice (train.precision), else None."""
        return self.type if isinstance(self.type, type) and issubclass(self.type, enum.Enum) else None

    @property
    def expected(self) -> str:
        """What a value must be: its type in words, then its range ("an integer; >= 0")."""
        words = {int: "an integer", float: "a number", str: "text", bool: "true or false", dict: "a mapping"}
        kind = words.get(self.base_type, self.type_name)
        kind = f"{kind} or null" if self.base_type is not self.type else kind
        return combined(kind, self.range)

    @property
    def type_name(self) -> str:
        name = getattr(self.base_type, "__name__", str(self.type))
        return f"{name} or null" if self.base_type is not self.type else name


def parameters(
    schema: type, prefix: str = "", role: Role = Role.ARM, stages: frozenset = frozenset()
) -> Iterator[Parameter]:
    """Every leaf parameter of the dataclass tree `schema`, in declaration order, each with its
    sections' roles and stages added to its own."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, key = hints[f.name], f"{prefix}{f.name}"
        own = (role | f.metadata.get("role", Role.ARM), stages | set(f.metadata.get("stages", ())))
        if dataclasses.is_dataclass(kind):
            yield from parameters(kind, f"{key}.", *own)
        else:
            yield Parameter(key, kind, f.metadata.get("range"), f.metadata.get("doc", ""), f.metadata.get("rule"), *own)


def keys_with(role: Role, schema: type) -> frozenset[str]:
    return frozenset(p.key for p in parameters(schema) if p.role & role)


def combined(kind: str, range: Range | None) -> str:
    """ "a finite number" and ">= 0" as "a finite number >= 0"; a range that says the kind itself alone."""
    if range is None:
        return kind
    if range.expected.startswith((">", "<", "in ")):
        return f"{kind} {range.expected}"
    return range.expected if range.expected.startswith(kind) else f"{kind}; {range.expected}"


def refuse(key: str, value: Any, expected: str) -> ConfigError:
    """The one wording of a refused value: "parameter 'train.lr' = 0.0: expected a finite number > 0"
    ("parameter 'embed.dataset' is empty: expected ..." for "", which a repr shows as a bare '')."""
    shown = " is empty" if isinstance(value, str) and value == "" else f" = {_shown(value)}"
    return ConfigError(f"parameter '{key}'{shown}: expected {expected}")


def _shown(value: Any, limit: int = 80) -> str:
    """The value as written, cut to `limit` characters: a 500-character name is not echoed whole."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-10:]} ({len(str(value))} characters)"


def check_ranges(cfg: DictConfig, schema: type) -> None:
    """Each value against its type's rule and its declared range, in declaration order; the first
    outside them stops."""
    for p in parameters(schema):
        value = OmegaConf.select(cfg, p.key)
        wrong = _type_rule(p.base_type, value)
        if wrong:
            raise refuse(p.key, value, combined(wrong, p.range))
        if p.range is not None and not p.range.allows(value):
            raise refuse(p.key, value, p.range.expected)


def check_rules(cfg: DictConfig, schema: type) -> None:
    """Each rule between keys, in declaration order, once every value is in its own range."""
    for p in parameters(schema):
        if p.rule is not None:
            p.rule.check(cfg, p.key)
