"""Local MLflow servers as child processes: the real `mlflow server` (this venv's) on a loopback
port, `mlflow models serve` and the like (serving), with the process helpers they use (a free
port, ending a process group so that no server outlives the block that started it). The tests
of the tracking server and the UI, the serving benchmark and `./dev ui` (`python -m
tools.servers -- CMD ...`, in the foreground) start theirs here.

A server runs in a process group of its own, led by a keeper (tools/server_keeper.py) that dies
with this process: however this process ends (the block's end, Ctrl-C, SIGTERM, SIGKILL, a
timeout's kill), the server and the processes it started end with it.

    with start_mlflow_server("sqlite:////abs/mlflow.db", tmp_path / "artifacts") as base_url:
        ...  # http://127.0.0.1:PORT, answering /health
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

from pipeline.core.paths import REPO_ROOT

# Environment for the server. Job execution (on by default in MLflow 3.x) starts a job runner
# and ~7 huey consumer processes and leaves a temp dir in /dev/shm per start; the UI pages we
# look at need none of it, and on a 2-core machine it slows the start a lot. Telemetry off: the
# server would otherwise try (and fail, offline) to send usage data.
SERVER_ENV = {
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PYTHONUNBUFFERED": "1",
}
SERVER_START_TIMEOUT = 120.0  # s; far above a start on a loaded 2-core machine
KILL_GRACE = 10.0  # s between SIGTERM and SIGKILL of a process group


def free_port() -> int:
    """A loopback port nobody listens on now (bind to port 0 and let the kernel choose). The port
    is released before the server binds it; a race with another process is possible but rare, and
    then the server exits at once and start_mlflow_server reports its error."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE, reap: tuple[subprocess.Popen, ...] = ()) -> None:
    """End the process group that `proc` leads (started with start_new_session=True or
    process_group=0): SIGTERM, then SIGKILL whatever is left after `grace` seconds. The group,
    not just `proc`, because the MLflow CLI runs uvicorn as a child, which outlives it if only
    the leader dies. `reap`: other children of this process in the group, waited for as the
    leader is. What the group's members started in sessions of their own (sshd's connections) is
    found first, while its parents live, and ended with the group (tools/server_keeper.py)."""
    from tools.server_keeper import escaped_descendants, signal_all

    pgid = proc.pid  # a group leader's pgid is its pid, even after it has exited
    children = (proc, *reap)
    escaped = escaped_descendants(pgid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        escaped = signal_all(escaped, sig)
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            if not escaped:
                break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for child in children:
                child.poll()  # reap our children, or they stay zombies that keep the group "alive"
            escaped = signal_all(escaped, 0)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                if not escaped:
                    return
            time.sleep(0.05)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)


