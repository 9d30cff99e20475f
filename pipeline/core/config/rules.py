"""Rules between parameters: the ranges that depend on another value, checked after every value
is in its own range (pipeline/core/config/schema.py). Each names the one key an error points at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from pipeline.core.config.choices import FaultKind
from pipeline.core.config.param import refuse

SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class Rule:
    """`key`'s value must satisfy `holds(cfg)`; `expected(cfg)` says so, with the other values."""

    key: str
    expected: Callable[[DictConfig], str]
    holds: Callable[[DictConfig], bool]

    def check(self, cfg: DictConfig) -> None:
        if not self.holds(cfg):
            raise refuse(self.key, OmegaConf.select(cfg, self.key), self.expected(cfg))


class SplitFractions:
    """embed.splits: a fraction per split name, train, val and test among them, summing to 1."""

    key = "embed.splits"

    @staticmethod
    def expected(cfg: DictConfig) -> str:
        return "fractions for train, val and test, each > 0, summing to 1"

    @staticmethod
    def check(cfg: DictConfig) -> None:
        splits = cfg.embed.splits
        if not isinstance(splits, DictConfig):
            raise refuse("embed.splits", splits, "a mapping of split names to fractions")
        fractions: dict[str, Any] = dict(splits)
        if not set(fractions) >= set(SPLIT_NAMES):
            raise refuse("embed.splits", fractions, "fractions for train, val and test")
        for name, frac in fractions.items():
            if not (isinstance(frac, (int, float)) and 0 <= frac <= 1):
                raise refuse(f"embed.splits.{name}", frac, "a fraction in [0, 1]")
        if not abs(sum(fractions.values()) - 1) < 1e-6:
            raise refuse("embed.splits", fractions, "fractions summing to 1")
        for name in SPLIT_NAMES:
            if not fractions[name] > 0:
                raise refuse(
                    f"embed.splits.{name}",
                    fractions[name],
                    "> 0: train learns from train, is guided by val, and evaluate scores test",
                )


RULES = (
    SplitFractions(),
    Rule(
        "model.min_forward",
        lambda c: f"0 < min_forward <= model.max_forward ({c.model.max_forward})",
        lambda c: 0 < c.model.min_forward <= c.model.max_forward,
    ),
    Rule(
        "train.grad_warning",
        lambda c: f"0 < grad_warning < train.grad_critical ({c.train.grad_critical})",
        lambda c: 0 < c.train.grad_warning < c.train.grad_critical,
    ),
    # A checkpoint must close a telemetry row, so a resumed run's telemetry continues where it was.
    Rule(
        "train.checkpoint_every",
        lambda c: (
            f"0 (off) or a multiple of train.log_every ({c.train.log_every}), so a checkpoint closes a telemetry row"
        ),
        lambda c: c.train.checkpoint_every >= 0 and c.train.checkpoint_every % c.train.log_every == 0,
    ),
    Rule(
        "fault.factor",
        lambda c: "a whole number of host reads per micro-batch with fault=sync_bound (e.g. 40)",
        lambda c: c.fault.kind != FaultKind.sync_bound or c.fault.factor == int(c.fault.factor),
    ),
    Rule(
        "report.grad_healthy_min",
        lambda c: f"0 < grad_healthy_min < train.grad_warning ({c.train.grad_warning})",
        lambda c: 0 < c.report.grad_healthy_min < c.train.grad_warning,
    ),
    Rule(
        "report.device_busy_fail",
        lambda c: (
            f"a fraction in [0, report.device_busy_warn ({c.report.device_busy_warn})] (the GPU's busy share "
            "below which the check fails)"
        ),
        lambda c: 0 <= c.report.device_busy_fail <= c.report.device_busy_warn,
    ),
)


def check_rules(cfg: DictConfig) -> None:
    for rule in RULES:
        rule.check(cfg)


def rules_for(key: str) -> list[Rule | SplitFractions]:
    return [r for r in RULES if r.key == key]
