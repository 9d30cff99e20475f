"""Rank the model runs of one sweep against its best, item by item: `./dev compare --sweep NAME`.

A sweep is what one `dvc exp run --queue -S run.sweep=NAME -S 'train.lr=1e-3,3e-3,1e-2' ...`
queues (one experiment per combination). Every MLflow run its stages start or add to carries the
tag `sweep.NAME` (pipeline/tracking/store.py: sweep_tags), whose value is the DVC experiment's
name; this finds the sweep's model runs (tags.stage = 'train') by it, in every experiment of the
project's store (or MLFLOW_TRACKING_URI), reads each run's item table (the evaluate stage's
evaluate/eval_items.parquet artifact) and ranks the runs by one metric's mean over the test
items they share:

- the best run is the one with the highest mean (the lowest for mse);
- each run's mean has its 95 % bootstrap CI; its difference from the best (run - best) is paired
  over the same items, with its 95 % CI and two-sided p-value: all columns are resampled together
  (pipeline/evaluate/stats.py), so the differences keep the items' pairing;
- the params that differ between the ranked runs (what the sweep varied) are shown per run.

A run without an item table (diverged, failed or still running) is left out with a warning; with
fewer than two runs left there is nothing to rank (exit 2).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.evaluate.stats import CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED, intervals, p_value, resample_means
from tools.compare import (
    MLFLOW_ARTIFACT,
    SCORE_COLUMNS,
    CompareError,
    Source,
    _quiet_mlflow,
    _r,
    _read_parquet,
    predictor_table,
)

DEFAULT_METRIC = "group_top1"  # the headline retrieval metric (metrics/eval.json)
# Params that label a run and change nothing in it (dvc.yaml's header): a run DVC restored from its
# cache into a later sweep was logged under another run.sweep, which must not count as a swept param.
LABEL_PARAMS = ("run.sweep", "run.experiment")
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


@dataclass
class Found:
    sweep: str
    tag: str
    store: str  # the store searched, as shown (no password)
    runs: list[SweepRun]
    warnings: list[str] = field(default_factory=list)


def member_tag(sweep: str) -> str:
    from pipeline.tracking.store import SWEEP_MEMBER_PREFIX

    return f"{SWEEP_MEMBER_PREFIX}{sweep}"


# --------------------------------------------------------------------------- finding the runs


def find(sweep: str) -> Found:
    """The sweep's model runs in the tracking store, each with its item table (or why not)."""
    from pipeline.core.config import _SWEEP_NAME
    from pipeline.tracking import store as tracking

    if not _SWEEP_NAME.fullmatch(sweep):
        raise CompareError(
            f"--sweep {sweep!r}: not a sweep name (letters, digits, '.', '_' and '-', as run.sweep takes)"
        )
    uri = tracking.tracking_uri()
    shown = tracking.redact_text(uri)
    tag = member_tag(sweep)
    if uri.startswith("sqlite:///") and not os.path.isfile(uri[len("sqlite:///") :]):
        raise CompareError(f"no MLflow store at {shown} to look for the sweep {sweep!r} in (no run was tracked there)")
    _quiet_mlflow()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        ids = [e.experiment_id for e in client.search_experiments()]
        runs = _search(client, ids, f"tags.`{tag}` LIKE '%' and tags.stage = 'train'")
    except Exception as e:  # noqa: BLE001 - an unreachable server or a store MLflow cannot read: one line
        raise CompareError(
            f"could not search the MLflow store {shown}: {type(e).__name__}: {tracking.redact_text(str(e))}"
        ) from None
    if not runs:
        others = sorted({r.data.tags.get(tracking.SWEEP_TAG, "") for r in _search(client, ids, "tags.sweep LIKE '%'")})
        known = f"sweeps there: {', '.join(o for o in others if o)}" if any(others) else "no run there is in a sweep"
        raise CompareError(
            f"no model run (tags.stage = 'train') in the MLflow store {shown} carries the tag {tag} ({known}). "
            f"A sweep's runs are tagged by the param run.sweep: dvc exp run --queue -S run.sweep={sweep} "
            "-S 'train.lr=1e-3,3e-3' ..., then dvc queue start"
        )
    found = Found(sweep, tag, shown, [])
    names: dict[str, int] = {}
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr holds warnings and errors only
    for r in sorted(runs, key=lambda r: (r.data.tags[tag], r.info.start_time or 0)):
        run = SweepRun(
            experiment=r.data.tags[tag],
            run_id=r.info.run_id,
            run_name=r.info.run_name or "",
            status=r.info.status,
            params=dict(r.data.params),
        )
        names[run.experiment] = names.get(run.experiment, 0) + 1
        with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
            try:
                local = client.download_artifacts(run.run_id, MLFLOW_ARTIFACT, tmp)
            except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
                run.missing = (
                    f"no artifact {MLFLOW_ARTIFACT} (run {run.status}: not evaluated; a diverged, failed or "
                    "still running experiment has none)"
                )
            else:
                try:
                    run.table = _read_parquet(local, run.run_id)
                except CompareError as e:
                    run.missing = str(e)
        found.runs.append(run)
    for name, count in sorted(names.items()):
        if count > 1:
            found.warnings.append(
                f"{count} model runs stand for the experiment {name} (the sweep queued again under the same "
                "names?): each is ranked, told apart by its run id"
            )
    return found


