"""A decision (`./dev compare A B`, `./dev decide`) recorded in the tracking store, where a
researcher can find, filter and link it: one MLflow run per decision in the experiment
`<run.experiment>-decisions` (default `energy-flow-decisions`), beside the model runs it judged.
Its params, metrics, tags and artifacts: docs/mlflow.md ("Decisions and arms"). The result dict
(pipeline/stats/compare.py or sequential.py) is read with .get, so a field a newer version adds
or an older one lacks does not break it. Logging a decision never fails the command that made it:
an unreachable store is a warning (the decision is still printed and written)."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pipeline.core.errors import PipelineError
from pipeline.tracking.arms import interval_text
from pipeline.tracking.redact import redact_text

DECISIONS_SUFFIX = "-decisions"
# Set to 0 to keep decisions out of MLflow in a script or a test run (as --no-log does for one).
SWITCH = "ENERGY_FLOW_LOG_DECISIONS"
KIND_TAG = "decision.kind"
OUTCOME_TAG = "outcome"
NOTE_TAG = "mlflow.note.content"
PER_METRIC = ("difference", "ci_low", "ci_high", "prob_b_better", "a", "b")
LOWER_IS_BETTER = ("mse",)  # (pipeline/stats/metrics.py says the same; tracking may not import stats)
PARAM_CHARS = 6000  # MLflow keeps 6000 characters of a param value
TAG_CHARS = 5000
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


@dataclass
class Record:
    """What one decision's run holds, before it is logged (pure: testable without a store)."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def decisions_experiment(model_experiment: str) -> str:
    return model_experiment + DECISIONS_SUFFIX


def _interval(metric: str, r: dict) -> str:
    try:
        return interval_text(metric, r["difference"], r["ci_low"], r["ci_high"], signed=True)
    except (KeyError, TypeError, ValueError):
        return ""


def _side_text(side: dict) -> str:
    """One side in words: its spec or overrides, and its arm."""
    what = side.get("name") or " ".join(side.get("overrides") or []) or side.get("label") or "?"
    arm = side.get("arm") or {}
    return f"{what} (arm {arm['name']} [{arm['digest']}])" if arm.get("digest") else str(what)


def _seeds(side: dict) -> list:
    if "seeds" in side:
        return list(side["seeds"])
    return [r.get("seed") for r in side.get("runs") or []]


def _change(result: dict) -> str:
    a, b = result.get("a") or {}, result.get("b") or {}
    code = f"the code at {result['baseline_commit'][:12]} -> the workspace's" if result.get("baseline_commit") else ""
    if a.get("overrides") is not None and b.get("overrides") is not None:
        base = list(a["overrides"])
        extra = " ".join(s for s in b["overrides"] if s not in base)
        return "; ".join(x for x in (code, extra) if x) or "(none: the same arm)"
    if result.get("change"):
        return str(result["change"])
    arms = [(s.get("arm") or {}).get("name") for s in (a, b)]
    if all(arms):
        return "(none: the same arm)" if arms[0] == arms[1] and result.get("same_arm") else " -> ".join(arms)
    return ""


def _luck(result: dict) -> tuple[str, bool | None]:
    luck = result.get("luck")
    if isinstance(luck, dict):
        return str(luck.get("covers", "")), luck.get("covers_seeds")
    covers = str(result.get("covers", ""))
    if "covers_seeds" in result:
        return covers, bool(result["covers_seeds"])
    return covers, ("training seeds" in covers) if covers else None


def _exploratory(result: dict) -> bool:
    value = result.get("exploratory", False)
    if isinstance(value, dict):
        value = value.get("exploratory", bool(value))
    return bool(value)


