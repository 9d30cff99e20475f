"""A run that diverges gets its stability report from the report stage, which the train stage
starts itself (the train stage imports nothing of the report), and its MLflow run stays FAILED."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.shards import fake_shards
from tools.fault_matrix import clean_env, project_copy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    root = project_copy(tmp_path_factory.mktemp("diverged"))
    fake_shards(root / "data" / "shards", dim=16, rows=(480, 32, 32))  # 15 steps an epoch
    env = {**clean_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    env.pop("ENERGY_FLOW_RUNS_DIR", None)
    # NaN loss from step 15 on; the run stops after 5 skipped steps in a row.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.train",
            "preset=smoke",
            "fault=nan_loss",
            "fault.steps=100",
            "train.max_consecutive_skips=5",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return root, proc


def test_the_train_stage_fails_and_says_the_report_follows(diverged):
    root, proc = diverged
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "training diverged at step 19: no model is written; the stability report follows" in proc.stderr
    assert "[report] verdict: unstable (failed: nonfinite) -> reports/stability.html" in proc.stderr
    assert not (root / "models" / "model.pt").exists()


def test_the_report_of_the_partial_run_points_at_the_fault(diverged):
    root, _ = diverged
    stability = json.loads((root / "metrics" / "stability.json").read_text())
    assert stability["verdict"] == "unstable"
    assert stability["nonfinite"]["status"] == "fail" and stability["nonfinite"]["first_step"] == 15
    assert stability["learning"]["status"] == "skip"  # nothing was evaluated
    assert (root / "reports" / "stability.md").read_text().startswith("# Stability report")
    assert json.loads((root / "metrics" / "train.json").read_text())["train/diverged"] == 1


def test_the_report_is_on_the_run_which_stays_failed(diverged):
    from mlflow.tracking import MlflowClient

    root, _ = diverged
    run_id = json.loads((root / "runs" / "train.json").read_text())["run_id"]
    run = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["stability.verdict"] == "unstable" and run.data.tags["stability.failed"] == "nonfinite"
    assert run.data.tags["stage.report.status"] == "FINISHED"
    assert run.data.metrics["stability/diverged"] == 1 and run.data.metrics["stability/verdict_code"] == 2
    assert os.path.getsize(root / "reports" / "stability.html") > 1000
