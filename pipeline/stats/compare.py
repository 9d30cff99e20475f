"""Two sides compared item by item (`./dev compare A B`): each side one run or replicates of one
arm (item_sources.Side), every metric decided over the items both hold (decision.compare_arms),
with the items whose group top-1 flipped. `./dev decide` reads its final table the same way."""

from __future__ import annotations

import numpy as np

from pipeline.stats.decision import CONFIDENCE, ArmRuns, compare_arms
from pipeline.stats.defaults import preset_defaults
from pipeline.stats.item_sources import TRAINED_BASELINES, CompareError, Side, predictor_table, shared_values
from pipeline.stats.metrics import METRICS, format_interval, format_metric, round6
from pipeline.stats.seed_variance import matching_references

DEFAULT_SHOW = 10
FLIP_METRIC = "group_top1"


def references_for(*sides: Side) -> list:
    """The committed seed-variance references that match a trained side's preset and data."""
    return matching_references(m for side in sides if side.predictor == "model" for m in side.metas)


def compare(
    a: Side,
    b: Side,
    resamples: int,
    seed: int,
    show: int = DEFAULT_SHOW,
    margins: dict[str, float] | None = None,
    level: float = CONFIDENCE,
    references: list | None = None,
) -> dict:
    """Everything `./dev compare` prints, as one JSON-able dict."""
    a.check("A")
    b.check("B")
    tables_a = [predictor_table(s, _predictor(a, s)) for s in a.sources]
    tables_b = [predictor_table(s, _predictor(b, s)) for s in b.sources]
    ids, (values_a, values_b) = shared_values([tables_a, tables_b])
    warnings_ = [*a.warnings, *b.warnings]
    if not ids:
        raise CompareError(
            f"{a.label} and {b.label} share no item id: they were evaluated on different test splits (dataset, "
            "split salt or fractions), so there is nothing to pair"
        )
    sizes = {len(t) for t in tables_a + tables_b}
    if sizes != {len(ids)}:
        warnings_.append(
            f"{a.label} holds {len(tables_a[0])} items and {b.label} {len(tables_b[0])}, of which {len(ids)} are "
            f"shared (different test splits?): the comparison is over the {len(ids)} shared items only"
        )
    if a.predictor == b.predictor and identical(tables_a, tables_b):
        return {
            "a": describe(a, len(tables_a[0])),
            "b": describe(b, len(tables_b[0])),
            "identical": True,
            "shared_items": len(ids),
            "warnings": warnings_,
            "message": (
                f"A ({a.label}) and B ({b.label}) are identical: the same {len(tables_a)} item table(s), value for "
                f"value on all {len(ids)} items. There is nothing to compare (the same run named twice?)."
            ),
        }
    arm_a, arm_b = (
        ArmRuns(
            x.label,
            [s.seed for s in x.sources],
            v,
            deterministic=x.predictor not in ("model", *TRAINED_BASELINES),
            arm=x.arm_digest,
        )
        for x, v in ((a, values_a), (b, values_b))
    )
    refs = references_for(a, b) if references is None else references
    chosen = preset_defaults(a.preset) if a.preset is not None and a.preset == b.preset else None
    margins = {**(chosen.margins if chosen is not None else {}), **(margins or {})}
    decisions, luck = compare_arms(arm_a, arm_b, refs, level, margins, METRICS, resamples=resamples, seed=seed)
    same_arm = a.predictor == b.predictor == "model" and a.arm_digest is not None and a.arm_digest == b.arm_digest
    if same_arm:
        warnings_.append(
            f"A and B are runs of one arm ({a.arm_name} [{a.arm_digest}]), differing only in their seeds: any "
            "difference between them is luck"
        )
    return {
        "a": describe(a, len(tables_a[0])),
        "b": describe(b, len(tables_b[0])),
        "identical": False,
        "same_arm": same_arm,
        "shared_items": len(ids),
        "luck": {
            "covers_seeds": luck.covers_seeds,
            "covers": luck.describe(),
            "sources": luck.sources,
            "references": [r.shown_path for r in refs],
        },
        "margins_from": (
            f"the {chosen.preset} preset's defaults ({chosen.reference})"
            if chosen is not None and chosen.reference
            else "the generic defaults (pipeline/stats/defaults.py)"
        ),
        "level": level,
        "resamples": resamples,
        "seed": seed,
        "difference": "b - a",
        "warnings": warnings_,
        "metrics": with_verdicts(decisions, a.label, b.label, luck.covers_seeds),
        "flipped": flipped(arm_a, arm_b, ids, tables_a[0], show),
    }


