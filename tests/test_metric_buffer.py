"""The train stage's metric buffer (pipeline.tracking.metric_buffer) on a real SQLite store:
rows are in the store after sync, in batches, without non-finite values; values the store
refuses are on disk before sync returns and sent again; system metrics are sampled; MLflow's
HTTP retries are off only while the buffer is open; a replay never doubles a point.
(The outage against a real server that stops and starts: test_tracking_outage.py.)"""

from __future__ import annotations

import logging
import os

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from pipeline.tracking import metric_buffer, replay
from pipeline.tracking import store as tracking
from pipeline.tracking.metric_buffer import ENV_WHILE_OPEN, MetricBuffer, write_pending
from pipeline.tracking.replay import read_pending

pytestmark = pytest.mark.integration


@pytest.fixture
def run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(tracking, "pending_dir", lambda: tmp_path / "pending")
    client = MlflowClient(uri)
    exp = client.create_experiment("w", artifact_location=(tmp_path / "a").as_uri())
    return client, client.create_run(exp).info.run_id


def test_rows_are_in_the_store_after_sync_in_batches_without_non_finite_values(run):
    client, run_id = run
    with MetricBuffer(run_id, flush_seconds=3600) as buf:
        # 30 rows of 50 values: 1,500, more than one log_batch (1,000) holds.
        for step in range(1, 31):
            buf({**{f"m/{i}": float(step) for i in range(50)}, "bad": float("nan"), "text": "x"}, step)
        assert client.get_metric_history(run_id, "m/0") == []  # held until a flush
        buf.sync()
        assert buf.rows == [] and buf.sent == 1500 and buf.outage is None
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m/49")] == [
            (s, float(s)) for s in range(1, 31)
        ]
        buf({"late": 7}, 31)
    metrics = client.get_run(run_id).data.metrics  # the exit sent the last row
    assert metrics["late"] == 7.0 and "bad" not in metrics and "text" not in metrics
    assert not (tracking.pending_dir() / f"{run_id}.jsonl").exists()


def test_values_the_store_refuses_are_on_disk_before_sync_returns_and_sent_again(run, caplog, capfd, monkeypatch):
    client, run_id = run
    monkeypatch.setattr(metric_buffer, "FINAL_PAUSE_S", 0.01)
    caplog.set_level(logging.INFO, logger="pipeline.tracking.metric_buffer")
    ghost = "0" * 32  # no such run: every write is refused
    pending = tracking.pending_dir() / f"{ghost}.jsonl"
    with MetricBuffer(ghost, flush_seconds=3600) as buf:
        buf({"m": 1.0}, 1)
        buf({"m": 2.0}, 2)
        buf.sync()
        assert buf.outage["pending"] == 2 and buf.outage["file"] == str(pending) and ghost in buf.outage["reason"]
        assert [(m.key, m.value, m.step) for m in read_pending(pending)] == [("m", 1.0, 1), ("m", 2.0, 2)]
        assert "the MLflow store is not taking metrics" in caplog.text and "training goes on" in caplog.text
        buf({"m": 3.0}, 3)
        buf.sync()  # sent again with the new row, refused again: all three kept
        assert buf.outage["pending"] == 3 and len(read_pending(pending)) == 3
        # MLflow's own error line for each refused batch (its logger prints to stderr) is the buffer's to say, once.
        assert "Failed to log run data" not in capfd.readouterr().err
    assert len(read_pending(pending)) == 3  # never stored: left for pipeline.tracking.replay
    assert "run `python -m pipeline.tracking.replay`" in caplog.text
    # The file is rewritten whole (temp, then rename): nothing else is left beside it.
    assert sorted(p.name for p in pending.parent.iterdir()) == [pending.name]


