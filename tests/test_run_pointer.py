"""runs/train.json points to the last *tracked* train run: an untracked run leaves it alone, and
`./dev ask` says what a pointer without a run means instead of blaming the tracking URI."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import PipelineError
from pipeline.tracking import store as tracking

pytestmark = pytest.mark.unit


def test_an_untracked_run_leaves_the_pointer_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    tracking.write_run_file("train", {"run_id": "tracked1", "model_sha256": "aa"})
    before = tracking.run_file("train").read_bytes()
    tracking.write_run_file("train", {"run_id": "", "model_sha256": "bb"})  # tracking off: the stand-in run
    assert tracking.run_file("train").read_bytes() == before
    assert json.loads(before)["run_id"] == "tracked1"


def test_an_untracked_first_run_writes_no_pointer(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    tracking.write_run_file("embed", {"run_id": "", "manifest_sha256": "cc"})
    assert not tracking.run_file("embed").exists()


def test_ask_on_a_pointer_with_no_run_says_tracking_was_off(tmp_path, monkeypatch):
    from tools.ask import default_model_uri

    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    tracking.run_file("train").write_text(json.dumps({"run_id": "", "tracking_uri": "", "model_sha256": "dd"}))
    with pytest.raises(PipelineError) as raised:
        default_model_uri()
    message = str(raised.value)
    assert "names no MLflow run: the train run it records had tracking off" in message
    assert "MLFLOW_TRACKING_URI" not in message and "tracking store" not in message
