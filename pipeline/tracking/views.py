"""The MLflow UI's saved views: the model experiment's runs table with the columns models are
compared by (VIEW_TAG; grouped by arm: ARMS_VIEW_TAG), best group top-1 first, and the decisions'
and arms' tables. MLflow 3.17's runs table shows no metric or tag column until someone picks them,
and no URL parameter picks columns; a view saved as the experiment tag
`mlflow.sharedViewState.<key>` does, opened by the link `./dev ui` prints (docs/mlflow.md, "Looking
at it"). An interval is a tag (metric_names.INTERVAL_TAGS): one column reads as value and interval.
"""

from __future__ import annotations

import json
import time

from pipeline.tracking.metric_names import HEADLINE_METRIC

VIEW_KEY = "evaluation"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
# The same columns with the runs grouped by arm: replicates (runs that differ only in the seed) as
# one row with their count, the average of each metric over them.
ARMS_VIEW_KEY = "arms"
ARMS_VIEW_TAG = f"mlflow.sharedViewState.{ARMS_VIEW_KEY}"
ARM_TAG = "arm"

# What a researcher ranks models by (the number, sortable); every other metric is a column the
# Columns menu adds.
METRICS = (HEADLINE_METRIC,)
INTERVALS = ("eval.test.group_top1", "eval.test.cosine", "eval.test.vs_ridge.group_top1")
TAGS = ("stability.verdict", "preset")
ATTRIBUTES = ("Dataset", "Models")
# Long: last, where they may run off a laptop's screen. vs_baseline: the difference from the
# baseline of record with its outcome (pipeline/tracking/arms.py, written by `./dev ui`).
LAST_TAGS = ("vs_baseline.group_top1", "run.overrides")
# The table draws only the columns in view (it virtualises them): at 200 px a metric, 8 metrics
# and the rest came to about 3000 px, and on a 1600 px screen Dataset and Models were not drawn
# at all. With these widths the eval columns, the verdict, the dataset and the model fit a
# 1600 px window beside MLflow's sidebar (checked in the browser test's screenshot); a metric's
# header is cut with "…" (hover shows the full key), a dataset's name too.
WIDTHS = {
    "run_name": 140,
    "created": 100,
    "arm_group": 320,
    "metric": 100,
    "interval": 150,  # "0.883 [0.857, 0.907]", whole
    "difference": 205,  # "+0.027 [+0.010, +0.045] p=0.008", "+0.007 [-0.008, +0.022] worse"
    "stability.verdict": 85,
    "preset": 65,
    "Dataset": 190,
    "Models": 100,
    "overrides": 260,
}


def view_state(grouped: bool = False) -> dict:
    """The view as the UI stores it: selected columns, their order and widths, the sort; grouped:
    the runs grouped by their arm (tag `arm`, pipeline/core/arm.py), each group a row with the
    arm's name, its run count (the replicates) and the average of each column over them."""
    metrics = [f"metrics.`{k}`" for k in METRICS]
    intervals = [f"tags.`{k}`" for k in INTERVALS]
    tags = [f"tags.`{k}`" for k in TAGS]
    attributes = [f"attributes.`{k}`" for k in ATTRIBUTES]
    last = [f"tags.`{k}`" for k in LAST_TAGS]
    order = ["attributes.`Run Name`", "runDateAndNestInfo", *metrics, *intervals, *tags, *attributes, *last, "duration"]
    widths = {
        "attributes.`Run Name`": WIDTHS["run_name"],
        "runDateAndNestInfo": WIDTHS["created"],
        **{c: WIDTHS["metric"] for c in metrics},
        **{f"tags.`{k}`": WIDTHS["difference" if ".vs_" in k else "interval"] for k in INTERVALS},
        **{f"tags.`{k}`": WIDTHS[k] for k in TAGS},
        **{f"attributes.`{k}`": WIDTHS[k] for k in ATTRIBUTES},
        **{c: WIDTHS["difference" if "vs_" in c else "overrides"] for c in last},
    }
    state = {
        "orderByKey": metrics[0],
        "orderByAsc": False,
        "selectedColumns": [*attributes, *metrics, *intervals, *tags, *last],
        "columnOrder": order,
        "columnWidths": widths,
    }
    if grouped:
        state["groupBy"] = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": ARM_TAG}]}
        state["groupsExpanded"] = {}
        # A group's row is named "Group: <arm> [<digest>]" in the run-name column: room for it.
        state["columnWidths"] = {**widths, "attributes.`Run Name`": WIDTHS["arm_group"]}
    return state


