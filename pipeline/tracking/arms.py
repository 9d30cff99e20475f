"""Arms and their comparison with the baseline of record, as MLflow shows them
(rows from pipeline/stats/baseline.py; tracking may not import stats, so it takes them as dicts):
one run per arm in the experiment `<run.experiment>-arms`, found again by its tag `arm.digest`,
and the same `vs_baseline.*` tags on every evaluated model run of the arm (docs/mlflow.md,
"Decisions and arms", lists them). Only MLflow changes: no file the pipeline or DVC tracks."""

from __future__ import annotations

from typing import Iterable

ARMS_SUFFIX = "-arms"
MEAN_KEYS = {"group_top1": "eval/test_group_top1", "cosine": "eval/test_cosine"}  # the model runs' own keys
BASELINE_TAG = "baseline"
VS_PREFIX = "vs_baseline."


def arms_experiment(model_experiment: str) -> str:
    return model_experiment + ARMS_SUFFIX


def interval_text(metric: str, value: float, low: float, high: float, signed: bool = False) -> str:
    n, sign = (6 if metric == "mse" else 3), "+" if signed else ""
    return f"{value:{sign}.{n}f} [{low:{sign}.{n}f}, {high:{sign}.{n}f}]"


def comparison_tags(row: dict, baseline: str) -> dict[str, str]:
    """The tags a model run and its arm's run carry about the baseline of record."""
    tags = {BASELINE_TAG: baseline}
    if not row["vs_baseline"]:  # the baseline's own arm, or one not comparable with it
        said = row.get("not_comparable") or "this is the baseline"
        tags.update({f"{VS_PREFIX}{m}": said for m in row["means"] or ("group_top1",)})
    for m, d in row["vs_baseline"].items():
        text = interval_text(m, d["difference"], d["ci_low"], d["ci_high"], signed=True)
        tags[f"{VS_PREFIX}{m}"] = f"{text} {d['outcome']}"
    seeds = ", ".join(str(s) for s in row["seeds"])
    tags["arm.replicates"] = f"{len(row['run_ids'])} (seeds {seeds})"
    return tags


def arm_params(row: dict) -> dict[str, str]:
    """The arm's config as params (its model runs' params that make the arm: equal for all of
    them, pipeline/core/arm.py), so the compare page of arm runs plots what differs between them."""
    from pipeline.core.arm import in_arm

    return {k: str(v) for k, v in (row.get("params") or {}).items() if in_arm(k)}


def arm_record(row: dict, baseline: str) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of an arm's run. The headline means come first: the compare page plots the
    params that differ against the first metric the store saw (MLflow 3.17), the decided one."""
    metrics: dict[str, float] = {}
    tags = {
        "arm": f"{row['arm']['name']} [{row['arm']['digest']}]",
        "arm.digest": row["arm"]["digest"],
        "replicates": f"{len(row['run_ids'])} (seeds {', '.join(str(s) for s in row['seeds'])})",
        "run_ids": ",".join(row["run_ids"]),
        "luck.covers": row["covers"],
        **comparison_tags(row, baseline),
    }
    for m, mean in row["means"].items():
        metrics[MEAN_KEYS.get(m, f"eval/test_{m}")] = mean["value"]
        tags[f"eval.test.{m}"] = interval_text(m, mean["value"], mean["ci_low"], mean["ci_high"])
    metrics["replicates"] = float(len(row["run_ids"]))
    lines = [
        f"**{tags['arm']}**: {tags['replicates']} replicate run(s); against the baseline of record {baseline}:",
        "",
        *(f"- {m}: {tags.get(VS_PREFIX + m, '')}" for m in row["means"]),
        f"- the intervals cover: {row['covers']}",
        "",
        "Its model runs: " + ", ".join(f"[{r[:8]}](#/experiments/{{model}}/runs/{r})" for r in row["run_ids"]),
    ]
    tags["mlflow.note.content"] = "\n".join(lines)
    return metrics, tags


def log_arms(client, model_experiment_id: str, arms_experiment_id: str, rows: Iterable[dict], baseline: str) -> int:
    """Write the rows: one run per arm in the arms experiment (made or updated), the comparison
    on every model run of each arm. The number of arms written."""
    import time

    from mlflow.entities import Metric, Param, RunTag

    existing = {
        r.data.tags.get("arm.digest"): r.info.run_id
        for r in client.search_runs([arms_experiment_id], "", max_results=5000)
        if r.data.tags.get("arm.digest")
    }
    count = 0
    for row in rows:
        metrics, tags = arm_record(row, baseline)
        tags["mlflow.note.content"] = tags["mlflow.note.content"].replace("{model}", model_experiment_id)
        run_id = existing.get(row["arm"]["digest"])
        if run_id is None:  # (params once: MLflow refuses to change one)
            run = client.create_run(arms_experiment_id, run_name=row["arm"]["name"][:250])
            run_id = run.info.run_id
            params = [Param(k, v[:6000]) for k, v in arm_params(row).items()]
            for i in range(0, len(params), 100):  # log_batch takes 100 params a call
                client.log_batch(run_id, params=params[i : i + 100])
            client.set_terminated(run_id)
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in metrics.items()],
            tags=[RunTag(k, v[:5000]) for k, v in tags.items()],
        )
        model_tags = [RunTag(k, v) for k, v in comparison_tags(row, baseline).items()]
        for model_run in row.get("all_run_ids") or row["run_ids"]:
            client.log_batch(model_run, tags=model_tags)
        count += 1
    return count