def _predictor(side: Side, source) -> str:
    """The predictor of `source` the side compares: a trained baseline's replicate its own (mlp.3)."""
    return source.predictor if side.predictor in TRAINED_BASELINES else side.predictor


def identical(tables_a: list, tables_b: list) -> bool:
    """The same item tables on both sides, value for value (in the order given)."""
    return len(tables_a) == len(tables_b) and all(x.equals(y) for x, y in zip(tables_a, tables_b))


def with_verdicts(decisions: dict, name_a: str, name_b: str, covered: bool) -> dict:
    """Each metric's decision as a dict, with its verdict in words."""
    return {m: {**d.as_dict(), "verdict": verdict_line(d, name_a, name_b, covered)} for m, d in decisions.items()}


def flipped(a: ArmRuns, b: ArmRuns, ids: list[str], texts, show: int) -> dict:
    """Items whose group top-1 flipped: hit by most of A's runs and missed by most of B's, and the
    other way (one run a side: hit by one, missed by the other)."""
    hit_a = a.values[FLIP_METRIC].mean(axis=0)
    hit_b = b.values[FLIP_METRIC].mean(axis=0)
    by_id = texts.set_index("id")
    out: dict = {"metric": FLIP_METRIC}
    for key, mask in (("a_only", (hit_a > 0.5) & (hit_b < 0.5)), ("b_only", (hit_a < 0.5) & (hit_b > 0.5))):
        where = np.flatnonzero(mask)
        out[key] = int(len(where))
        out[f"{key}_items"] = [
            {
                "id": ids[i],
                "input": str(by_id.at[ids[i], "input"]),
                "target": str(by_id.at[ids[i], "target"]),
                "a_hit_rate": round6(hit_a[i]),
                "b_hit_rate": round6(hit_b[i]),
            }
            for i in where[: max(show, 0)]
        ]
    return out


def describe(side: Side, items: int) -> dict:
    return {
        "name": side.spec,
        "label": side.label,
        "predictor": side.predictor,
        "arm": {"digest": side.arm_digest, "name": side.arm_name} if side.arm_digest else None,
        "preset": side.preset,
        "data": side.data,
        "runs": [{"label": s.label, "kind": s.kind, "source": s.description, "seed": s.seed} for s in side.sources],
        "items": items,
    }


def verdict_line(d, name_a: str, name_b: str, covered: bool = True) -> str:
    """The decision in words: "B is better than A on cosine: +0.012 [+0.004, +0.020], P(B better)
    0.99", "... equivalent ...", or "inconclusive on ...: <why>; <what would settle it>"."""
    m = d.metric
    what = m if d.higher_is_better else f"{m} (lower is better)"
    numbers = (
        f"{format_metric(d.difference, m, True)} {format_interval(d.low, d.high, m, True)}, "
        f"P({name_b} better) {d.prob_b_better:.2f}"
    )
    if d.outcome in ("better", "worse"):
        return f"{name_b} is {d.outcome} than {name_a} on {what}: {numbers}"
    if d.outcome == "equivalent":
        return f"{name_b} and {name_a} are equivalent on {what} (within +-{d.margin:g}): {numbers}"
    if not covered:
        return f"inconclusive on {what}: {numbers} (training luck not covered)"
    more = (
        f"about {d.seeds_needed} seeds per arm would likely settle it (./dev decide)"
        if d.seeds_needed
        else "more seeds will not settle it: the test items alone leave it open (more test items, or a wider margin)"
    )
    return f"inconclusive on {what}: {numbers}; {d.why}: {more}"
