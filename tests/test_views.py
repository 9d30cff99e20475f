"""The model experiment's saved view: the runs table's eval columns, and the link that opens it."""

import json

import pytest

from pipeline.tracking import store as tracking
from pipeline.tracking.views import (
    ARMS_VIEW_TAG,
    METRICS,
    VIEW_TAG,
    ensure_view,
    runs_url,
    view_state,
    view_tag_value,
)


@pytest.mark.unit
def test_the_view_selects_sorts_and_sizes_the_eval_columns():
    state = view_state()
    assert state["orderByKey"] == "metrics.`eval/test_group_top1`" and state["orderByAsc"] is False
    assert {f"metrics.`{k}`" for k in METRICS} <= set(state["selectedColumns"])
    assert {"attributes.`Dataset`", "attributes.`Models`", "tags.`stability.verdict`"} <= set(state["selectedColumns"])
    # The intervals (tags), the preset and the overrides are columns too.
    for tag in ("eval.test.group_top1", "eval.test.vs_ridge.group_top1", "preset", "run.overrides"):
        assert f"tags.`{tag}`" in state["selectedColumns"], tag
    # Widths only count for columns in columnOrder (the UI ignores the rest).
    assert set(state["columnWidths"]) <= set(state["columnOrder"])
    envelope = json.loads(view_tag_value(now_ms=1))
    assert envelope["name"] == "Evaluation" and json.loads(envelope["state"]) == state
    # MLflow keeps 5000 characters of an experiment tag.
    assert len(view_tag_value()) < 5000
    assert runs_url("http://h:1/", "7") == (
        "http://h:1/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=evaluation"
    )
    assert "groupBy" not in state


@pytest.mark.unit
def test_the_arms_view_groups_the_replicates_by_their_arm_tag():
    grouped = view_state(grouped=True)
    assert grouped["groupBy"] == {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "tag", "groupByData": "arm"}],
    }
    plain = view_state()
    assert {k: v for k, v in grouped.items() if k not in ("groupBy", "groupsExpanded", "columnWidths")} == {
        k: v for k, v in plain.items() if k != "columnWidths"
    }
    assert grouped["columnWidths"]["attributes.`Run Name`"] > plain["columnWidths"]["attributes.`Run Name`"]
    envelope = json.loads(view_tag_value(now_ms=1, grouped=True))
    assert envelope["name"] == "Arms" and json.loads(envelope["state"]) == grouped
    assert runs_url("http://h:1", "7", "arms").endswith("viewStateShareKey=arms")


@pytest.mark.integration
def test_the_model_experiment_gets_the_view_and_the_embed_experiment_does_not(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("default", "default", experiment="models", stage="train") as model_run:
        pass
    with tracking.mlflow_run("default", "default", experiment="models-embed", stage="embed") as embed_run:
        pass
    client = MlflowClient(uri)
    models = client.get_experiment(model_run.info.experiment_id)
    assert json.loads(json.loads(models.tags[VIEW_TAG])["state"]) == view_state()
    assert json.loads(json.loads(models.tags[ARMS_VIEW_TAG])["state"]) == view_state(grouped=True)
    assert VIEW_TAG not in client.get_experiment(embed_run.info.experiment_id).tags
    # An older view (other columns) is brought up to date; an equal one is left alone.
    client.set_experiment_tag(models.experiment_id, VIEW_TAG, json.dumps({"name": "x", "state": "{}"}))
    ensure_view(client, models.experiment_id, client.get_experiment(models.experiment_id).tags)
    current = client.get_experiment(models.experiment_id).tags[VIEW_TAG]
    assert json.loads(json.loads(current)["state"]) == view_state()
    ensure_view(client, models.experiment_id, client.get_experiment(models.experiment_id).tags)
    assert client.get_experiment(models.experiment_id).tags[VIEW_TAG] == current