@contextlib.contextmanager
def kept_group(grace: float = KILL_GRACE) -> Iterator[subprocess.Popen]:
    """A new process group whose leader, a keeper (tools/server_keeper.py), ends the group when
    this process dies, however it dies; yields the keeper, whose pid is the group to start the
    server in (Popen(..., process_group=keeper.pid)). The group is ended when the block ends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    keeper = subprocess.Popen(
        [sys.executable, "-m", "tools.server_keeper", str(os.getpid()), str(grace)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
        process_group=0,  # a group of its own in this session: another session's group could not be joined
    )
    try:
        line = keeper.stdout.readline()
        keeper.stdout.close()
        if line.strip() != b"ready":
            raise RuntimeError(f"the server keeper (tools/server_keeper.py) did not start: exit status {keeper.wait()}")
        yield keeper
    finally:
        kill_group(keeper, grace)


def _tail(log, lines: int = 30) -> str:
    """The last `lines` lines of an open log file (binary), as text. pread, not seek+read: the
    child writes through the same open file description, so moving its offset would make the
    child overwrite the log."""
    fd = log.fileno()
    text = os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:]) if text else "(empty)"


@contextlib.contextmanager
def start_mlflow_server(
    backend_store_uri: str, artifacts_dir: Path, timeout: float = SERVER_START_TIMEOUT, port: int | None = None
) -> Iterator[str]:
    """Run the real `mlflow server` (mlflow_server_command) on 127.0.0.1 and a free port (or `port`:
    a server restarted where its clients expect it); yield its base URL (http://127.0.0.1:PORT)
    once it answers /health; kill its whole process group on exit. `backend_store_uri`: e.g.
    sqlite:////abs/path/mlflow.db (an absolute path). `artifacts_dir`: where the server's artifact
    proxy reads and writes, so that it never creates ./mlartifacts in the repo (runs logged straight
    to the store keep their own artifact locations). Raises RuntimeError (with the tail of the
    server's output) if the server exits early or does not answer within `timeout` seconds."""
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    args = mlflow_server_command(backend_store_uri, artifacts_dir, port)
    with serving(args, mlflow_server_env(), f"{base_url}/health", timeout):
        yield base_url


def mlflow_server_command(
    backend_store_uri: str,
    artifacts_dir: Path,
    port: int,
    workers: int = 1,
    host: str = "127.0.0.1",
    auth: bool = False,
    tls: tuple[Path, Path] | None = None,
) -> list[str]:
    """The `mlflow server` command line (this venv's) on `host`:`port`, proxying artifacts to
    `artifacts_dir` (created if missing). One uvicorn worker by default: the UI makes a handful
    of requests and the machines may have 2 cores. Host-header/CORS security middleware stays on:
    its defaults allow localhost and private addresses on any port, which is what a browser on the
    team's network uses. `auth`: MLflow's basic-auth app (its config comes from the environment,
    MLFLOW_AUTH_CONFIG_PATH, never the command line); `tls`: (certificate, key) files for
    uvicorn's own TLS. No secret is ever in the command line (`ps` shows it)."""
    artifacts_dir = Path(artifacts_dir).resolve()
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    mlflow_exe = Path(sys.executable).parent / "mlflow"
    if not os.access(mlflow_exe, os.X_OK):
        raise RuntimeError(
            f"no mlflow executable next to this Python ({mlflow_exe}); run with the project's venv (.venv/bin/python)"
        )
    return [
        str(mlflow_exe),
        "server",
        "--backend-store-uri",
        backend_store_uri,
        "--serve-artifacts",
        "--artifacts-destination",
        str(artifacts_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        *(["--app-name", "basic-auth"] if auth else []),
        *(["--uvicorn-opts", f"--ssl-certfile {tls[0]} --ssl-keyfile {tls[1]}"] if tls else []),
    ]


def mlflow_server_env() -> dict[str, str]:
    """This process's environment for an `mlflow server` (SERVER_ENV), without
    MLFLOW_TRACKING_URI: the server is told its store, and that variable would only confuse it."""
    env = {**os.environ, **SERVER_ENV}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@contextlib.contextmanager
def serving(
    args: list[str], env: dict, ready_url: str, timeout: float, log_path: Path | None = None, cafile: Path | None = None
) -> Iterator[subprocess.Popen]:
    """Run `args` in a kept process group (kept_group: MLflow's CLI starts uvicorn as a child)
    until the block ends, then kill the whole group; enter the block once `ready_url` answers
    HTTP 200, with the process. Output goes to a file, not a pipe: nobody reads a pipe while the
    tests run, and a full pipe would block the server. The file is `log_path` (appended to, kept:
    a long-lived server's log) or a temp file. Raises RuntimeError (with the tail of that output)
    if the process exits early or `ready_url` does not answer within `timeout` seconds."""
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log = tempfile.TemporaryFile(prefix="mlflow-serve-") if log_path is None else open(log_path, "ab")
    with log, kept_group() as keeper:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=keeper.pid
        )
        try:
            _wait_for_server(proc, ready_url, timeout, log, args, cafile)
            yield proc
        finally:
            kill_group(keeper, reap=(proc,))


def run_in_foreground(args: list[str], env: dict | None = None, started: Callable | None = None) -> int:
    """Run `args` (a server a person started, `./dev ui`) in a kept process group, its output on
    this process's, until it exits or this process is stopped (Ctrl-C, SIGTERM, SIGHUP; SIGKILL is
    the keeper's); returns its exit status, or 128 + the signal that stopped it. `started(proc)`,
    if given, runs once the process is started (e.g. waits for it to answer, then says where):
    what it raises ends the group and is raised here."""
    stopped = []

    def stop(signum, frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with kept_group() as keeper:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, env=env, process_group=keeper.pid)
            try:
                if started is not None:
                    started(proc)
                return proc.wait()
            except KeyboardInterrupt:
                return 128 + (stopped[0] if stopped else signal.SIGINT)
            finally:
                kill_group(keeper, reap=(proc,))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def http_error(url: str, cafile: Path | None = None) -> str | None:
    """None when `url` answers HTTP 200, else what it answered or why it did not. `cafile`: the
    certificate an https server's must be (a self-signed one), verified as any other."""
    import ssl

    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as e:
        return str(e)


def _wait_for_server(proc: subprocess.Popen, ready_url: str, timeout: float, log, args, cafile=None) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        last_error = http_error(ready_url, cafile)
        if last_error is None:
            return
        if time.monotonic() > deadline:
            what = f"did not answer {ready_url} within {timeout:g} s (last error: {last_error})"
            break
        time.sleep(0.2)
    else:
        what = f"exited with status {proc.returncode} before answering {ready_url}"
    raise RuntimeError(
        f"{Path(args[0]).name} {args[1]} {what}.\nCommand: {' '.join(args)}\nIts output (last lines):\n{_tail(log)}"
    )


if __name__ == "__main__":
    # python -m tools.servers -- CMD [ARG ...]: CMD in the foreground, in a kept process group.
    command = sys.argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("usage: python -m tools.servers -- CMD [ARG ...]", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(run_in_foreground(command))
    except KeyboardInterrupt:  # Ctrl-C before the server started: the group is ended already
        sys.exit(128 + signal.SIGINT)