def record(result: dict, kind: str, run_ids: dict[str, list[str]] | None = None) -> Record:
    """The run a decision becomes. kind: `compare` or `decide`; run_ids: each side's MLflow
    model runs ("a", "b"), found by replicate_run_ids."""
    a, b = result.get("a") or {}, result.get("b") or {}
    metric = result.get("metric")
    metrics_ = result.get("metrics") or {}
    decided = metrics_.get(metric) or result.get("decision") or {}
    looks = result.get("looks")
    method = result.get("method")
    if kind == "decide" and isinstance(method, dict):
        planned = len(method.get("levels") or {})
        method_text = f"sequential: {len(looks or [])} of {planned} planned looks, alpha spent over them"
    else:
        method_text = "one look at the interval's level"
    covers, covers_seeds = _luck(result)
    how = method if isinstance(method, dict) else {}
    level = decided.get("level", result.get("level"))
    params = {
        "a": _side_text(a),
        "b": _side_text(b),
        "change": _change(result),
        "metric": metric or "none (every metric shown, none decides)",
        "margin": result.get("margin", decided.get("margin"))
        if metric
        else " ".join(f"{m}={r.get('margin')}" for m, r in metrics_.items()),
        "method": method_text,
        "looks": len(looks) if isinstance(looks, list) else 1,
        "level": level,
        "resamples": how.get("resamples", result.get("resamples")),
        "seed": how.get("seed", result.get("seed")),
        "items": result.get("items", result.get("shared_items")),
        # (what ./dev decide adds: the commit, the revision A was trained from, why this metric and margin)
        "commit": result.get("commit"),
        "baseline_commit": result.get("baseline_commit"),
        "metric_chosen": result.get("metric_chosen"),
        "margin_why": result.get("margin_why"),
    }
    values: dict[str, float] = {}
    tags: dict[str, str] = {}
    for m, r in metrics_.items():
        for key in PER_METRIC:
            v = r.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                values[f"{m}/{key}"] = float(v)
        if r.get("outcome"):
            tags[f"outcome.{m}"] = str(r["outcome"])
        if _interval(m, r):
            tags[f"interval.{m}"] = _interval(m, r)
    outcome = result.get("outcome") or (decided.get("outcome") if metric else _summary(metrics_))
    if result.get("identical"):
        outcome = "identical"
    tags.update(
        {
            KIND_TAG: kind,
            OUTCOME_TAG: str(outcome or "none"),
            "luck.covers": covers,
            "exploratory": str(_exploratory(result)).lower(),
            "a.seeds": ",".join(str(s) for s in _seeds(a)),
            "b.seeds": ",".join(str(s) for s in _seeds(b)),
        }
    )
    if covers_seeds is not None:
        tags["luck.covers_seeds"] = str(bool(covers_seeds)).lower()
    if metric:
        tags["decision.metric"] = str(metric)
        if decided:
            tags["interval"] = _interval(metric, decided)
    for key, side in (("a", a), ("b", b)):
        arm = side.get("arm") or {}
        if arm.get("digest"):
            tags[f"{key}.arm"] = f"{arm.get('name')} [{arm['digest']}]"
        if side.get("experiments"):
            tags[f"{key}.experiments"] = ",".join(side["experiments"])
        if run_ids and run_ids.get(key):
            tags[f"{key}.run_ids"] = ",".join(run_ids[key])
    first = result.get("first_decision")
    if isinstance(first, dict) and first.get("name"):
        tags["first_decision"] = f"{first['name']} on {first.get('metric')}"
    left_out = [str(x.get("experiment", x)) if isinstance(x, dict) else str(x) for x in result.get("left_out") or []]
    if left_out:
        tags["left_out"] = ",".join(left_out)
    for key in ("identical", "same_arm"):
        if key in result:
            tags[key] = str(bool(result[key])).lower()
    tags[NOTE_TAG] = note(result, kind, params, tags)
    name = result.get("name") if kind == "decide" else None
    name = name or f"{a.get('label') or a.get('name') or 'A'} vs {b.get('label') or b.get('name') or 'B'}"
    return Record(
        str(name)[:250],
        {k: str(v)[:PARAM_CHARS] for k, v in params.items() if v is not None and v != ""},
        values,
        {k: str(v)[:TAG_CHARS] for k, v in tags.items()},
    )


def _summary(metrics_: dict) -> str | None:
    """A compare's outcome, where no metric decides: each outcome with its count of metrics
    (`better on 7 of 7 metrics`, `mixed: 2 better, 5 inconclusive`)."""
    outcomes = [str(r.get("outcome")) for r in metrics_.values() if r.get("outcome")]
    if not outcomes:
        return None
    counts = {o: outcomes.count(o) for o in dict.fromkeys(outcomes)}
    if len(counts) == 1:
        return f"{outcomes[0]} on {len(outcomes)} of {len(outcomes)} metrics"
    return "mixed: " + ", ".join(f"{n} {o}" for o, n in counts.items())


def note(result: dict, kind: str, params: dict, tags: dict) -> str:
    """The run's description (markdown): the verdict first, then each metric's line."""
    metric = result.get("metric")
    lines = []
    if metric:
        lines.append(
            f"**{tags.get(OUTCOME_TAG, '?').upper()}** on {metric}: B - A = {tags.get('interval', '?')}"
            + (" (an exploratory second look at the same runs)" if tags.get("exploratory") == "true" else "")
        )
    else:
        lines.append("**Compare** (no metric decides; each metric's outcome below)")
    lines += ["", f"- A: {params['a']}", f"- B: {params['b']}", f"- change: {params['change'] or '?'}"]
    lines.append(f"- the intervals cover: {tags.get('luck.covers') or '?'}")
    lines.append("")
    for m, r in (result.get("metrics") or {}).items():
        lines.append(f"- {m}: {r.get('verdict') or tags.get(f'interval.{m}', '')}")
    lines += ["", f"Made by `./dev {kind}`; the page is this run's artifact."]
    return "\n".join(lines)


