"""Every arm of the model experiment against the baseline of record: what the MLflow UI shows
beside the raw means, so that no table invites a choice by them (pipeline/tracking/arms.py logs
it; docs/mlflow.md, "Decisions and arms"). The baseline of record is an arm: by default the
committed default run's (the item table at HEAD), or any `./dev compare` side the user names; each
arm's headline metrics get their means and differences from it with intervals over the items and
the seeds, as `./dev compare` takes them."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.stats.decision import CONFIDENCE, ArmRuns, arm_interval, compare_metric, luck_for
from pipeline.stats.item_sources import CompareError, Source, load, mlflow_table, predictor_table, shared_values
from pipeline.stats.metrics import round6
from pipeline.stats.seed_variance import matching_references
from pipeline.stats.sweep import Arm, SweepRun, group_arms

HEADLINE = ("group_top1", "cosine")  # the model runs' headline metrics (metrics/eval.json)
DEFAULT_BASELINE = "HEAD"  # the committed default run


@dataclass
class Baseline:
    digest: str
    name: str
    spec: str  # what named it
    source: Source | None  # the item table that named it (used when the store has no run of it)


def model_runs(client, experiment_id: str) -> list[SweepRun]:
    """The experiment's model runs that hold an item table, with it (the others are not evaluated)."""
    from mlflow.utils import get_results_from_paginated_fn

    def page(n, token):
        return client.search_runs([experiment_id], "tags.stage = 'train'", max_results=n, page_token=token)

    out = []
    for r in get_results_from_paginated_fn(page, 1000):
        run = SweepRun(
            r.data.tags.get("dvc.exp_name", r.info.run_name or ""),
            r.info.run_id,
            r.info.run_name or "",
            r.info.status,
            dict(r.data.params),
            tags=dict(r.data.tags),
        )
        try:
            found = mlflow_table(client, run.run_id)
        except CompareError:
            found = None
        if found is not None and found[1] is not None:
            run.table, run.meta = found
            out.append(run)
    return out


def baseline_of_record(spec: str = DEFAULT_BASELINE) -> Baseline:
    source = load(spec)
    if source.meta is None:
        raise CompareError(f"the baseline {spec!r}: its item table carries no arm (made by an older version)")
    return Baseline(source.meta.arm_digest, source.meta.arm_name, spec, source)


def _values(*arms: list[Source]) -> tuple[list[str], list[dict]]:
    return shared_values([[predictor_table(s) for s in sources] for sources in arms])


def _source(run: SweepRun) -> Source:
    return Source(run.run_id, run.run_name, "mlflow-run", "", run.table, meta=run.meta)


def against_baseline(runs: list[SweepRun], baseline: Baseline, *, resamples: int, seed: int) -> list[dict]:
    """One row per arm: its runs, each headline metric's mean and interval, and its difference
    from the baseline (the baseline's own row has no difference)."""
    arms = group_arms(runs)
    base = next((a for a in arms if a.digest == baseline.digest), None)
    base_sources = [_source(r) for r in base.runs] if base else [baseline.source]
    rows = []
    for arm in arms:
        sources = [_source(r) for r in arm.runs]
        is_base = arm.digest == baseline.digest
        ids, (values, base_values) = _values(sources, base_sources)
        compared = bool(ids) and not is_base
        if not ids:  # another test split (another preset's data): its own means, no difference
            ids, (values,) = _values(sources)
        # The digests tell luck_for which committed reference covers each arm (only its own).
        x = ArmRuns(arm.name, [r.seed for r in arm.runs], values, arm=arm.digest)
        metas = [r.meta for r in arm.runs] + ([s.meta for s in base_sources] if compared else [])
        seeds = [s.seed for s in base_sources]
        b = ArmRuns(baseline.name, seeds, base_values, arm=baseline.digest) if compared else None
        luck = luck_for(*([b] if b else []), x, references=matching_references(metas))
        row = _row(arm, ids, luck)
        if not compared and not is_base:
            row["not_comparable"] = "no test item shared with the baseline (another test split)"
        for m in HEADLINE:
            var = luck.seed.get(m) if luck.covers_seeds else None
            mean, low, high = arm_interval(x, m, var, CONFIDENCE, resamples=resamples, seed=seed)
            row["means"][m] = {"value": round6(mean), "ci_low": round6(low), "ci_high": round6(high)}
            if b is not None:
                d = compare_metric(b, x, m, luck, CONFIDENCE, resamples=resamples, seed=seed)
                row["vs_baseline"][m] = d.as_dict()
        rows.append(row)
    return rows


def _row(arm: Arm, ids: list[str], luck) -> dict:
    return {
        "arm": {"digest": arm.digest, "name": arm.name},
        "run_ids": [r.run_id for r in arm.runs],
        "seeds": [r.seed for r in arm.runs],
        "items": len(ids),
        "covers": luck.describe(),
        "covers_seeds": luck.covers_seeds,
        "means": {},
        "vs_baseline": {},
    }
