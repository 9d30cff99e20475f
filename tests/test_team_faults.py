"""Faults against the team stack's pieces, for real on loopback: PostgreSQL restarted under a
running MLflow server while a run logs to it (no metric lost, none stored twice), and a
`dvc push` to the stack's remote folder interrupted twice (SIGKILL, SIGINT) and then run again
(the remote ends complete, every object whole: `dvc status -c` in sync). The MLflow server
itself killed mid-run is tests/test_tracking_outage.py, on SQLite and on this PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking import store as tracking
from pipeline.tracking.metric_buffer import MetricBuffer
from tools.fault_matrix import clean_env
from tools.servers import free_port, start_mlflow_server
from tools.team.layout import prepare
from tools.team.standalone import TeamPostgres

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # real servers and real pushes: 20-60 s each on 2 cores


def rows(buffer: MetricBuffer, steps) -> None:
    for s in steps:
        buffer({"train/loss": 1.0 / s}, s)


def test_metrics_survive_a_postgresql_restart_under_the_server(tmp_path, monkeypatch, caplog):
    """The database goes (a fast shutdown: what a restart or an upgrade does) while the MLflow
    server stays: the server refuses batches, the buffer keeps them; the database comes back on
    the same port, the server reconnects by itself (no restart of MLflow), and the run holds
    each step exactly once."""
    caplog.set_level(logging.INFO, logger="pipeline.tracking.metric_buffer")
    pg = TeamPostgres(tmp_path / "team")
    monkeypatch.setenv("PGPASSFILE", str(pg.layout.pgpass))
    monkeypatch.setattr(tracking, "pending_dir", lambda: tmp_path / "pending")
    with contextlib.ExitStack() as database:
        database.enter_context(pg.running())
        with start_mlflow_server(pg.uri, tmp_path / "artifacts", port=free_port()) as url:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
            client = MlflowClient(url)
            run_id = client.create_run(client.create_experiment("db-restart")).info.run_id
            with MetricBuffer(run_id, flush_seconds=0) as buffer:
                rows(buffer, range(1, 6))
                buffer.sync()
                assert buffer.outage is None

                database.close()  # PostgreSQL stopped; the MLflow server runs on
                rows(buffer, range(6, 11))
                buffer.sync()
                assert buffer.outage and buffer.outage["pending"] == 5, buffer.outage
                assert "the MLflow store is not taking metrics" in caplog.text

                database.enter_context(pg.running())  # back on the same port
                rows(buffer, range(11, 16))
                buffer.sync()
                assert buffer.outage is None, buffer.outage
                rows(buffer, range(16, 21))
            assert not (tmp_path / "pending" / f"{run_id}.jsonl").exists()
            client.set_terminated(run_id)
            history = client.get_metric_history(run_id, "curves/loss")
            assert client.get_run(run_id).info.status == "FINISHED"
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / s) for s in range(1, 21)]  # none lost, no copies


FILES, FILE_BYTES = 600, 32 * 1024  # enough that a push on 2 cores is caught half way
OBJECT = re.compile(r"[0-9a-f]{30}(\.dir)?")


def remote_objects(remote: Path) -> list[Path]:
    """The objects DVC stored in a local remote (files/md5/xx/yyyy...), leaving out its temp files."""
    return [p for p in (remote / "files" / "md5").rglob("*") if p.is_file() and OBJECT.fullmatch(p.name)]


def interrupted_push(repo: Path, env: dict, remote: Path, sig: signal.Signals) -> None:
    """`dvc push` stopped by `sig` as soon as its first object is in the remote (the whole
    process group: DVC's own helpers too, as a terminal's Ctrl-C or an OOM kill of a job would)."""
    push = subprocess.Popen(
        [sys.executable, "-m", "dvc", "push", "-q"],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # Niced: on a busy machine the push (local copies, fast) could otherwise send every object
        # before this process is scheduled again to see the first one and send the signal.
        preexec_fn=lambda: os.nice(15),
    )
    before = len(remote_objects(remote))
    deadline = time.monotonic() + 120
    while push.poll() is None and len(remote_objects(remote)) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(push.pid, sig)
    push.wait(timeout=60)
    if sig == signal.SIGKILL:
        return
    with contextlib.suppress(ProcessLookupError):  # SIGINT may leave helpers: end them
        os.killpg(push.pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_an_interrupted_dvc_push_completes_on_retry(tmp_path, sig):
    env = {**clean_env(), "DVC_NO_ANALYTICS": "1"}

    def dvc(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"dvc {' '.join(args)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done.stdout

    repo = tmp_path / "repo"
    (repo / "blobs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    rng = random.Random(34)
    for i in range(FILES):
        (repo / "blobs" / f"{i:04d}.bin").write_bytes(rng.randbytes(FILE_BYTES))
    dvc("init", "-q")
    dvc("add", "-q", "blobs")
    layout, _ = prepare(tmp_path / "team")  # the stack's folder: its DVC remote is a directory in it
    remote = layout.dvc_remote
    dvc("remote", "add", "--local", "-d", "team", str(remote))

    interrupted_push(repo, env, remote, sig)
    partial = len(remote_objects(remote))
    assert 0 < partial < FILES + 1, f"{partial} objects after the interrupted push: expected a partial push"
    assert "in sync" not in dvc("status", "-c")
    # Interrupted again on the retry. That push starts with fewer objects to send and may, on a busy
    # machine, send them all before the signal lands (SIGINT lets transfers under way end): the
    # checks below hold either way.
    interrupted_push(repo, env, remote, sig)

    dvc("push", "-q")
    assert "Cache and remote 'team' are in sync" in dvc("status", "-c")
    stored = remote_objects(remote)
    assert len(stored) == FILES + 1  # each file, and the directory's listing
    for path in stored:  # whole: an object's name is the md5 of its bytes
        name = path.parent.name + path.name.removesuffix(".dir")
        assert hashlib.md5(path.read_bytes()).hexdigest() == name, f"{path}: a truncated or mixed object"
