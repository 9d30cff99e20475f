"""A tracking server that is not there: with run.tracking=required (the default) the
stage stops at its start, within seconds, naming the server, before any work; with
run.tracking=optional it goes on with tracking off and says so; =disabled never asks."""

from __future__ import annotations

import socket
import time

import pytest

from pipeline.tracking import store as tracking
from pipeline.tracking import store_check
from stages import embed, evaluate

pytestmark = pytest.mark.integration


@pytest.fixture
def dead_server(monkeypatch):
    """MLFLOW_TRACKING_URI pointing at a loopback port nothing listens on (with a password in it);
    tracking on in the test's own session."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://ci:hunter2@127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking.session().enabled = True  # (this test's own session: conftest.py)
    return uri


def test_an_unreachable_server_stops_the_stage_at_once_naming_it(dead_server, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(evaluate, "run", lambda cfg: ran.append(cfg))
    t0 = time.monotonic()
    assert evaluate.main([]) == 1
    # MLflow's client alone would retry 7 times with back-off (~4 minutes); the probe is one request.
    assert time.monotonic() - t0 < 30
    assert not ran  # before any work
    err = capsys.readouterr().err
    port = dead_server.rsplit(":", 1)[1]
    assert f"[evaluate] error: the MLflow tracking server http://ci:[redacted]@127.0.0.1:{port} " in err
    assert "unreachable" in err and "run.tracking=optional" in err and "hunter2" not in err


def test_optional_tracking_goes_on_without_the_server_and_says_so(dead_server, tmp_path, caplog):
    out = tmp_path / "shards"
    code = embed.main(
        [
            "preset=smoke",
            "embed.max_rows=60",
            "embed.cache_dir=",
            f"embed.out_dir={out}",
            "run.tracking=optional",
            "run.allow_external_paths=true",
        ]
    )
    assert code == 0
    assert "tracking is OFF for this stage (run.tracking=optional)" in caplog.text
    assert (out / "manifest.json").is_file()
    # No run was made, so no pointer to one is written (a side run never clobbers the last tracked run's).
    assert not tracking.run_file("embed").exists()


def test_disabled_tracking_never_asks_the_server(dead_server, monkeypatch):
    asked = []
    monkeypatch.setattr(tracking, "unreachable_reason", lambda uri, timeout=0: asked.append(uri))
    tracking.configure("disabled")
    assert not asked and not tracking.enabled()
    with tracking.mlflow_run("x", "smoke") as run:  # a stand-in: nothing is logged anywhere
        tracking.log_params({"a": 1})
        tracking.log_metrics({"m": 1.0})
    assert run.info.run_id == ""


def test_a_uri_mlflow_cannot_store_runs_in_stops_the_stage_before_any_work(monkeypatch, capsys):
    """MLflow itself would say so only when the first run starts, after the stage's work, and in a
    traceback; an unknown scheme is known at once."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "mlfow://typo:5000")
    tracking.session().enabled = True  # (this test's own session: conftest.py)
    ran = []
    monkeypatch.setattr(evaluate, "run", lambda cfg: ran.append(cfg))
    assert evaluate.main([]) == 1 and not ran
    err = capsys.readouterr().err
    assert err.startswith(
        "[evaluate] error: MLFLOW_TRACKING_URI = mlfow://typo:5000: MLflow cannot store runs under the scheme 'mlfow'"
    ), err
    assert "Traceback" not in err
    for ok in (
        "sqlite:////tmp/m.db",
        "/tmp/mlruns",
        "file:///tmp/mlruns",
        "postgresql+psycopg2://u@h/db",
        "https://mlflow.example",
        "databricks",
    ):
        assert store_check.bad_scheme(ok) is None, ok
