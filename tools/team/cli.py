"""`./dev team up|down|status [--dir DIR]`: a team stack on this machine for a trial, all of it
under one folder (default ~/.energy-flow-team, or $ENERGY_FLOW_TEAM_DIR): PostgreSQL, an MLflow
server on it with proxied artifacts, and a DVC remote. docs/team.md explains it.

- `up` starts the stack (tools/team/stack.py, in the background) and returns once MLflow
  answers /health; it prints the `export MLFLOW_TRACKING_URI=...` line on stdout (so
  `eval "$(./dev team up)"` works) and sets the folder's DVC remote as this checkout's default
  in .dvc/config.local (git never sees that file). A stack that runs already is said so, and
  left as it is.
- `down` stops everything `up` started (no process is left) and keeps every byte of the data.
- `status` says whether it runs and where (exit 0), or that it does not (exit 1).
- `copy-store` copies the runs of a store (default: this checkout's mlflow.db) to the server
  (default: the running stack's), skipping those copied before (tools/team/copy_store.py);
  `--verify` then compares the copy field by field (tools/team/store_compare.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from tools.server_keeper import group_members
from tools.servers import http_error
from tools.team import stack
from tools.team.layout import Layout, default_dir, port_in_use, prepare, read_settings

UP_TIMEOUT = 600.0  # s; a first start makes the cluster and MLflow's tables (about half a minute on 2 cores)
DOWN_TIMEOUT = 120.0  # s for the supervisor's own stop before it is killed (its groups then end with it)
GROUP_END_TIMEOUT = 30.0  # s for the servers' groups to be empty once the supervisor is gone
REMOTE_NAME = "team"
POLL_S = 0.2


def running_state(layout: Layout) -> dict | None:
    """The running stack's run/stack.json, or None when no supervisor holds the folder's lock (a
    stale file from a killed one does not count)."""
    if not layout.lock.exists():
        return None
    try:
        with FileLock(layout.lock, blocking=False):
            return None  # free: no supervisor (the lock taken just now is let go at once)
    except Timeout:
        pass  # held: a supervisor lives
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the supervisor writes it right after taking the lock
        try:
            return json.loads(layout.state.read_text())
        except (OSError, ValueError):
            time.sleep(POLL_S)
    return {"pid": None, "groups": [], "ready": False}


def tracking_uri(settings: dict) -> str:
    return f"http://127.0.0.1:{settings['mlflow_port']}"


def log_tails(layout: Layout) -> str:
    from tools.team.postgres import tail

    return "\n".join(f"--- {layout.logs / name} (last lines):\n{tail(layout.logs / name)}" for name in LOGS)


LOGS = ("stack.log", "postgres.log", "mlflow.log")


def start_supervisor(layout: Layout) -> subprocess.Popen:
    """tools/team/stack.py in a session of its own (no terminal's Ctrl-C or hang-up reaches it):
    it outlives this command on purpose, and `down` is what stops it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    with open(layout.logs / "stack.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tools.team.stack", str(layout.root)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until_ready(layout: Layout, settings: dict, proc: subprocess.Popen | None, timeout: float) -> None:
    """Until the supervisor says MLflow answers and /health answers here too. `proc`: the
    supervisor this command started (None: one that ran already)."""
    deadline = time.monotonic() + timeout
    health = f"{tracking_uri(settings)}/health"
    while True:
        if proc is not None and proc.poll() is not None:
            if proc.returncode == stack.ALREADY_RUNNING:  # another `up` won the race: wait for its stack
                proc = None
                continue
            raise PipelineError(
                f"the team stack exited (status {proc.returncode}) before MLflow answered:\n{log_tails(layout)}"
            )
        state = running_state(layout)
        if state is None and proc is None:
            raise PipelineError(f"the team stack stopped before MLflow answered:\n{log_tails(layout)}")
        if state and state.get("ready") and http_error(health) is None:
            return
        if time.monotonic() > deadline:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
            raise PipelineError(
                f"MLflow did not answer {health} within {timeout:g} s; the stack is stopped "
                f"(raise the wait with --start-timeout S):\n{log_tails(layout)}"
            )
        time.sleep(POLL_S)


def configure_dvc_remote(project: Path, remote: Path) -> str:
    """The folder's DVC remote as `project`'s default, in its .dvc/config.local (machine-specific,
    ignored by git through DVC's own .dvc/.gitignore)."""
    command = ["dvc", "remote", "add", "--local", "--force", "--default", REMOTE_NAME, str(remote)]
    if not (project / ".dvc").is_dir():
        return f"no DVC project at {project}: in one, run `{' '.join(command)}`"
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise PipelineError(f"`{' '.join(command)}` in {project} failed:\n{done.stderr[-2000:]}")
    return f"DVC remote '{REMOTE_NAME}' = {remote}, the default of {project} (.dvc/config.local)"


def up(args) -> int:
    layout, settings = prepare(args.dir, args.port)
    state = running_state(layout)
    proc = None
    if state is not None and state.get("ready"):
        if args.port is not None and state.get("mlflow_port") != args.port:
            raise PipelineError(
                f"the team stack in {layout.root} runs already, with MLflow on port {state.get('mlflow_port')}: "
                f"`./dev team down --dir {layout.root}` first to move it to {args.port}"
            )
        settings = {k: state[k] for k in ("mlflow_port", "postgres_port")}
        print(f"[team] the team stack in {layout.root} runs already", file=sys.stderr)
    elif state is None:
        for name, key in (("MLflow", "mlflow_port"), ("PostgreSQL", "postgres_port")):
            if port_in_use(settings[key]):
                raise PipelineError(
                    f"{name}'s port 127.0.0.1:{settings[key]} ({layout.settings}: {key}) is taken by another "
                    f"process; stop it, or choose another port"
                    + (" with --port N" if key == "mlflow_port" else f" by editing {key} in that file")
                )
        print(f"[team] starting the team stack in {layout.root} (logs: {layout.logs})", file=sys.stderr)
        proc = start_supervisor(layout)
    wait_until_ready(layout, settings, proc, args.start_timeout)
    remote = "DVC remote left as it is (--no-dvc-remote)"
    if not args.no_dvc_remote:
        remote = configure_dvc_remote(args.project.resolve(), layout.dvc_remote)
    uri = tracking_uri(settings)
    print(
        f"[team] MLflow at {uri} (PostgreSQL on 127.0.0.1:{settings['postgres_port']}, artifacts in "
        f"{layout.artifacts}); {remote}",
        file=sys.stderr,
    )
    print(
        "[team] in a browser, open the model runs, not the bare URL (MLflow's GenAI home): with the export below, "
        "./dev ui prints their links on this server",
        file=sys.stderr,
    )
    print('[team] to log to it, export this (or: eval "$(./dev team up)"):', file=sys.stderr)
    print(f"export MLFLOW_TRACKING_URI={uri}", flush=True)
    return 0


def down(args) -> int:
    layout = Layout(args.dir.expanduser().resolve())
    state = running_state(layout)
    if state is None:
        print(f"[team] no team stack runs in {layout.root}", file=sys.stderr)
        return 0
    pid, groups = state.get("pid"), state.get("groups", [])
    if pid:
        os.kill(pid, signal.SIGTERM)
    if not wait_for(lambda: running_state(layout) is None, DOWN_TIMEOUT) and pid:
        os.kill(pid, signal.SIGKILL)  # the keepers end the servers' groups when it dies
        wait_for(lambda: running_state(layout) is None, 10)
    if not wait_for(lambda: not any(group_members(g) for g in groups), GROUP_END_TIMEOUT):
        left = sorted(p for g in groups for p in group_members(g))
        raise PipelineError(f"the team stack in {layout.root} is stopped but processes {left} of its groups live on")
    print(f"[team] the team stack is stopped; its data stays in {layout.root}", file=sys.stderr)
    return 0


def status(args) -> int:
    layout = Layout(args.dir.expanduser().resolve())
    state = running_state(layout)
    if state is None:
        known = "" if read_settings(layout) else " (and none was ever started there)"
        print(f"[team] no team stack runs in {layout.root}{known}", file=sys.stderr)
        return 1
    settings = {k: state.get(k) for k in ("mlflow_port", "postgres_port")}
    healthy = bool(state.get("ready")) and http_error(f"{tracking_uri(settings)}/health") is None
    print(
        f"team stack in {layout.root}: supervisor pid {state.get('pid')}, "
        f"{'MLflow answers' if healthy else 'MLflow does not answer (yet)'}"
    )
    print(f"  MLFLOW_TRACKING_URI={tracking_uri(settings)}")
    print(f"  PostgreSQL: 127.0.0.1:{settings['postgres_port']} (data {layout.pgdata})")
    print(f"  artifacts:  {layout.artifacts}")
    print(f"  DVC remote: {layout.dvc_remote}")
    print(f"  logs:       {layout.logs}")
    return 0 if healthy else 1


def copy_store_command(args) -> int:
    from mlflow.exceptions import MlflowException

    from pipeline.tracking.store import project_root
    from tools.team.copy_store import copy_store
    from tools.team.store_compare import store_differences

    source = args.source or f"sqlite:///{project_root() / 'mlflow.db'}"
    dest = args.dest
    if dest is None:
        layout = Layout(args.dir.expanduser().resolve())
        state = running_state(layout)
        if not state or not state.get("ready"):
            raise PipelineError(
                f"no team stack runs in {layout.root} to copy to: start it (`./dev team up`), or name the server "
                "with --to http://HOST:PORT"
            )
        dest = tracking_uri(state)
    print(f"[team] copying the runs of {source} to {dest}", file=sys.stderr)
    try:
        summary = copy_store(source, dest, args.experiment, progress=not args.quiet)
    except MlflowException as e:  # before any run: a store that does not answer, or refuses
        raise PipelineError(f"copying {source} to {dest}: {e.message}") from e
    print(f"[team] {summary.line(source, dest)}", file=sys.stderr)
    if args.verify:
        t0 = time.monotonic()
        found = store_differences(source, dest, args.experiment)
        for line in found[:50]:
            print(f"[team] differs: {line}", file=sys.stderr)
        if found:
            raise PipelineError(f"the copy differs from {source} in {len(found)} places (above, at most 50)")
        print(
            f"[team] verified: the copy of {len(summary.pairs)} runs compares equal to {source}, field by field and "
            f"file by file ({time.monotonic() - t0:.1f} s)",
            file=sys.stderr,
        )
    return 0


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev team", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("up", "start the stack (or say it runs), set the DVC remote, print the tracking URI"),
        ("down", "stop everything `up` started; the data stays"),
        ("status", "whether it runs, and where"),
        ("copy-store", "copy a store's runs (default: this checkout's mlflow.db) to the server"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--dir", type=Path, default=default_dir(), help=f"the stack's folder (default {default_dir()})"
        )
        if name == "up":
            sub.add_argument("--port", type=int, help="MLflow's loopback port (default: the folder's, first 5050)")
            sub.add_argument("--project", type=Path, default=REPO_ROOT, help="the DVC project to set the remote in")
            sub.add_argument("--no-dvc-remote", action="store_true", help="leave the DVC config alone")
            sub.add_argument("--start-timeout", type=float, default=UP_TIMEOUT, metavar="S")
        if name == "copy-store":
            sub.add_argument(
                "--from",
                dest="source",
                metavar="URI",
                help="the store to copy (default: sqlite:///<checkout>/mlflow.db)",
            )
            sub.add_argument(
                "--to", dest="dest", metavar="URI", help="the store to copy to (default: the running stack)"
            )
            sub.add_argument(
                "--experiment",
                action="append",
                metavar="NAME",
                help="copy this experiment only (repeatable; default all)",
            )
            sub.add_argument(
                "--verify", action="store_true", help="then compare the copy with the source, field by field"
            )
            sub.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if getattr(args, "port", None) is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port {args.port}: expected a port 1-65535")
    try:
        commands = {"up": up, "down": down, "status": status, "copy-store": copy_store_command}
        return commands[args.command](args)
    except PipelineError as e:
        print(f"team {args.command}: {e}", file=sys.stderr)
        return 1