def replicate_run_ids(client, model_experiment: str, side: dict) -> list[str]:
    """The MLflow model runs of a side's replicates: run ids named in its sources, and the runs
    of its arm (tag `arm.digest`) with its seeds (param `run.seed`), the latest per seed."""
    found: list[str] = list(side.get("run_ids") or [])
    for run in side.get("runs") or []:
        found += RUN_ID.findall(str(run.get("source", "")))
    arm = (side.get("arm") or {}).get("digest")
    seeds = {str(s) for s in _seeds(side) if s is not None}
    experiment = client.get_experiment_by_name(model_experiment)
    if arm and seeds and experiment is not None:
        runs = client.search_runs(
            [experiment.experiment_id],
            f"tags.`arm.digest` = '{arm}'",
            order_by=["attributes.start_time DESC"],
            max_results=500,
        )
        latest: dict[str, str] = {}
        for run in runs:
            seed = run.data.params.get("run.seed")
            if seed in seeds and seed not in latest:
                latest[seed] = run.info.run_id
        found += [latest[s] for s in sorted(latest, key=lambda s: int(s) if s.lstrip("-").isdigit() else 0)]
    return list(dict.fromkeys(found))


def log_decision(
    result: dict, kind: str, files: Iterable[Path] = (), text: str | None = None, model_experiment: str | None = None
) -> tuple[str, str] | str | None:
    """Record the decision as a run of the decisions experiment: (experiment id, run id), or why
    it was not (the store cannot be reached or refused it; the decision stands without it), or
    None when ENERGY_FLOW_LOG_DECISIONS=0 turns it off."""
    import mlflow
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    from pipeline.tracking import store as tracking
    from pipeline.tracking.views import ensure_decisions_view

    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    uri = tracking.tracking_uri()
    shown = redact_text(uri)
    reason = tracking.unreachable_reason(uri)
    if reason:
        return f"the tracking server {shown} does not answer ({reason})"
    try:
        if model_experiment is None:
            from pipeline.core.config import load_config

            model_experiment = str(load_config([]).run.experiment)
        tracking.use_store()
        client = mlflow.MlflowClient()
        ids = {k: replicate_run_ids(client, model_experiment, result.get(k) or {}) for k in ("a", "b")}
        rec = record(result, kind, ids)
        experiment_id = _experiment(client, decisions_experiment(model_experiment), uri)
        run = client.create_run(experiment_id, run_name=rec.name, tags=rec.tags)
        run_id = run.info.run_id
        now = run.info.start_time
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in rec.metrics.items()],
            params=[Param(k, v) for k, v in rec.params.items()],
        )
        files = [Path(p) for p in files]
        for path in files:
            client.log_artifact(run_id, str(path), "decision")
        if text is not None:
            client.log_text(run_id, text, "decision/decision.txt")
        if not any(p.suffix == ".json" for p in files):
            client.log_text(run_id, json.dumps(result, indent=2, default=str), "decision/decision.json")
        client.set_terminated(run_id)
        ensure_decisions_view(client, experiment_id, client.get_experiment(experiment_id).tags)
        return experiment_id, run_id
    except (MlflowException, OSError, PipelineError) as e:
        return f"could not record it in {shown}: {redact_text(str(e))[:300]}"


def _experiment(client, name: str, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    from pipeline.tracking import store as tracking

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            kind = dict(tracking.EXPERIMENT_KIND)
            return client.create_experiment(name, tracking.artifact_location(uri), tags=kind)
        except MlflowException:  # made by another process meanwhile
            found = client.get_experiment_by_name(name)
    return found.experiment_id


def record_decision(result: dict, kind: str, **options) -> str | None:
    """log_decision, and the line a command prints about it (None: logging is switched off)."""
    return where(log_decision(result, kind, **options))


def where(ids: tuple[str, str] | str | None) -> str | None:
    """The line a command prints about its logged decision: the run, and its page on the UI
    (the server's own address, or the path to open on `./dev ui`)."""
    from pipeline.tracking import store as tracking

    if ids is None:
        return None
    if isinstance(ids, str):
        return f"the decision is not in MLflow: {ids} (--no-log skips it without a word)"
    experiment_id, run_id = ids
    uri = tracking.tracking_uri()
    base = uri.rstrip("/") + "/" if uri.startswith(("http://", "https://")) else "(./dev ui) "
    return f"logged to MLflow: decision run {run_id}, {base}#/experiments/{experiment_id}/runs/{run_id}"
