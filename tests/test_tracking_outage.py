"""The tracking server goes away mid-run, tested against a real `mlflow server` on
loopback that is stopped and started again on the same port: training's metrics are kept (in
memory and in the pending file) while it is away, stored when it is back, and what is still
pending when the run ends is replayed by `python -m pipeline.tracking.replay`. Nothing is lost.
Each case runs twice: the server on a SQLite file, and on the team stack's PostgreSQL (which
stays up while the MLflow server goes away)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from pipeline.tracking import store as tracking
from pipeline.tracking.metric_buffer import MetricBuffer
from tools.servers import free_port, start_mlflow_server
from tools.team.standalone import TeamPostgres

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
]  # real server starts and a real train stage, ~75 s: `./dev test -m slow` (CI runs it)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_uri(request, tmp_path, monkeypatch):
    """The MLflow server's backend store, up for the whole test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    pg = TeamPostgres(tmp_path / "team")
    monkeypatch.setenv("PGPASSFILE", str(pg.layout.pgpass))  # the server's libpq logs in with it
    with pg.running():
        yield pg.uri


def rows(buffer, steps) -> None:
    for s in steps:
        buffer({"train/loss": 1.0 / s}, s)


def test_metrics_survive_the_server_going_away_and_the_leftovers_replay(tmp_path, monkeypatch, caplog, store_uri):
    caplog.set_level(logging.INFO, logger="pipeline.tracking.metric_buffer")
    store, artifacts, port = store_uri, tmp_path / "artifacts", free_port()
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setattr(tracking, "pending_dir", lambda: tmp_path / "pending")
    with start_mlflow_server(store, artifacts, port=port):
        client = MlflowClient(url)
        run_id = client.create_run(client.create_experiment("outage")).info.run_id
        buffer = MetricBuffer(run_id, flush_seconds=0).__enter__()
        rows(buffer, range(1, 6))
        buffer.sync()
        assert buffer.outage is None
    pending = tmp_path / "pending" / f"{run_id}.jsonl"
    # Away: the rows are kept, on disk before sync returns, and training is not stopped.
    rows(buffer, range(6, 11))
    buffer.sync()
    assert buffer.outage["pending"] == 5 and len(pending.read_text().splitlines()) == 5
    assert "the MLflow store is not taking metrics" in caplog.text and "training goes on" in caplog.text
    with start_mlflow_server(store, artifacts, port=port):
        # Back: the kept rows go first, then the new ones; the pending file is gone.
        rows(buffer, range(11, 16))
        buffer.sync()
        assert buffer.outage is None and not pending.exists()
        assert "the MLflow store answers again: the 5 kept metric values are stored" in caplog.text
    # Away at the end: the buffer tries a few more times, then leaves the file to replay.
    rows(buffer, range(16, 21))
    buffer.__exit__(None, None, None)
    assert len(pending.read_text().splitlines()) == 5
    with start_mlflow_server(store, artifacts, port=port):
        replay = subprocess.run(
            [sys.executable, "-m", "pipeline.tracking.replay", str(pending)],
            cwd=REPO_ROOT,
            env={**os.environ, "MLFLOW_TRACKING_URI": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stderr
        assert f"5 values stored in run {run_id}" in replay.stdout and not pending.exists()
        history = MlflowClient(url).get_metric_history(run_id, "curves/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / s) for s in range(1, 21)]  # nothing lost, no copies


def test_the_train_stage_trains_through_a_server_restart_and_its_run_is_whole(tmp_path_factory, store_uri):
    """The real train stage against a real server that is stopped at the first checkpoint and
    started again while training goes on: the stage ends FINISHED with every telemetry row."""
    import time

    from tools.fault_matrix import clean_env, project_copy

    root = project_copy(tmp_path_factory.mktemp("outage-project"))
    env = clean_env()
    embed = subprocess.run(
        [sys.executable, "-m", "stages.embed", "preset=smoke", "run.tracking=disabled"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert embed.returncode == 0, embed.stderr[-3000:]
    store, artifacts, port = store_uri, root / "server-artifacts", free_port()
    url = f"http://127.0.0.1:{port}"
    ckpt = root / "checkpoints/train/last.pt"
    with start_mlflow_server(store, artifacts, port=port):
        train = subprocess.Popen(
            [sys.executable, "-m", "stages.train", "preset=smoke", "train.epochs=150", "train.checkpoint_every=20"],
            cwd=root,
            env={**env, "MLFLOW_TRACKING_URI": url},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while not ckpt.exists() and train.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(2)  # away for a while: checkpoints and rows keep coming
    assert train.poll() is None, "training ended before the server came back: make the run longer"
    with start_mlflow_server(store, artifacts, port=port):
        _, err = train.communicate(timeout=600)
        assert train.returncode == 0, err[-4000:]
        client = MlflowClient(url)
        [run] = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.stage = 'train'")
        history = client.get_metric_history(run.info.run_id, "curves/loss")
    assert "the MLflow store is not taking metrics" in err and "the MLflow store answers again" in err
    assert "Failed to log run data" not in err  # MLflow's line for each refused batch: the buffer says it once
    assert run.info.status == "FINISHED"
    steps = sorted({m.step for m in history})
    total = int(run.data.tags["train.steps"])
    assert steps == list(range(2, total + 1, 2)), "a telemetry row is missing"  # smoke: a row every 2 steps
    assert not list((root / ".mlflow-pending").glob("*.jsonl"))
