"""`./dev ask` on a fresh clone that pulled the model with `dvc pull`: no runs/train.json (runs/
is not in git), so the train run is the one in the tracking store whose tag train.model_sha256 is
the digest of the workspace's model file; none, or no model file, is an error saying what to do."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.core.errors import PipelineError
from pipeline.tracking import store as tracking
from tools.ask import train_run

pytestmark = pytest.mark.unit

WEIGHTS = b"the pulled model's bytes"


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A project root with no runs/ and a SQLite store holding two train runs, only one of which
    made these weights; returns (root, the id of that run)."""
    from mlflow import MlflowClient

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # project_root(): this folder, not the checkout
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("energy-flow")
    client.create_run(exp, tags={"stage": "train", "train.model_sha256": hashlib.sha256(b"other").hexdigest()})
    ours = client.create_run(exp, tags={"stage": "train", "train.model_sha256": hashlib.sha256(WEIGHTS).hexdigest()})
    return tmp_path, ours.info.run_id


def test_the_run_is_found_by_the_pulled_model_files_digest(clone):
    root, run_id = clone
    (root / "models").mkdir()
    (root / "models" / "model.pt").write_bytes(WEIGHTS)
    assert train_run() == {"run_id": run_id, "model_sha256": hashlib.sha256(WEIGHTS).hexdigest()}


def test_a_model_no_run_made_names_the_digest_and_the_store(clone):
    root, _ = clone
    (root / "models").mkdir()
    (root / "models" / "model.pt").write_bytes(b"trained elsewhere")
    with pytest.raises(PipelineError) as e:
        train_run()
    digest = hashlib.sha256(b"trained elsewhere").hexdigest()[:12]
    assert "train.model_sha256" in str(e.value) and digest in str(e.value) and "MLFLOW_TRACKING_URI" in str(e.value)


def test_no_model_file_says_to_train_or_pull(clone):
    with pytest.raises(PipelineError, match=r"no trained model yet .*dvc pull"):
        train_run()


def test_no_store_here_says_to_set_the_uri_and_makes_none(tmp_path, monkeypatch):
    """A fresh clone without MLFLOW_TRACKING_URI: the default store (mlflow.db in the clone) does
    not exist, and looking in it must not create an empty one."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "model.pt").write_bytes(WEIGHTS)
    with pytest.raises(PipelineError, match=r"no tracking store at sqlite:///.*MLFLOW_TRACKING_URI"):
        train_run()
    assert not (tmp_path / "mlflow.db").exists()
