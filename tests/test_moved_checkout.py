"""A checkout that ran the pipeline on its own store, as a user moves it (smoke preset, under DVC):

- pointed at another tracking store (the team server; here a second SQLite store, the same code
  path): `dvc repro` stops at the report with one message naming the run and what to run, and
  every committed output stays in place (git status clean: DVC deletes a stage's outputs before
  it runs, so metrics/stability.json persists); after `./dev team copy-store --to` that store the
  next `dvc repro` succeeds, adds the report to the run's copy and leaves git clean;
- copied with `cp -a`: the copy's store names its own mlruns/, `./dev ask` in the copy loads the
  model from the copy with no "another tracking store", and the copy's report writes its artifacts
  into the copy, none into the original."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_team_fresh_clone import DVC, sh
from tools.fault_matrix import clean_env, project_copy

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a smoke pipeline under DVC and three more repros: ~4 min on 2 cores


def clean(cwd: Path, env: dict) -> None:
    status = sh("git", "status", "--porcelain", cwd=cwd, env=env).stdout
    assert status == "", status


def artifact_files(root: Path) -> dict[str, int]:
    """Every artifact file under root/mlruns and when it was last written."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in (root / "mlruns").rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A project that ran the smoke pipeline on its own mlflow.db, committed."""
    root = project_copy(tmp_path_factory.mktemp("moved") / "alice")
    env = clean_env()
    env.pop("ENERGY_FLOW_RUNS_DIR", None)
    sh(*DVC, "exp", "run", "-S", "preset=smoke", cwd=root, env=env)
    sh("git", "add", "-A", cwd=root, env=env)
    sh("git", "commit", "-qm", "the smoke run", cwd=root, env=env)
    clean(root, env)
    return root, env


def test_a_checkout_pointed_at_another_store_says_what_to_run_keeps_its_outputs_and_works_after_the_copy(
    checkout, tmp_path
):
    from mlflow import MlflowClient

    root, env = checkout
    server = f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}"
    (tmp_path / "server").mkdir()
    there = {**env, "MLFLOW_TRACKING_URI": server}
    failed = sh(*DVC, "repro", cwd=root, env=there, ok=False)
    err = failed.stdout + failed.stderr
    assert failed.returncode != 0, err[-3000:]
    assert "Traceback" not in err, err[-5000:]
    assert "runs/train.json names MLflow run" in err and "./dev team copy-store" in err, err[-3000:]
    assert (root / "metrics" / "stability.json").is_file()
    clean(root, env)

    sh(sys.executable, "-m", "tools.team", "copy-store", "--to", server, "--quiet", cwd=root, env=env)
    sh(*DVC, "repro", cwd=root, env=there)
    clean(root, env)
    client = MlflowClient(server)
    copies = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`stage.report.status` = 'FINISHED'"
    )
    assert copies and all(r.data.tags.get("energy_flow.copied_from") for r in copies), copies


def test_a_copied_checkout_uses_its_own_store_and_artifacts(checkout, tmp_path):
    root, env = checkout
    copy = tmp_path / "copy"
    sh("cp", "-a", str(root), str(copy), cwd=tmp_path, env=env)
    before = artifact_files(root)
    asked = sh(sys.executable, "-m", "tools.ask", "What is the capital of France?", "-k", "1", cwd=copy, env=env)
    assert "another tracking store" not in asked.stderr, asked.stderr
    assert f"from {copy}" in asked.stderr, asked.stderr  # loaded from the copy's own mlruns/
    copied = artifact_files(copy)
    sh(*DVC, "repro", cwd=copy, env=env)  # the report runs (always changed) and logs its artifacts
    assert artifact_files(root) == before, "the copy wrote into the original's mlruns/"
    written = {k for k, t in artifact_files(copy).items() if copied.get(k) != t}
    assert any(k.endswith("stability.html") for k in written), sorted(written)
    clean(copy, env)