def view_tag_value(now_ms: int | None = None, grouped: bool = False) -> str:
    """The tag's value: the envelope the UI reads (name, times, the state as a JSON string)."""
    return _envelope("Arms" if grouped else "Evaluation", view_state(grouped), now_ms)


def ensure_view(client, experiment_id: str, tags: dict) -> None:
    """Save the views on the experiment, or bring older ones up to date (their columns changed)."""
    for tag, grouped in ((VIEW_TAG, False), (ARMS_VIEW_TAG, True)):
        _ensure(client, experiment_id, tags, tag, "Arms" if grouped else "Evaluation", view_state(grouped))


def runs_url(base: str, experiment_id: str, view: str = VIEW_KEY) -> str:
    """The model experiment's runs table in the saved view. workflowType: MLflow 3.17 opens an
    experiment on its GenAI overview (traces, tokens) unless told it is model training; the
    experiment's kind tag does not decide it in this version, the link (or the sidebar's toggle,
    remembered by the browser) does."""
    query = f"workflowType=machine_learning&viewStateShareKey={view}"
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


# The decisions experiment (pipeline/tracking/decisions.py): one row per `./dev compare` or
# `./dev decide`, newest first, with what was decided and how it came out; the per-metric
# intervals and outcomes are the Columns menu's `interval.<metric>` / `outcome.<metric>`.
DECISIONS_VIEW_KEY = "decisions"
DECISIONS_VIEW_TAG = f"mlflow.sharedViewState.{DECISIONS_VIEW_KEY}"
DECISION_TAGS = ("outcome", "decision.metric", "interval", "exploratory", "luck.covers_seeds", "decision.kind")
DECISION_PARAMS = ("change", "a", "b")
DECISION_WIDTHS = {"outcome": 110, "interval": 190, "change": 220, "a": 260, "b": 260}


def decisions_view_state() -> dict:
    tags = [f"tags.`{k}`" for k in DECISION_TAGS]
    params = [f"params.`{k}`" for k in DECISION_PARAMS]
    order = ["attributes.`Run Name`", "runDateAndNestInfo", *tags, *params, "duration"]
    widths = {"attributes.`Run Name`": 220, "runDateAndNestInfo": WIDTHS["created"]}
    widths.update({f"tags.`{k}`": DECISION_WIDTHS.get(k, 100) for k in DECISION_TAGS})
    widths.update({f"params.`{k}`": DECISION_WIDTHS[k] for k in DECISION_PARAMS})
    return {
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "selectedColumns": [*tags, *params],
        "columnOrder": order,
        "columnWidths": widths,
    }


def ensure_decisions_view(client, experiment_id: str, tags: dict) -> None:
    """Save the decisions table's view on the decisions experiment, or bring an older one up to date."""
    _ensure(client, experiment_id, tags, DECISIONS_VIEW_TAG, "Decisions", decisions_view_state())


def _ensure(client, experiment_id: str, tags: dict, tag: str, name: str, state: dict) -> None:
    try:
        same = json.loads(json.loads(tags[tag])["state"]) == state
    except (ValueError, KeyError, TypeError):
        same = False
    if not same:
        client.set_experiment_tag(experiment_id, tag, _envelope(name, state))


def _envelope(name: str, state: dict, now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps({"name": name, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)})


# The arms experiment (pipeline/tracking/arms.py): one row per arm, its replicate count, each
# headline mean with its seed-covering interval, and its difference from the baseline of record.
ARMS_TABLE_VIEW_KEY = "arms"
ARMS_TABLE_VIEW_TAG = f"mlflow.sharedViewState.{ARMS_TABLE_VIEW_KEY}"
ARMS_TABLE_TAGS = (
    "replicates",
    "eval.test.group_top1",
    "vs_baseline.group_top1",
    "eval.test.cosine",
    "vs_baseline.cosine",
    "baseline",
)


def arms_table_view_state() -> dict:
    tags = [f"tags.`{k}`" for k in ARMS_TABLE_TAGS]
    widths = {"attributes.`Run Name`": 240, "runDateAndNestInfo": WIDTHS["created"]}
    widths.update({c: 230 if "vs_baseline" in c else 150 for c in tags})
    widths["tags.`replicates`"] = 120
    widths["tags.`baseline`"] = 260
    return {
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "selectedColumns": tags,
        "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", *tags],
        "columnWidths": widths,
    }


def ensure_arms_table_view(client, experiment_id: str, tags: dict) -> None:
    """Save the arms table's view on the arms experiment, or bring an older one up to date."""
    _ensure(client, experiment_id, tags, ARMS_TABLE_VIEW_TAG, "Arms", arms_table_view_state())
