"""Per-preset defaults of a decision: which metric decides and each metric's equivalence margin,
chosen from the preset's committed seed-variance reference (reference/seed_variance/<preset>.json)
and its test set by one rule (docs/decisions.md, "Per-preset defaults"): a margin is the largest of
the generic one, one test item's worth (rates) and SEED_SD_MULTIPLE run SDs; the decided metric is
the first of PREFERRED not within FLOOR_ITEMS test items of 0 or 1. A preset with no reference
gets group top-1 and the generic margins; a margin given below the floors is kept, and said to be
below them (below_floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from pipeline.stats.metrics import METRICS

# The generic margins, in each metric's units, for a preset without a reference (and the least a
# referenced one gets): retrieval rates one percentage point; cosine and mse of the order of one
# seed's spread of the default preset.
GENERIC_MARGINS: dict[str, float] = {
    "cosine": 0.002,
    "mse": 0.00002,
    "top1": 0.01,
    "top5": 0.01,
    "group_top1": 0.01,
    "group_top5": 0.01,
    "mrr": 0.01,
}
RATE_METRICS = ("top1", "top5", "group_top1", "group_top5", "mrr")  # in [0, 1], one value per item
SEED_SD_MULTIPLE = 2.5  # margin >= this many run SDs (see the module doc; docs/decisions.md)
FLOOR_ITEMS = 3  # a rate within this many items of 0 or 1 is at its floor (or ceiling)
PREFERRED = ("group_top1", "mrr", "cosine")  # the decided metric: the first not at its floor
DEFAULT_METRIC = PREFERRED[0]


@dataclass
class PresetDefaults:
    preset: str
    metric: str
    margins: dict[str, float]
    why: dict[str, str] = field(default_factory=dict)  # per metric, how its margin was chosen
    metric_why: str = ""
    reference: str | None = None  # the reference file they come from

    def as_dict(self) -> dict:
        return {
            "preset": self.preset,
            "metric": self.metric,
            "metric_why": self.metric_why,
            "margins": self.margins,
            "margin_why": self.why,
            "reference": self.reference,
        }


def _round_up(x: float) -> float:
    """x rounded up to 2 significant digits (a margin is read by people)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.ceil(x / scale - 1e-9) * scale:.2g}")


def floors(ref, metric: str) -> dict[str, float]:
    """The floors a margin of `metric` should not go below on the reference's preset: one test
    item's worth (rates) and SEED_SD_MULTIPLE run SDs."""
    out = {}
    if metric in RATE_METRICS and ref.items:
        out["one test item"] = 1.0 / ref.items
    var = ref.metrics.get(metric)
    if var is not None:
        out[f"{SEED_SD_MULTIPLE:g} run SDs"] = SEED_SD_MULTIPLE * var.run_sd
    return out


def at_floor(ref, metric: str) -> bool:
    """A rate whose reference mean is within FLOOR_ITEMS items of 0 or 1: it cannot move."""
    if metric not in RATE_METRICS or metric not in ref.per_seed or not ref.items:
        return False
    mean = sum(ref.per_seed[metric]) / len(ref.per_seed[metric])
    hits = mean * ref.items
    return hits < FLOOR_ITEMS or ref.items - hits < FLOOR_ITEMS


def preset_defaults(preset: str, references: Sequence | None = None) -> PresetDefaults:
    """The preset's decided metric and margins (the module doc's rule); generic without a reference."""
    if references is None:
        from pipeline.stats.seed_variance import load_references

        references = load_references()
    ref = next((r for r in references if r.preset == preset), None)
    if ref is None:
        return PresetDefaults(
            preset,
            DEFAULT_METRIC,
            dict(GENERIC_MARGINS),
            {m: "generic (no seed-variance reference for this preset)" for m in METRICS},
            f"{DEFAULT_METRIC}: the headline metric (no reference to check it against)",
        )
    margins, why = {}, {}
    for m in METRICS:
        found = floors(ref, m)
        margin = max([GENERIC_MARGINS[m], *found.values()])
        margins[m] = _round_up(margin)
        parts = [f"generic {GENERIC_MARGINS[m]:g}", *(f"{k} {v:.3g}" for k, v in found.items())]
        why[m] = f"the largest of {', '.join(parts)} ({ref.items} test items, {len(ref.seeds)} seeds)"
    metric = next((m for m in PREFERRED if not at_floor(ref, m)), "cosine")
    skipped = [m for m in PREFERRED[: PREFERRED.index(metric)]]
    metric_why = f"{metric}: " + (
        "; ".join(
            f"{m} is at its floor on {preset} (mean {sum(ref.per_seed[m]) / len(ref.per_seed[m]):.4g}, "
            f"{sum(ref.per_seed[m]) / len(ref.per_seed[m]) * ref.items:.1f} of {ref.items} test items)"
            for m in skipped
        )
        or "the headline metric, not at its floor on this preset"
    )
    return PresetDefaults(preset, metric, margins, why, metric_why, ref.shown_path)


def below_floor(preset_ref, metric: str, margin: float) -> str | None:
    """In words, why `margin` is below the preset's floors for `metric`; None when it is not."""
    if preset_ref is None:
        return None
    low = {k: v for k, v in floors(preset_ref, metric).items() if margin < v * 0.999}
    if not low:
        return None
    listed = ", ".join(f"{k} ({v:.3g})" for k, v in low.items())
    return (
        f"the margin {margin:g} on {metric} is below {listed} on the {preset_ref.preset} preset: "
        "'equivalent' is then out of reach or reached by chance"
    )
