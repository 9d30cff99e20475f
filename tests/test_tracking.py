from pathlib import Path

from pipeline import tracking


def test_store_resolves_out_of_a_dvc_temp_experiment_copy(tmp_path):
    repo = tmp_path / "proj"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    assert tracking.project_root(copy) == repo.resolve()
    assert tracking.project_root(repo) == repo.resolve()


def test_default_uri_is_sqlite_at_the_repo_root_and_env_overrides(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.tracking_uri()
    assert uri.startswith("sqlite:///") and Path(uri[len("sqlite:///"):]) == tracking.project_root() / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri() == "http://127.0.0.1:5999"


def test_provenance_tags_name_commit_dirty_flag_and_preset():
    tags = tracking.provenance_tags("smoke")
    assert tags["preset"] == "smoke"
    assert tags["git.dirty"] in ("true", "false", "unknown")
    assert len(tags["git.commit"]) == 40 or tags["git.commit"] == "unknown"


def test_run_ends_failed_on_error_and_finished_otherwise(tmp_path, monkeypatch):
    import mlflow
    import pytest
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("ok", "smoke", experiment="t") as ok:
        tracking.log_metrics({"a/b": 1.0, "nan": float("nan")}, step=1)
    with pytest.raises(RuntimeError):
        with tracking.mlflow_run("bad", "smoke", experiment="t") as bad:
            raise RuntimeError("boom")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(ok.info.run_id).info.status == "FINISHED"
    assert client.get_run(ok.info.run_id).data.metrics == {"a/b": 1.0}  # non-finite values are not sent
    assert client.get_run(bad.info.run_id).info.status == "FAILED"
    # Resuming adds to the same run (evaluate and report do this).
    with tracking.mlflow_run("eval", "smoke", run_id=ok.info.run_id):
        tracking.log_metrics({"test/cosine": 0.5})
    assert client.get_run(ok.info.run_id).data.metrics["test/cosine"] == 0.5
    assert mlflow.active_run() is None


def test_metric_buffer_sends_every_row_with_its_step_in_batches_and_on_error(tmp_path, monkeypatch):
    import pytest
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    with tracking.mlflow_run("buffered", "smoke", experiment="t") as run:
        with tracking.MetricBuffer(run.info.run_id, flush_seconds=3600) as buf:
            for step in range(1, 31):  # 30 rows of 40 metrics: 1,200 > one log_batch's 1,000
                buf({**{f"m/{i}": step * 1.0 for i in range(40)}, "bad": float("inf")}, step)
            assert client.get_metric_history(run.info.run_id, "m/0") == []  # held until a flush
            assert tracking.run_exists(run.info.run_id) and not tracking.run_exists("0" * 32)
        history = client.get_metric_history(run.info.run_id, "m/39")
        assert [(m.step, m.value) for m in history] == [(s, float(s)) for s in range(1, 31)]
        assert "bad" not in client.get_run(run.info.run_id).data.metrics
        with pytest.raises(KeyboardInterrupt):
            with tracking.MetricBuffer(run.info.run_id, flush_seconds=3600) as buf:
                buf({"late/metric": 7.0}, 31)
                raise KeyboardInterrupt  # Ctrl-C: what was buffered is still sent
    assert [m.value for m in client.get_metric_history(run.info.run_id, "late/metric")] == [7.0]
    with tracking.mlflow_run("timed", "smoke", experiment="t") as run:
        with tracking.MetricBuffer(run.info.run_id, flush_seconds=0) as buf:
            buf({"now": 1.0}, 1)  # flush_seconds elapsed: sent at once
            assert len(client.get_metric_history(run.info.run_id, "now")) == 1
