"""The team server with its locks on (`./dev team up --auth --tls`), tried as an attacker would,
on loopback: no request without credentials reads or writes anything (the REST API, the UI's
AJAX API, artifacts, logged models, the UI itself); a wrong password is refused exactly as an
unknown user is; a member cannot change another member's experiment until granted; the passwords
are in no log, command line, run, artifact or setting; plain http and an unverified certificate
are refused; the server is never opened beyond loopback without both locks. Last, the stack is
backed up, wiped and restored, and everything is back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests

from pipeline.core.paths import REPO_ROOT
from tests.helpers.team import team
from tools.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a stack's start, ~40 s on 2 cores


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("locked") / "team"
    port = free_port()
    done = team("up", "--auth", "--tls", "--port", str(port), "--no-dvc-remote", folder=folder)
    assert done.returncode == 0, done.stderr[-6000:]
    try:
        lines = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.strip().splitlines())
        assert lines["MLFLOW_TRACKING_URI"] == f"https://127.0.0.1:{port}", lines
        assert lines["MLFLOW_TRACKING_PASSWORD"] == f'"$(cat {folder / "secrets" / "mlflow-admin.password"})"'
        secrets = folder / "secrets"
        admin = (secrets / "mlflow-admin.password").read_text().strip()
        assert admin not in done.stdout + done.stderr
        assert (secrets / "mlflow-admin.password").stat().st_mode & 0o777 == 0o600
        users = {}
        for name in ("alice", "bob"):
            made = team("user", "add", name, folder=folder)
            assert made.returncode == 0, made.stderr[-3000:]
            path = secrets / "users" / f"{name}.password"
            users[name] = path.read_text().strip()
            assert path.stat().st_mode & 0o777 == 0o600 and users[name] not in made.stdout + made.stderr
        yield {
            "folder": folder,
            "uri": lines["MLFLOW_TRACKING_URI"],
            "cert": lines["MLFLOW_TRACKING_SERVER_CERT_PATH"],
            "admin": admin,
            "users": users,
        }
    finally:
        team("down", folder=folder, timeout=180)


def as_user(stack, name: str | None, code: str) -> subprocess.CompletedProcess:
    """`code` in a Python process with MLflow's client pointed at the stack as `name` (None: no
    credentials)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=stack["uri"], MLFLOW_TRACKING_SERVER_CERT_PATH=stack["cert"])
    if name:
        password = stack["admin"] if name == "admin" else stack["users"][name]
        env.update(MLFLOW_TRACKING_USERNAME=name, MLFLOW_TRACKING_PASSWORD=password)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def alices_run(stack):
    """alice's experiment, run (a param, a tag, a metric, an artifact) and logged model."""
    done = as_user(
        stack,
        "alice",
        "import json, mlflow\n"
        "mlflow.set_experiment('alice-exp')\n"
        "with mlflow.start_run() as run:\n"
        "    mlflow.log_param('lr', 0.1); mlflow.set_tag('owner', 'alice'); mlflow.log_metric('loss', 1.0)\n"
        "    mlflow.log_text('secret findings', 'notes/a.txt')\n"
        "    info = mlflow.pyfunc.log_model(name='m', python_model=lambda x: x, input_example=[[1.0]])\n"
        "print(json.dumps({'run': run.info.run_id, 'experiment': run.info.experiment_id, 'model': info.model_id}))\n",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def get(stack, path: str, auth=None, method="GET", **kw) -> requests.Response:
    return requests.request(method, stack["uri"] + path, auth=auth, verify=stack["cert"], timeout=30, **kw)


def test_no_request_without_credentials_reads_or_writes_anything(stack, alices_run):
    run, experiment, model = alices_run["run"], alices_run["experiment"], alices_run["model"]
    reads = [
        "/",  # the UI
        f"/api/2.0/mlflow/experiments/get?experiment_id={experiment}",
        "/api/2.0/mlflow/experiments/search?max_results=10",
        f"/api/2.0/mlflow/runs/get?run_id={run}",
        f"/ajax-api/2.0/mlflow/runs/get?run_id={run}",
        f"/api/2.0/mlflow/metrics/get-history?run_id={run}&metric_key=loss",
        f"/ajax-api/2.0/mlflow/metrics/get-history-bulk?run_id={run}&metric_key=loss",
        f"/api/2.0/mlflow/artifacts/list?run_id={run}",
        f"/get-artifact?path=notes/a.txt&run_uuid={run}",
        f"/api/2.0/mlflow-artifacts/artifacts/{experiment}/{run}/artifacts/notes/a.txt",
        f"/api/2.0/mlflow/logged-models/{model}",
        "/graphql",
    ]
    writes = [
        ("POST", "/api/2.0/mlflow/runs/create", {"experiment_id": experiment}),
        ("POST", "/api/2.0/mlflow/runs/log-parameter", {"run_id": run, "key": "x", "value": "1"}),
        ("POST", "/ajax-api/2.0/mlflow/runs/set-tag", {"run_id": run, "key": "owner", "value": "mallory"}),
        ("POST", "/api/2.0/mlflow/runs/delete", {"run_id": run}),
        ("POST", "/api/2.0/mlflow/experiments/create", {"name": "mallory"}),
        ("POST", "/api/2.0/mlflow/users/create", {"username": "mallory", "password": "p"}),
    ]
    for path in reads:
        answer = get(stack, path)
        assert answer.status_code == 401, (path, answer.status_code, answer.text[:300])
        assert "secret findings" not in answer.text and "alice" not in answer.text, path
    for method, path, body in writes:
        answer = get(stack, path, method=method, json=body)
        assert answer.status_code == 401, (path, answer.status_code, answer.text[:300])
    upload = get(
        stack, f"/api/2.0/mlflow-artifacts/artifacts/{experiment}/{run}/artifacts/evil.txt", method="PUT", data=b"x"
    )
    assert upload.status_code == 401
    # Nothing changed: the admin sees alice's run as she left it.
    seen = get(stack, f"/api/2.0/mlflow/runs/get?run_id={run}", auth=("admin", stack["admin"])).json()["run"]
    assert seen["info"]["lifecycle_stage"] == "active"
    assert {t["key"]: t["value"] for t in seen["data"]["tags"]}["owner"] == "alice"
    assert [p["key"] for p in seen["data"]["params"]] == ["lr"]
    names = [e["name"] for e in get(stack, "/api/2.0/mlflow/experiments/search?max_results=50",
                                    auth=("admin", stack["admin"])).json()["experiments"]]  # fmt: skip
    assert "mallory" not in names


def test_a_wrong_password_is_refused_as_an_unknown_user_is(stack, alices_run):
    path = f"/api/2.0/mlflow/runs/get?run_id={alices_run['run']}"
    wrong = get(stack, path, auth=("alice", stack["users"]["alice"] + "x"))
    unknown = get(stack, path, auth=("nobody", "whatever"))
    empty = get(stack, path, auth=("alice", ""))
    assert wrong.status_code == unknown.status_code == empty.status_code == 401
    assert wrong.text == unknown.text == empty.text  # nothing says which part was wrong
    assert get(stack, path, auth=("alice", stack["users"]["alice"])).status_code == 200


def test_a_member_cannot_change_another_members_experiment_until_granted(stack, alices_run):
    run = alices_run["run"]
    bob = ("bob", stack["users"]["bob"])
    assert get(stack, f"/api/2.0/mlflow/runs/get?run_id={run}", auth=bob).status_code == 200  # a team reads
    for path, body in (
        ("/api/2.0/mlflow/runs/set-tag", {"run_id": run, "key": "owner", "value": "bob"}),
        ("/api/2.0/mlflow/runs/log-metric", {"run_id": run, "key": "loss", "value": 0.0, "timestamp": 1, "step": 1}),
        ("/api/2.0/mlflow/runs/delete", {"run_id": run}),
        ("/api/2.0/mlflow/experiments/update", {"experiment_id": alices_run["experiment"], "new_name": "bobs"}),
        ("/api/2.0/mlflow/runs/create", {"experiment_id": alices_run["experiment"]}),
    ):
        answer = get(stack, path, auth=bob, method="POST", json=body)
        assert answer.status_code == 403, (path, answer.status_code, answer.text[:300])
    # Nor grant itself the right: only the admin (or a manager of the experiment) can.
    selfgrant = get(
        stack,
        "/api/3.0/mlflow/users/permissions/grant",
        auth=bob,
        method="POST",
        json={"username": "bob", "resource_type": "experiment", "resource_id": alices_run["experiment"],
              "permission": "MANAGE"},
    )  # fmt: skip
    assert selfgrant.status_code == 403, selfgrant.text[:300]
    granted = team("user", "grant", "bob", "alice-exp", "EDIT", folder=stack["folder"])
    assert granted.returncode == 0, granted.stderr[-2000:]
    tag = {"run_id": run, "key": "reviewed", "value": "bob"}
    answer = get(stack, "/api/2.0/mlflow/runs/set-tag", auth=bob, method="POST", json=tag)
    assert answer.status_code == 200, answer.text[:300]


def test_the_passwords_are_in_no_log_command_line_run_or_setting(stack, alices_run):
    words = [stack["admin"], *stack["users"].values()]
    folder: Path = stack["folder"]
    places = {p: p.read_bytes() for p in (folder / "logs").rglob("*") if p.is_file()}
    places[folder / "team.json"] = (folder / "team.json").read_bytes()
    places.update({p: p.read_bytes() for p in (folder / "artifacts").rglob("*") if p.is_file()})
    for proc in psutil.process_iter(["cmdline"]):
        places[Path(f"/proc/{proc.pid}/cmdline")] = " ".join(proc.info["cmdline"] or []).encode()
    run = get(stack, f"/api/2.0/mlflow/runs/get?run_id={alices_run['run']}", auth=("admin", stack["admin"])).text
    places[Path("run")] = run.encode()
    tracked = subprocess.run(["git", "grep", "-I", "-l", "-e", words[0], "-e", words[1], "-e", words[2]],
                             cwd=REPO_ROOT, capture_output=True, text=True)  # fmt: skip
    assert tracked.stdout == "", tracked.stdout
    for where, data in places.items():
        for word in words:
            assert word.encode() not in data, f"a password is in {where}"


def test_plain_http_and_an_unverified_certificate_are_refused(stack):
    plain = stack["uri"].replace("https://", "http://")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(plain + "/health", timeout=10)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(stack["uri"] + "/health", timeout=10)  # the system's CAs do not know the stack's
    assert get(stack, "/health").status_code == 200  # with the stack's certificate


def test_the_server_is_never_opened_beyond_loopback_without_both_locks(tmp_path):
    folder = tmp_path / "open"
    for flags, missing in ((["--no-auth"], "authentication"), (["--no-tls"], "TLS")):
        done = team("up", "--listen", "0.0.0.0", *flags, "--port", str(free_port()), "--no-dvc-remote", folder=folder)
        assert done.returncode == 1 and f"needs {missing} on" in done.stderr, done.stderr[-2000:]
        assert not (folder / "run" / "stack.json").exists()
    # A team.json edited by hand to listen beyond loopback with the locks off is refused too.
    folder.mkdir(exist_ok=True)
    (folder / "team.json").write_text(json.dumps({"mlflow_port": free_port(), "postgres_port": free_port(),
                                                  "listen": "0.0.0.0", "auth": False, "tls": False}))  # fmt: skip
    done = team("up", "--no-dvc-remote", folder=folder)
    assert done.returncode == 1 and "beyond loopback, needs authentication and TLS on" in done.stderr, done.stderr


def snapshot(stack, folder: Path) -> dict:
    """Every run the admin sees: its info, params, tags, metric histories and artifact bytes, and
    the DVC remote's files."""
    code = (
        "import json, mlflow\n"
        "c = mlflow.MlflowClient()\n"
        "out = {}\n"
        "def files(run, path=None):\n"
        "    for a in c.list_artifacts(run, path):\n"
        "        yield from files(run, a.path) if a.is_dir else [a.path]\n"
        "for e in c.search_experiments():\n"
        "    for r in c.search_runs([e.experiment_id]):\n"
        "        rid = r.info.run_id\n"
        "        hist = {k: [(m.step, m.value) for m in c.get_metric_history(rid, k)] for k in r.data.metrics}\n"
        "        arts = {p: open(mlflow.artifacts.download_artifacts(run_id=rid, artifact_path=p), 'rb').read().hex()\n"
        "                for p in files(rid)}\n"
        "        out[rid] = {'experiment': e.name, 'status': r.info.status, 'params': r.data.params,\n"
        "                    'tags': r.data.tags, 'metrics': hist, 'artifacts': arts}\n"
        "print(json.dumps(out, sort_keys=True))\n"
    )
    done = as_user(stack, "admin", code)
    assert done.returncode == 0, done.stderr[-3000:]
    remote = {str(p.relative_to(folder)): p.read_bytes() for p in (folder / "dvc-remote").rglob("*") if p.is_file()}
    return {"runs": json.loads(done.stdout.strip().splitlines()[-1]), "remote": remote}


def test_back_up_wipe_restore_and_every_run_artifact_user_and_remote_file_is_back(stack, alices_run, tmp_path):
    """Last in this module: it stops the module's stack, wipes its folder and restores it."""
    folder: Path = stack["folder"]
    (folder / "dvc-remote" / "files" / "md5" / "ab").mkdir(parents=True, exist_ok=True)
    (folder / "dvc-remote" / "files" / "md5" / "ab" / "cdef").write_bytes(b"a pushed output")
    before = snapshot(stack, folder)
    assert alices_run["run"] in before["runs"] and before["runs"][alices_run["run"]]["artifacts"]
    backup = tmp_path / "backup"
    done = team("backup", str(backup), folder=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert backup.stat().st_mode & 0o777 == 0o700
    assert team("down", folder=folder, timeout=180).returncode == 0

    # A damaged backup restores nothing.
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-a", str(backup), str(damaged)], check=True)
    (damaged / "mlflow.dump").write_bytes((damaged / "mlflow.dump").read_bytes()[:-10])
    refused = team("restore", str(damaged), folder=tmp_path / "never")
    assert refused.returncode == 1 and "mlflow.dump differs from its digest" in refused.stderr, refused.stderr
    assert not (tmp_path / "never").exists()
    # Nor over a folder that holds a stack.
    refused = team("restore", str(backup), folder=folder)
    assert refused.returncode == 1 and "not empty" in refused.stderr, refused.stderr

    shutil.rmtree(folder)  # the wipe
    done = team("restore", str(backup), folder=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    started = team("up", "--no-dvc-remote", folder=folder)
    assert started.returncode == 0, started.stderr[-3000:]
    assert snapshot(stack, folder) == before
    # The members log in with the passwords they had, and still nobody else does.
    run = f"/api/2.0/mlflow/runs/get?run_id={alices_run['run']}"
    assert get(stack, run, auth=("alice", stack["users"]["alice"])).status_code == 200
    assert get(stack, run).status_code == get(stack, run, auth=("alice", "guess")).status_code == 401
