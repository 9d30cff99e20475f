"""Rank the arms of one sweep against its best: `./dev compare --sweep NAME`.

The sweep's model runs are found by their tag `sweep.NAME` in every experiment of the store, each
with its item table; runs that differ only in run.seed are replicates of one arm, and each arm's
mean and difference from the top arm get intervals over the items and the seeds (decision.py).
"best" is said only for a top arm every other arm is worse than. Each arm is also held against the
MLP baseline (pipeline/baselines/): its own, the MLP trained beside its runs (the same size and
training), and the strongest MLP of the sweep (the best recipe any arm gave it), each a decision
over the items and both sides' seeds (`vs_mlp`, `vs_best_mlp`). What the ranking shows and how to
read it: docs/experiments.md ("Ranking"). A run without an item table is left out with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from pipeline.stats.decision import CONFIDENCE, MARGINS, ArmRuns, arm_interval, compare_metric, luck_for
from pipeline.stats.item_sources import (
    MLFLOW_ARTIFACT,
    CompareError,
    Source,
    mlflow_table,
    predictor_table,
    read_client,
    search_runs,
    shared_values,
)
from pipeline.stats.metrics import LOWER_IS_BETTER, METRICS, round6
from pipeline.stats.seed_variance import matching_references

DEFAULT_METRIC = "group_top1"  # the headline retrieval metric (metrics/eval.json)
# Params that are not what a sweep varies between arms: labels (dvc.yaml's header: a run DVC
# restored from its cache into a later sweep was logged under another run.sweep) and the seed
# (runs that differ in it are replicates of one arm).
LABEL_PARAMS = ("run.sweep", "run.experiment", "run.seed")
MISSING = "-"  # a param one run has and another lacks


@dataclass
class SweepRun:
    """One model run of the sweep: its DVC experiment (the tag's value), MLflow run and params."""

    experiment: str
    run_id: str
    run_name: str
    status: str
    params: dict[str, str]
    table: pd.DataFrame | None = None  # the evaluate stage's item table; None when it has none
    missing: str = ""  # why there is no table
    meta: object = None  # the table's metadata (item_tables.TableMeta): arm, seed, preset, data
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def arm(self) -> str:
        """The run's arm: the table's, else the run's tag, else the run alone."""
        if self.meta is not None:
            return self.meta.arm_digest
        return self.tags.get("arm.digest") or f"run:{self.run_id}"

    @property
    def seed(self) -> int | None:
        if self.meta is not None:
            return self.meta.seed
        raw = self.params.get("run.seed")
        return int(raw) if raw not in (None, "") and str(raw).lstrip("-").isdigit() else None


@dataclass
class Found:
    sweep: str
    tag: str
    store: str  # the store searched, as shown (no password)
    runs: list[SweepRun]
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- finding the runs


def find(sweep: str) -> Found:
    """The sweep's model runs in the tracking store, each with its item table (or why not)."""
    from pipeline.core.config import SWEEP_NAME
    from pipeline.tracking import store as tracking

    if not SWEEP_NAME.fullmatch(sweep):
        raise CompareError(
            f"--sweep {sweep!r}: not a sweep name (letters, digits, '.', '_' and '-', as run.sweep takes)"
        )
    tag = f"{tracking.SWEEP_MEMBER_PREFIX}{sweep}"
    client, shown = read_client()
    if client is None:
        raise CompareError(f"no MLflow store at {shown} to look for the sweep {sweep!r} in (no run was tracked there)")
    runs = search_runs(client, shown, f"tags.`{tag}` LIKE '%' and tags.stage = 'train'")
    if not runs:
        others = sorted(
            {r.data.tags.get(tracking.SWEEP_TAG, "") for r in search_runs(client, shown, "tags.sweep LIKE '%'")}
        )
        known = f"sweeps there: {', '.join(o for o in others if o)}" if any(others) else "no run there is in a sweep"
        raise CompareError(
            f"no model run (tags.stage = 'train') in the MLflow store {shown} carries the tag {tag} ({known}). "
            f"A sweep's runs are tagged by the param run.sweep: dvc exp run --queue -S run.sweep={sweep} "
            "-S 'train.lr=1e-3,3e-3' ..., then dvc queue start"
        )
    found = Found(sweep, tag, shown, [])
    names: dict[str, int] = {}
    for r in sorted(runs, key=lambda r: (r.data.tags[tag], r.info.start_time or 0)):
        run = SweepRun(
            experiment=r.data.tags[tag],
            run_id=r.info.run_id,
            run_name=r.info.run_name or "",
            status=r.info.status,
            params=dict(r.data.params),
            tags=dict(r.data.tags),
        )
        names[run.experiment] = names.get(run.experiment, 0) + 1
        try:
            found_table = mlflow_table(client, run.run_id)
        except CompareError as e:
            run.missing = str(e)
        else:
            if found_table is None:
                run.missing = (
                    f"no artifact {MLFLOW_ARTIFACT} (run {run.status}: not evaluated; a diverged, failed or "
                    "still running experiment has none)"
                )
            else:
                run.table, run.meta = found_table
        found.runs.append(run)
    for name, count in sorted(names.items()):
        if count > 1:
            found.warnings.append(
                f"{count} model runs stand for the experiment {name} (the sweep queued again under the same "
                "names?): each is ranked, told apart by its run id"
            )
    return found


# --------------------------------------------------------------------------- ranking


@dataclass
class Arm:
    digest: str
    name: str
    runs: list[SweepRun]


def group_arms(runs: list[SweepRun]) -> list[Arm]:
    """The runs by arm (replicates together), each arm's runs by seed; a seed run twice counts once."""
    arms: dict[str, Arm] = {}
    for run in runs:
        name = run.meta.arm_name if run.meta is not None else run.tags.get("arm", "").rsplit(" [", 1)[0]
        arm = arms.setdefault(run.arm, Arm(run.arm, name or run.experiment, []))
        if run.seed is not None and any(r.seed == run.seed for r in arm.runs):
            continue
        arm.runs.append(run)
    for arm in arms.values():
        arm.runs.sort(key=lambda r: (r.seed is None, r.seed or 0, r.experiment))
    return list(arms.values())


def rank(
    found: Found, metric: str = DEFAULT_METRIC, *, resamples: int, seed: int, margins: dict[str, float] | None = None
) -> dict:
    """The ranking as one JSON-able dict, the arms best first (docs/experiments.md, "Ranking")."""
    if metric not in METRICS:
        raise CompareError(f"--metric {metric!r}: expected one of {', '.join(METRICS)}")
    warnings_ = list(found.warnings)
    skipped, usable, tables = [], [], []
    for run in found.runs:
        why = run.missing
        if run.table is not None:
            try:
                tables.append(predictor_table(Source(run.run_id, _label(run), "mlflow-run", "", run.table)))
                usable.append(run)
                continue
            except CompareError as e:
                why = str(e)
        skipped.append({"experiment": run.experiment, "run_id": run.run_id, "status": run.status, "reason": why})
        warnings_.append(f"{_label(run)} left out: {why}")
    arms = group_arms(usable)
    if len(arms) < 2:
        have = f"only the arm {arms[0].name} has" if arms else "none of them has"
        raise CompareError(
            f"the sweep {found.sweep!r} has {len(found.runs)} model run(s) tagged {found.tag} in {found.store}, "
            f"and {have} an item table: at least 2 arms are needed"
            + (" (" + "; ".join(f"{s['experiment']}: {s['reason']}" for s in skipped) + ")" if skipped else "")
        )
    table_of = {r.run_id: t for r, t in zip(usable, tables)}
    ids, arm_values = shared_values([[table_of[r.run_id] for r in a.runs] for a in arms])
    if not ids:
        raise CompareError(
            f"the sweep {found.sweep!r}'s runs share no test item id: they were evaluated on different test splits "
            "(dataset, split salt or fractions), so there is nothing to pair"
        )
    sizes = {len(table_of[r.run_id]) for a in arms for r in a.runs}
    if sizes != {len(ids)}:
        warnings_.append(
            f"the runs hold {min(sizes)} to {max(sizes)} test items, of which {len(ids)} are shared by all "
            f"(different test splits?): the ranking is over the {len(ids)} shared items only"
        )
    values = [ArmRuns(a.name, [r.seed for r in a.runs], v, arm=a.digest) for a, v in zip(arms, arm_values)]
    # One seed spread for the whole sweep: every arm's replicates and the matching references.
    luck = luck_for(*values, references=matching_references(run.meta for run in usable))
    var = luck.seed.get(metric)
    higher = metric not in LOWER_IS_BETTER
    margin = {**MARGINS, **(margins or {})}[metric]
    means = [float(v.values[metric].mean()) for v in values]
    order = sorted(range(len(arms)), key=lambda j: (-means[j] if higher else means[j], arms[j].name, arms[j].digest))
    top = order[0]
    swept = swept_params([a.runs[0] for a in arms])
    rows = []
    for place, j in enumerate(order, start=1):
        arm, v = arms[j], values[j]
        mean, low, high = arm_interval(
            v, metric, var if luck.covers_seeds else None, CONFIDENCE, resamples=resamples, seed=seed
        )
        row = {
            "rank": place,
            "arm": {"digest": arm.digest, "name": arm.name},
            "seeds": [r.seed for r in arm.runs],
            "experiments": [r.experiment for r in arm.runs],
            "run_ids": [r.run_id for r in arm.runs],
            "params": {p: arm.runs[0].params.get(p, MISSING) for p in swept},
            "mean": {"value": round6(mean), "ci_low": round6(low), "ci_high": round6(high)},
            "top": j == top,
        }
        if j != top:
            d = compare_metric(values[top], v, metric, luck, CONFIDENCE, margin, resamples=resamples, seed=seed)
            row["difference_from_top"] = d.as_dict()
        rows.append(row)
    mlps = mlp_arms(arms, table_of, ids)
    best_mlp = None
    if mlps:
        best_mlp = max(mlps.values(), key=lambda x: float(x.values[metric].mean()) * (1 if higher else -1))
    for row, j in zip(rows, order):
        arm, v = arms[j], values[j]
        own = mlps.get(_mlp_digest(arm))
        for key, rival in (("vs_mlp", own), ("vs_best_mlp", best_mlp)):
            if rival is not None:
                refs = matching_references(r.meta for r in arm.runs)
                pair = luck_for(rival, v, references=refs)
                d = compare_metric(rival, v, metric, pair, CONFIDENCE, margin, resamples=resamples, seed=seed)
                row[key] = {"mlp": rival.label, "mlp_seeds": rival.seeds, "covers": pair.describe(), **d.as_dict()}
    others = [r["difference_from_top"]["outcome"] for r in rows if not r["top"]]
    separated = all(o == "worse" for o in others)
    rows[0]["best"] = separated
    tied = [r["arm"]["name"] for r in rows if not r["top"] and r["difference_from_top"]["outcome"] != "worse"]
    return {
        "sweep": found.sweep,
        "tag": found.tag,
        "store": found.store,
        "metric": metric,
        "higher_is_better": higher,
        "items": len(ids),
        "resamples": resamples,
        "seed": seed,
        "confidence": CONFIDENCE,
        "margin": margin,
        "covers": luck.describe(),
        "covers_seeds": luck.covers_seeds,
        "difference": "arm - top",
        "swept_params": swept,
        "best": rows[0]["arm"]["name"] if separated else None,
        "best_mlp": best_mlp.label if best_mlp is not None else None,
        "not_separated_from_top": tied,
        "arms": rows,
        "skipped": skipped,
        "warnings": warnings_,
    }


def _mlp_digest(arm: Arm) -> str | None:
    found = {r.meta.baselines["mlp"]["arm"] for r in arm.runs if r.meta is not None and "mlp" in r.meta.baselines}
    return found.pop() if len(found) == 1 else None


def mlp_arms(arms: list[Arm], table_of: dict, ids: list[str]) -> dict[str, ArmRuns]:
    """The MLP baselines in the arms' item tables, by their arm digest, each seed once."""
    from pipeline.stats.item_sources import pooled_replicates

    pairs = [(run.table, run.meta) for arm in arms for run in arm.runs]
    return {
        digest: ArmRuns(f"mlp [{digest[4:]}]", seeds, values, arm=digest)
        for digest, (seeds, values) in pooled_replicates(pairs, ids).items()
    }


def swept_params(runs: list[SweepRun]) -> list[str]:
    """The params whose values differ between the runs (what the sweep varied), sorted; the seed
    and label-only ones left out."""
    keys = sorted({k for r in runs for k in r.params} - set(LABEL_PARAMS))
    return [k for k in keys if len({r.params.get(k, MISSING) for r in runs}) > 1]


def _label(run: SweepRun) -> str:
    return f"{run.experiment} (run {run.run_id[:8]})"