def _search(client, experiment_ids: list[str], filter_string: str) -> list:
    out, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


# --------------------------------------------------------------------------- ranking


def rank(
    found: Found, metric: str = DEFAULT_METRIC, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> dict:
    """The ranking as one JSON-able dict (the runs best first; see the module doc)."""
    from pipeline.evaluate.retrieval import LOWER_IS_BETTER, METRICS, item_metrics

    if metric not in METRICS:
        raise CompareError(f"--metric {metric!r}: expected one of {', '.join(METRICS)}")
    warnings_ = list(found.warnings)
    skipped, ranked, tables = [], [], []
    for run in found.runs:
        why = run.missing
        if run.table is not None:
            try:
                tables.append(predictor_table(Source(run.run_id, _label(run), "mlflow-run", "", run.table)))
                ranked.append(run)
                continue
            except CompareError as e:
                why = str(e)
        skipped.append({"experiment": run.experiment, "run_id": run.run_id, "status": run.status, "reason": why})
        warnings_.append(f"{_label(run)} left out: {why}")
    if len(ranked) < 2:
        have = f"only {_label(ranked[0])} has" if ranked else "none of them has"
        raise CompareError(
            f"the sweep {found.sweep!r} has {len(found.runs)} model run(s) tagged {found.tag} in {found.store}, "
            f"and {have} an item table to rank: at least 2 are needed"
            + (" (" + "; ".join(f"{s['experiment']}: {s['reason']}" for s in skipped) + ")" if skipped else "")
        )
    shared = set(tables[0]["id"])
    for t in tables[1:]:
        shared &= set(t["id"])
    if not shared:
        raise CompareError(
            f"the sweep {found.sweep!r}'s runs share no test item id: they were evaluated on different test splits "
            "(dataset, split salt or fractions), so there is nothing to pair"
        )
    order = [i for i in tables[0]["id"] if i in shared]  # the first run's item order
    sizes = [len(t) for t in tables]
    if any(s != len(order) for s in sizes):
        warnings_.append(
            f"the runs hold {min(sizes)} to {max(sizes)} test items, of which {len(order)} are shared by all "
            f"(different test splits?): the ranking is over the {len(order)} shared items only"
        )
    values = np.stack(
        [item_metrics({c: t.set_index("id").loc[order, c].to_numpy() for c in SCORE_COLUMNS})[metric] for t in tables],
        axis=1,
    )  # (items, runs)
    k = values.shape[1]
    higher = metric not in LOWER_IS_BETTER
    means = values.mean(axis=0)
    # Best first; equal means by experiment name, then run id, so the order never depends on the store's.
    keys = [(-m if higher else m, r.experiment, r.run_id) for m, r in zip(means, ranked)]
    order_idx = sorted(range(k), key=lambda j: keys[j])
    best = order_idx[0]
    diffs = values - values[:, [best]]
    resampled = resample_means(np.concatenate([values, diffs], axis=1), resamples, seed)  # one set: all paired
    lows, highs = intervals(resampled)
    swept = swept_params(ranked)
    rows = []
    for place, j in enumerate(order_idx, start=1):
        run = ranked[j]
        diff = {
            "value": _r(diffs[:, j].mean()),
            "ci95_low": _r(lows[k + j]),
            "ci95_high": _r(highs[k + j]),
            "p_value": _r(p_value(diffs[:, j], resampled[:, k + j])),
        }
        significant = j != best and (diff["ci95_low"] > 0 or diff["ci95_high"] < 0)
        rows.append(
            {
                "rank": place,
                "experiment": run.experiment,
                "run_id": run.run_id,
                "run_name": run.run_name,
                "status": run.status,
                "params": {p: run.params.get(p, MISSING) for p in swept},
                "mean": {"value": _r(means[j]), "ci95_low": _r(lows[j]), "ci95_high": _r(highs[j])},
                "difference_from_best": diff,
                "significantly_worse": significant,
                "best": j == best,
            }
        )
    return {
        "sweep": found.sweep,
        "tag": found.tag,
        "store": found.store,
        "metric": metric,
        "higher_is_better": higher,
        "items": len(order),
        "resamples": resamples,
        "seed": seed,
        "confidence": CONFIDENCE,
        "difference": "run - best",
        "swept_params": swept,
        "runs": rows,
        "skipped": skipped,
        "warnings": warnings_,
    }


def swept_params(runs: list[SweepRun]) -> list[str]:
    """The params whose values differ between the runs (what the sweep varied), sorted; label-only
    ones left out."""
    keys = sorted({k for r in runs for k in r.params} - set(LABEL_PARAMS))
    return [k for k in keys if len({r.params.get(k, MISSING) for r in runs}) > 1]


def _label(run: SweepRun) -> str:
    return f"{run.experiment} (run {run.run_id[:8]})"


def _fmt(x: float, metric: str, sign: bool = False) -> str:
    digits = 6 if metric == "mse" else 3
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def render(result: dict) -> str:
    m = result["metric"]
    direction = "higher is better" if result["higher_is_better"] else "lower is better"
    lines = [
        f"Sweep {result['sweep']}: {len(result['runs'])} model runs tagged {result['tag']} in {result['store']}, "
        f"ranked by {m} ({direction}) over {result['items']} shared test items.",
        f"Mean: {round(result['confidence'] * 100)} % bootstrap CI. vs best: the run's mean minus the best's, "
        f"paired over the same items ({result['resamples']} resamples, seed {result['seed']}), two-sided p.",
        "",
    ]
    head = ["rank", "experiment", "run", *result["swept_params"], m, "95 % CI", "vs best", "95 % CI", "p"]
    body = []
    for row in result["runs"]:
        d, mean = row["difference_from_best"], row["mean"]
        run = row["run_id"][:8] + (f" ({row['run_name']})" if row["run_name"] not in ("", row["experiment"]) else "")
        if row["best"]:
            versus = ["best", "", ""]
        else:
            versus = [
                _fmt(d["value"], m, True),
                f"[{_fmt(d['ci95_low'], m, True)}, {_fmt(d['ci95_high'], m, True)}]",
                f"{d['p_value']:.3g}" + (" *" if row["significantly_worse"] else ""),
            ]
        body.append(
            [
                str(row["rank"]),
                row["experiment"],
                run,
                *(row["params"][p] for p in result["swept_params"]),
                _fmt(mean["value"], m),
                f"[{_fmt(mean['ci95_low'], m)}, {_fmt(mean['ci95_high'], m)}]",
                *versus,
            ]
        )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    first = 3 + len(result["swept_params"])  # the metric's mean; then its CI, vs best, its CI, p
    numeric = {0, first, first + 2, first + 4}  # right-aligned; the intervals left-aligned

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines += [line(head).rstrip(), "-" * len(line(head).rstrip())]
    lines += [line(r).rstrip() for r in body]
    lines.append("(* worse than the best: the 95 % interval of the difference excludes 0)")
    return "\n".join(lines)
