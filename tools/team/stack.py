"""The team stack's supervisor: `python -m tools.team.stack DIR`, which `./dev team up` starts in
a session of its own and leaves running, and `./dev team down` stops with SIGTERM (SIGINT or
SIGHUP too). docs/team.md ("How it runs and stops") says what it holds, runs and writes: the
folder's lock for as long as it lives, PostgreSQL, MLflow and (with --ssh) sshd each in a kept
process group (tools/servers.py), DIR/run/stack.json; sshd stopped first, then MLflow, and
PostgreSQL last with a fast shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.core.atomic import write_json
from pipeline.core.errors import PipelineError, Terminated
from tools.servers import mlflow_server_command, mlflow_server_env, serving
from tools.team import auth, postgres, ssh
from tools.team.layout import DATABASE, Layout, local_address, password, prepare, write_pgpass

ALREADY_RUNNING = 3  # exit status when another supervisor holds the folder's lock
MLFLOW_START_TIMEOUT = 300.0  # s; the first start creates MLflow's tables in PostgreSQL
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
POLL_S = 0.5


def say(message: str) -> None:
    print(f"[team stack {time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", flush=True)


def backend_store_uri(port: int) -> str:
    """No password in it: the server's libpq reads it from DIR/secrets/pgpass (PGPASSFILE), so it
    is in no command line that `ps` shows and in nothing MLflow records."""
    return f"postgresql+psycopg2://{DATABASE}@127.0.0.1:{port}/{DATABASE}"


def local_uri(settings: dict) -> str:
    """The server's URI from this machine: https with TLS; the address it listens on, or
    loopback when it listens on every address."""
    host = local_address(settings.get("listen") or "127.0.0.1")
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if settings.get('tls') else 'http'}://{host}:{settings['mlflow_port']}"


def take_lock(layout: Layout) -> FileLock | None:
    """The folder's lock, held until this process ends (the descriptor is not inherited by the
    servers: Python opens it close-on-exec); None if another process holds it."""
    lock = FileLock(layout.lock, mode=0o600, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


def run(layout: Layout, settings: dict) -> int:
    if not auth.is_loopback(settings["listen"]) and not (settings.get("auth") and settings.get("tls")):
        # `up` refuses this too; a team.json edited by hand must not open the server either.
        raise PipelineError(
            f"{layout.settings}: listen = {settings['listen']} (beyond loopback) without authentication and TLS"
        )
    state = {"pid": os.getpid(), "groups": [], "ready": False, **settings}
    write_json(layout.state, state)
    pg_port, mlflow_port = settings["postgres_port"], settings["mlflow_port"]
    write_pgpass(layout, pg_port)
    os.environ["PGPASSFILE"] = str(layout.pgpass)  # for the MLflow server's libpq (mlflow_server_env copies it)
    if postgres.initialise(layout):
        say(f"made a new PostgreSQL cluster in {layout.pgdata}")
    with postgres.running(layout, pg_port, layout.logs / "postgres.log") as pg:
        state["groups"].append(os.getpgid(pg.pid))
        write_json(layout.state, state)
        with_auth, tls = bool(settings.get("auth")), bool(settings.get("tls"))
        postgres.ensure_database(pg_port, password(layout), (auth.AUTH_DATABASE,) if with_auth else ())
        say(f"PostgreSQL takes logins on 127.0.0.1:{pg_port}")
        env = mlflow_server_env()
        if with_auth:
            auth.ensure_secrets(layout)
            auth.write_auth_config(layout, pg_port)
            env.update(auth.server_env(layout))
        if tls:
            auth.ensure_certificate(layout, settings["listen"])
        command = mlflow_server_command(
            backend_store_uri(pg_port),
            layout.artifacts,
            mlflow_port,
            host=settings["listen"],
            auth=with_auth,
            tls=(layout.tls_cert, layout.tls_key) if tls else None,
        )
        health = f"{local_uri(settings)}/health"
        log = layout.logs / "mlflow.log"
        with contextlib.ExitStack() as servers:
            ml = servers.enter_context(
                serving(command, env, health, MLFLOW_START_TIMEOUT, log, layout.cafile(settings))
            )
            state["groups"].append(os.getpgid(ml.pid))
            watched = {"PostgreSQL": pg, "the MLflow server": ml}
            if settings.get("ssh"):
                sshd = servers.enter_context(
                    ssh.serving(layout, settings["listen"], settings["ssh_port"], layout.logs / "sshd.log")
                )
                state["groups"].append(os.getpgid(sshd.pid))
                watched["sshd"] = sshd
                say(f"sshd serves the DVC remote {layout.dvc_remote} on {settings['listen']}:{settings['ssh_port']}")
            state["ready"] = True
            write_json(layout.state, state)
            locks = ", ".join(filter(None, ("authentication" if with_auth else "", "TLS" if tls else ""))) or "no locks"
            say(f"MLflow answers on {local_uri(settings)} (listening on {settings['listen']}; {locks})")
            while all(proc.poll() is None for proc in watched.values()):
                time.sleep(POLL_S)
            gone, code = next((name, proc.returncode) for name, proc in watched.items() if proc.poll() is not None)
            say(f"{gone} exited on its own (status {code}): stopping the stack")
            return 1


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.team.stack DIR", file=sys.stderr)
        return 2
    layout, settings = prepare(Path(argv[0]))
    lock = take_lock(layout)
    if lock is None:
        say(f"another stack holds {layout.lock}: it runs already")
        return ALREADY_RUNNING
    stopping: list[int] = []

    def stop(signum, frame):
        if not stopping:  # later signals wait for the stop under way
            stopping.append(signum)
            raise Terminated(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    try:
        return run(layout, settings)
    except Terminated as e:
        say(f"stopped by signal {e.signum}")
        return 0
    except (PipelineError, RuntimeError) as e:
        say(f"could not run: {e}")
        return 1
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        layout.state.unlink(missing_ok=True)
        say("the servers are stopped; the data stays in " + str(layout.root))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
