"""The tracking sidecar (pipeline.tracking.metric_writer): rows sent are in the store after sync, a
store error surfaces at the next sync, system metrics are sampled, and rows already sent are
written even when the training process is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from pipeline.tracking.metric_writer import MetricWriter

pytestmark = pytest.mark.integration


def attached(uri: str, run_id: str, pending, system_metrics_s: float = 0.0) -> MetricWriter:
    writer = MetricWriter(uri)
    writer.attach(run_id, pending, system_metrics_s)
    return writer


@pytest.fixture
def run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("w", artifact_location=(tmp_path / "a").as_uri())
    return uri, client, client.create_run(exp).info.run_id


def test_rows_are_in_the_store_after_sync_in_order_and_in_batches(run, tmp_path):
    uri, client, run_id = run
    writer = attached(uri, run_id, tmp_path / "pending.jsonl")
    try:
        # 1,500 values in one message: more than one log_batch (1,000) holds.
        writer.send(
            [
                (step, 1000 + step, {**{f"m/{i}": float(step) for i in range(50)}, "bad": float("nan"), "text": "x"})
                for step in range(1, 31)
            ]
        )
        writer.sync()
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m/49")] == [
            (s, float(s)) for s in range(1, 31)
        ]
        writer.send([(31, 5000, {"late": 7})])
        writer.sync()
        metrics = client.get_run(run_id).data.metrics
        assert metrics["late"] == 7.0 and "bad" not in metrics and "text" not in metrics
    finally:
        writer.close()
    assert writer.proc.returncode == 0


def test_values_the_store_refuses_are_kept_in_the_pending_file_and_the_writer_goes_on(run, tmp_path):
    uri, client, run_id = run
    pending = tmp_path / "pending" / ("0" * 32 + ".jsonl")
    writer = attached(uri, "0" * 32, pending)  # no such run: every write is refused
    try:
        writer.send([(1, 1, {"m": 1.0}), (2, 2, {"m": 2.0})])
        status = writer.sync()
        assert status["pending"] == 2 and status["file"] == str(pending) and "0" * 32 in status["reason"]
        assert pending.read_text().splitlines() == ['["m", 1.0, 1, 1]', '["m", 2.0, 2, 2]']  # on disk by now
        writer.send([(3, 3, {"m": 3.0})])
        assert writer.sync()["pending"] == 3  # the writer still answers, and keeps adding
        assert len(pending.read_text().splitlines()) == 3
    finally:
        writer.close()
    assert pending.exists()  # never stored: left for pipeline.tracking.replay


def test_system_metrics_are_sampled_while_the_writer_runs(run, tmp_path):
    uri, client, run_id = run
    writer = attached(uri, run_id, tmp_path / "pending.jsonl", system_metrics_s=0.2)
    try:
        deadline = time.monotonic() + 60
        while "system/cpu_utilization_percentage" not in client.get_run(run_id).data.metrics:
            assert time.monotonic() < deadline, "no system metrics after 60 s"
            time.sleep(0.2)
    finally:
        writer.close()
    metrics = client.get_run(run_id).data.metrics
    assert metrics["system/system_memory_usage_megabytes"] > 0


KILLED_PARENT = """
import sys, time
from pipeline.tracking.metric_writer import MetricWriter
writer = MetricWriter(sys.argv[1])
writer.attach(sys.argv[2], sys.argv[4])
writer.send([(s, 1000 + s, {"m": float(s)}) for s in range(100)])
open(sys.argv[3], "w").write(str(writer.proc.pid))
time.sleep(120)
"""


def test_rows_sent_are_written_even_if_the_training_process_is_killed(run, tmp_path):
    uri, client, run_id = run
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, uri, run_id, str(ready), str(tmp_path / "pending.jsonl")], env=env
    )
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    child = int(ready.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    # The child sees its input close, writes the 100 rows and exits.
    while len(client.get_metric_history(run_id, "m")) < 100:
        assert time.monotonic() < deadline + 60, "the rows sent before the kill were not written"
        time.sleep(0.1)
    while _alive(child):
        assert time.monotonic() < deadline + 90, f"the writer (pid {child}) outlived its parent"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_writer_closed_at_once_still_records_a_system_sample(run, tmp_path):
    """A smoke run trains for a fraction of a second: it still gets its samples (one at the
    start, one at the end), whatever the interval."""
    uri, client, run_id = run
    writer = attached(uri, run_id, tmp_path / "pending.jsonl", system_metrics_s=60)
    writer.sync()
    writer.close()
    history = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert [m.step for m in history] == [0, 1]


def test_a_writer_started_before_its_run_writes_once_attached(run, tmp_path):
    """The train stage starts the sidecar before its run exists (tracking.early_writer): rows
    are refused until it is attached, then written as usual."""
    uri, client, run_id = run
    writer = MetricWriter(uri)
    try:
        with pytest.raises(ValueError, match="attach the metric writer to a run"):
            writer.send([(1, 1, {"m": 1.0})])
        writer.attach(run_id, tmp_path / "pending.jsonl")
        with pytest.raises(ValueError, match=f"already writes to run {run_id}"):
            writer.attach(run_id, tmp_path / "pending.jsonl")
        writer.send([(1, 1, {"m": 1.0}), (2, 2, {"m": 2.0})])
        assert writer.sync() is None
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m")] == [(1, 1.0), (2, 2.0)]
    finally:
        writer.close()
    assert writer.proc.returncode == 0


def test_a_writer_never_attached_is_stopped_at_once_and_writes_nothing(run, tmp_path):
    """A stage that fails in its set-up (a refused config) closes a sidecar that has no run yet:
    no wait for its MLflow import, nothing in the store."""
    uri, client, run_id = run
    writer = MetricWriter(uri)
    t0 = time.monotonic()
    writer.close()
    assert time.monotonic() - t0 < 5
    assert writer.proc.returncode is not None
    assert client.get_run(run_id).data.metrics == {}
