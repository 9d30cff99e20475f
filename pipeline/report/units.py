"""Every number in the report with its unit: '12.3 MB', '4.2 %', 'step 15', '1.03x', '0.886 (cosine)'.
The unit is read from the evidence or metric key; pure statistics (p-values, R², rho) have none."""

from __future__ import annotations

import math
from typing import Any

# Units of evidence values and metrics, by key (the part after the last "/"): (pattern, unit,
# multiplier), first match wins. "_x" matches a suffix, "x_" a prefix, anything else a substring.
# Every number in the report carries a unit; pure statistics (p-values, R², rho) have none.
UNITS: tuple[tuple[str, str, float], ...] = (
    ("_mb_per_1k_steps", "MB per 1k steps", 1.0),
    ("_mb", "MB", 1.0),
    ("_ms", "ms", 1.0),
    ("_us", "µs", 1.0),  # device_utilisation: mean kernel duration
    ("samples_per_s", "samples/s", 1.0),
    ("seconds", "s", 1.0),
    ("frac_", "%", 100.0),
    ("fraction", "%", 100.0),
    ("duration", "steps", 1.0),  # before "ratio", which it holds
    ("ratio", "x", 1.0),
    ("fail_factor", "x", 1.0),
    ("scale", "(loss scale)", 1.0),
    ("flow_steps", "flow-steps per batch (live flows summed over steps)", 1.0),
    ("median_steps", "flow steps per batch", 1.0),
    ("min_steps", "flow steps per batch", 1.0),
    ("max_steps", "flow steps per batch", 1.0),
    ("step_cap", "flow steps per batch", 1.0),
    ("steps_used", "flow steps per batch", 1.0),
    ("_norm", "(L2 norm)", 1.0),
    ("_rise", "%", 100.0),  # loss_regression: the smoothed loss above its running best, a fraction
    ("regressions", "regression(s)", 1.0),
    ("loss_drop", "%", 100.0),  # learning: the share the training loss fell by
    ("min_drop", "%", 100.0),
    ("seed_reference_seeds", "seeds", 1.0),
    ("loss", "(loss)", 1.0),
    ("_sigma", "std above the trailing mean", 1.0),
    ("cosine", "(cosine)", 1.0),
    ("vs_", "(cosine)", 1.0),
    ("top1", "%", 100.0),
    ("top5", "%", 100.0),
    ("mrr", "(mean reciprocal rank)", 1.0),
    ("rows", "logged rows", 1.0),
)
STEP_NUMBER = ("_step", "first_step", "last_step")  # a step number: "step 15"
PER_STEP = "_per_step"  # a count per training step (host syncs, kernels, ops): not a step number
STEP_COUNTS = frozenset(
    {
        "count",
        "events",
        "total_steps",
        "skipped_total",
        "backoffs",
        "growths",
        "severe",
        "unrecovered",
        "from_events",
        "steps",
        "planned_steps",
        "skipped_steps",
        "spikes",
    }
)


def matches(key: str, pattern: str) -> bool:
    if pattern.startswith("_"):
        return key.endswith(pattern)
    if pattern.endswith("_"):
        return key.startswith(pattern)
    return pattern in key


def unit(key: str) -> tuple[str, float]:
    """(unit, multiplier) for an evidence or metric key; ('', 1.0) for a pure statistic."""
    k = str(key).rsplit("/", 1)[-1]
    if k.endswith(PER_STEP):  # a count per training step: host_syncs_per_step -> "host syncs per step"
        return k.replace("_", " "), 1.0
    if k.endswith(STEP_NUMBER):
        return "step", 1.0
    if k in STEP_COUNTS:
        return "steps", 1.0
    return next(((name, mult) for pattern, name, mult in UNITS if matches(k, pattern)), ("", 1.0))


def fmt_value(key: str, value: Any) -> str:
    """A value with its unit: '12.3 MB', '4.2 %', 'step 15', '1.03x', '0.886 (cosine)'."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt(value)
    name, mult = unit(key)
    if name == "step":
        return f"step {fmt(value)}"
    shown = fmt(value * mult if mult != 1.0 else value)
    if name == "x":
        return f"{shown}x"
    return f"{shown} {name}" if name else shown


def fmt(value: Any) -> str:
    """Numbers short enough to read at a glance: 201.3, 0.0123, 1.2e-45, 12,345."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 0.01:
            return f"{value:.4g}"
        return f"{value:.2e}"
    return str(value)