def test_a_store_back_within_the_run_gets_the_kept_values_and_the_file_goes(run, caplog):
    client, run_id = run
    caplog.set_level(logging.INFO, logger="pipeline.tracking.metric_buffer")
    pending = tracking.pending_dir() / f"{run_id}.jsonl"
    with MetricBuffer(run_id, flush_seconds=3600) as buf:
        buf({"m": 1.0}, 1)
        buf.sync()
        client.delete_run(run_id)  # a deleted run's store refuses its metrics ...
        buf({"m": 2.0}, 2)
        buf.sync()
        assert buf.outage["pending"] == 1 and len(read_pending(pending)) == 1
        client.restore_run(run_id)  # ... and takes them again once it is restored
        buf({"m": 3.0}, 3)
        buf.sync()
        assert buf.outage is None and not pending.exists()
    assert "the MLflow store answers again: the 1 kept metric values are stored" in caplog.text
    assert [m.step for m in client.get_metric_history(run_id, "m")] == [1, 2, 3]


def test_mlflow_retries_and_queue_buffering_are_off_only_while_the_buffer_is_open(run, monkeypatch):
    _, run_id = run
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")  # as tracking.mlflow_run sets it
    with MetricBuffer(run_id):
        assert {k: os.environ.get(k) for k in ENV_WHILE_OPEN} == ENV_WHILE_OPEN
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    assert os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] == "1"


def test_every_refused_batch_is_kept_even_when_batches_come_faster_than_a_second(run, monkeypatch):
    """MLflow's queue, buffering, merges a second's batches into one call and reports a failure
    on the first batch only: with the stage's run settings (1 s buffering) and a flush per row,
    every refused value must still be kept."""
    monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
    monkeypatch.setattr(metric_buffer, "FINAL_TRIES", 0)
    ghost = "0" * 32  # no such run: every write is refused
    with MetricBuffer(ghost, flush_seconds=0) as buf:
        for step in range(1, 21):
            buf({"m": float(step)}, step)
        buf.sync()
        assert buf.outage["pending"] == 20
    assert sorted(m.step for m in read_pending(tracking.pending_dir() / f"{ghost}.jsonl")) == list(range(1, 21))


def test_system_metrics_are_sampled_from_the_first_row_to_the_end(run):
    """A smoke run trains for a fraction of a second: it still gets its samples (one at the
    first row, one at the end), whatever the interval, under `machine/` (not `system/`, which
    the run page lists first); the first metric the run was given is the row's loss, which
    MLflow's compare page plots by default."""
    client, run_id = run
    with MetricBuffer(run_id, system_metrics_s=60) as buf:
        buf({"train/loss": 0.5, "step": 1.0, "train/skipped": 0.0}, 1)
    history = client.get_metric_history(run_id, "machine/cpu_percent")
    assert [m.step for m in history] == [0, 1]
    metrics = client.get_run(run_id).data
    assert metrics.metrics["machine/memory_percent"] > 0
    assert not [k for k in metrics.metrics if k.startswith("system/")]
    # The store's own order of the run's metrics (what the UI gets): the loss first.
    assert [m.key for m in metrics._metric_objs][0] == "curves/loss", metrics._metric_objs
    assert {"step", "train/skipped", "curves/step"}.isdisjoint(metrics.metrics)  # row bookkeeping: not sent


def test_tracking_off_the_buffer_does_nothing(run, monkeypatch):
    client, run_id = run
    tracking.session().enabled = False  # (this test's own session: conftest.py)
    with MetricBuffer(run_id, flush_seconds=0) as buf:
        buf({"m": 1.0}, 1)
        buf.sync()
    assert buf.sent == 0 and client.get_run(run_id).data.metrics == {}


def test_a_replay_stores_what_the_run_lacks_and_never_doubles_a_point(run, tmp_path):
    client, run_id = run
    stored = [Metric("m", 1.0, 1000, 1), Metric("m", 2.0, 2000, 2)]
    client.log_batch(run_id, metrics=stored)
    pending = tmp_path / "pending" / f"{run_id}.jsonl"
    # The file kept values 1-3, of which 1 and 2 reached the store after all (a lost answer).
    write_pending(pending, [*stored, Metric("m", 3.0, 3000, 3)])
    assert replay.main([str(pending)]) == 0
    assert not pending.exists()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m")] == [(1, 1.0), (2, 2.0), (3, 3.0)]
