"""`./dev team copy-store` against the real team stack (PostgreSQL behind `mlflow server`, proxied
artifacts): a small SQLite store copied with the command's defaults (to the running stack),
verified field by field, copied again without a run, a model or a metric value added, and its
artifacts in the stack's artifact store. The same checks between two SQLite stores, fast:
tests/test_copy_store.py."""

from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from tests.helpers.small_store import make_small_store
from tests.helpers.team import team
from tests.test_team_stack import folder, up  # noqa: F401 (folder: the fixture that stops the stack)
from tools.servers import free_port
from tools.team.layout import Layout
from tools.team.store_compare import store_differences
from tools.team.store_ids import COPIED_FROM

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real stack: about a minute on 2 cores


def copy_store(source: str, folder) -> subprocess.CompletedProcess:  # noqa: F811
    return team("copy-store", "--from", source, "--verify", folder=folder)


def test_a_store_copied_to_the_stack_compares_equal_and_a_second_copy_adds_nothing(folder, tmp_path):  # noqa: F811
    source, ids = make_small_store(tmp_path / "local")
    uri = up(folder, "--port", str(free_port()), "--no-dvc-remote")

    first = copy_store(source, folder)
    assert first.returncode == 0, first.stderr[-6000:]
    assert f"copied 4 runs from {source} to {uri} (0 there already" in first.stderr
    assert "verified: the copy of 4 runs compares equal" in first.stderr
    assert "View run" not in first.stdout  # MLflow's line per ended run is kept off the summary
    stored = Layout(folder.resolve()).artifacts
    assert any(p.name == "train.json" for p in stored.rglob("*")), "the run's artifact is not in the stack's store"
    assert any(p.name == "weights.bin" for p in stored.rglob("*")), "the model's artifact is not in the stack's store"

    second = copy_store(source, folder)
    assert second.returncode == 0, second.stderr[-6000:]
    assert (
        f"copied 0 runs from {source} to {uri} (4 there already, 0 partial copies redone): 0 params, 0 metric values"
        in (second.stderr)
    )
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    assert sorted(r.data.tags[COPIED_FROM] for r in runs) == sorted(
        ids[k] for k in ("embed", "train", "child", "failed")
    )
    assert len(client.search_logged_models(experiments)) == 1
    train = next(r for r in runs if r.data.tags[COPIED_FROM] == ids["train"])
    assert len(client.get_metric_history(train.info.run_id, "train/loss")) == 40  # not 80
    assert store_differences(source, uri) == []  # (it also reports a run copied twice)
