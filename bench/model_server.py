"""`mlflow models serve` of one model on a free loopback port, for bench.serve and the tests:
started in its own session, waited for until it answers /ping, and ended with its whole process
group (the CLI runs uvicorn as a child, which would outlive the leader).

    with model_server("models:/<model_id>", tracking_uri) as base_url:
        ...  # http://127.0.0.1:PORT: GET /ping, POST /invocations
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import psutil

from tools.servers import free_port, serving

# Loading the model means loading the teacher, and a busy machine can take many times as long:
# the limit only catches a server that never comes up.
START_TIMEOUT_S = 120.0
# Offline: the bundled teacher loads from its package, and nothing may reach a hub.
SERVER_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "PYTHONUNBUFFERED": "1"}
SERVER_ENV |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@contextlib.contextmanager
def model_server(model_uri: str, tracking_uri: str = "", timeout: float = START_TIMEOUT_S) -> Iterator[str]:
    """Serve `model_uri` (a runs:/ URI is looked up in `tracking_uri`) with this venv's mlflow,
    in this environment (--env-manager local); yield its base URL once /ping answers 200."""
    with served_model(model_uri, tracking_uri, timeout) as (base_url, _):
        yield base_url


def tree_cpu_s(proc: subprocess.Popen) -> float:
    """CPU seconds (user + system) spent so far by `proc` and every process under it (MLflow's
    CLI starts uvicorn as a child, which answers the requests)."""
    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:  # a child that ended between the listing and the read
            continue
        total += t.user + t.system
    return total


@contextlib.contextmanager
def served_model(
    model_uri: str, tracking_uri: str = "", timeout: float = START_TIMEOUT_S
) -> Iterator[tuple[str, subprocess.Popen]]:
    """model_server, yielding (base URL, the server's process) so a caller can read its CPU time."""
    bin_dir = Path(sys.executable).parent
    port = free_port()
    args = [str(bin_dir / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local"]
    args += ["-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    env = {**os.environ, **SERVER_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # uvicorn
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    base_url = f"http://127.0.0.1:{port}"
    with serving(args, env, f"{base_url}/ping", timeout) as proc:
        yield base_url, proc


def invoke(base_url: str, payload: dict, timeout: float = 120.0) -> tuple[int, dict]:
    """POST `payload` to /invocations; (HTTP status, the JSON body), errors included."""
    req = urllib.request.Request(
        f"{base_url}/invocations", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def questions_payload(questions: list[str], k: int = 5) -> dict:
    return {"dataframe_split": {"columns": ["question"], "data": [[q] for q in questions]}, "params": {"k": k}}


@contextlib.contextmanager
def project_server(
    model_uri: str, tracking_uri: str = "", limits: dict | None = None, timeout: float = START_TIMEOUT_S
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve `model_uri` with the project's server (tools/serve.py, `./dev serve`: MLflow's
    scoring app behind the request body limit) on a free loopback port; yield (base URL, the
    server process) once /ping answers 200. `limits`: tools.serve flags without their dashes,
    e.g. {"max_rows": 8}."""
    port = free_port()
    args = [sys.executable, "-m", "tools.serve", "--model", model_uri, "--host", "127.0.0.1", "--port", str(port)]
    for flag, value in (limits or {}).items():
        args += [f"--{flag.replace('_', '-')}", str(value)]
    env = {**os.environ, **SERVER_ENV}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    base_url = f"http://127.0.0.1:{port}"
    with serving(args, env, f"{base_url}/ping", timeout) as proc:
        yield base_url, proc


def post(base_url: str, body: bytes, timeout: float = 120.0) -> tuple[int, dict]:
    """POST raw `body` (JSON or not) to /invocations; (HTTP status, the JSON body or {"text": ...})."""
    req = urllib.request.Request(f"{base_url}/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, {"text": raw.decode("utf-8", "replace")}
