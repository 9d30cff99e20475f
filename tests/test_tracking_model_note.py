"""The logged model's description (pipeline/tracking/run_note.py): the model page says what the
model is, how to call it and its run's headline, instead of "No description"."""

from __future__ import annotations

import pytest

from pipeline.tracking import store as tracking
from pipeline.tracking.run_note import NOTE_TAG, model_note_text, update_note

pytestmark = pytest.mark.integration


def test_the_logged_model_gets_a_description_with_the_runs_headline(tmp_path, monkeypatch):
    from mlflow.entities import LoggedModelOutput
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("smoke-a", "smoke", experiment="models", stage="train") as run:
        client = MlflowClient(uri)
        model = client.create_logged_model(run.info.experiment_id, source_run_id=run.info.run_id, name="m")
        client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, 0)])
        tracking.set_tags({"eval.test.group_top1": "0.883 [0.857, 0.907]", "stability.verdict": "stable"})
        update_note()
    text = client.get_logged_model(model.model_id).tags[NOTE_TAG]
    assert text == model_note_text(client.get_run(run.info.run_id).data.tags, model.model_id)
    assert text.startswith("The answer model of the run **smoke-a**") and f"models:/{model.model_id}" in text
    assert "group top-1 **0.883 [0.857, 0.907]**" in text and "Stability: **stable**" in text
    assert "*Model metrics*" not in text  # the run page's pointers stay on the run
