"""`./dev ui [PORT]` (the README's command) serves the MLflow UI on 127.0.0.1 over the store
tracking_uri() names, and only says where to look when that store is a server already."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from pipeline.tracking.views import VIEW_TAG
from tools.servers import free_port, kill_group

pytestmark = pytest.mark.integration


@pytest.mark.slow  # 10-17 s (the UI server's start): the default suite keeps its 10 minutes
def test_dev_ui_serves_the_store_on_loopback_and_prints_its_links_once_it_answers(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # A store from before the experiments had a kind and a saved view: ./dev ui brings it up to date.
    exp_id = MlflowClient(uri).create_experiment("energy-flow", artifact_location=(tmp_path / "a").as_uri())
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen(
        [str(REPO_ROOT / "dev"), "ui", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    link = f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning&viewStateShareKey=evaluation"
    seen = []
    try:
        deadline = time.monotonic() + 120
        while link not in "".join(seen):
            assert time.monotonic() < deadline, f"no link within 120 s:\n{''.join(seen)[-3000:]}"
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)[-3000:]
                continue
            # One of our links printed before the server answers (the server's own log lines may name it).
            if line.startswith("[dev]") and base in line and not seen_answering(base):
                pytest.fail(f"printed {line.strip()!r} while {base}/health did not answer")
            seen.append(line)
        # At the moment the link is printed it opens, at once: one request, no retry.
        with urllib.request.urlopen(link, timeout=5) as r:
            assert r.status == 200
        assert "[dev] starting the MLflow UI" in "".join(seen)
        with urllib.request.urlopen(f"{base}/ajax-api/2.0/mlflow/experiments/search?max_results=10", timeout=5) as r:
            names = [e["name"] for e in json.load(r)["experiments"]]
        assert "energy-flow" in names
        assert listening_addresses(port) == {"127.0.0.1"}  # loopback only, not 0.0.0.0
        tags = MlflowClient(uri).get_experiment(exp_id).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development" and VIEW_TAG in tags
        # Then the arms (none yet: nothing evaluated), and one uvicorn worker: one process serves.
        while "[dev] arms:" not in "".join(seen):
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        assert "[dev] arms: no evaluated model run in 'energy-flow'" in "".join(seen), "".join(seen)[-3000:]
        servers = [c for c in session_commands(proc.pid) if "uvicorn" in " ".join(c) or "--workers" in c]
        assert servers and all(c[c.index("--workers") + 1] == "1" for c in servers if "--workers" in c), servers
        assert sum("multiprocessing" in " ".join(c) for c in session_commands(proc.pid)) == 0
    finally:
        kill_group(proc)


def session_commands(sid: int) -> list[list[str]]:
    """The command lines of the processes in session `sid` (what ./dev ui started)."""
    out = []
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                out.append(open(f"/proc/{stat}/cmdline").read().split("\0")[:-1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def seen_answering(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_dev_ui_points_at_a_tracking_server_instead_of_starting_one():
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:5999"}
    proc = subprocess.run(
        [str(REPO_ROOT / "dev"), "ui"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "is a tracking server already" in proc.stderr
    assert "http://127.0.0.1:5999  (the tracking server does not answer:" in proc.stdout


def listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a socket listening on `port` (from /proc/net/tcp; IPv6 listeners in
    /proc/net/tcp6 are reported as "ipv6")."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0)) if len(addr) == 8 else "ipv6")
    return found
