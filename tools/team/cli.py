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
import socket
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.core.environment import temporary_env
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from tools.server_keeper import group_members
from tools.servers import http_error
from tools.team import auth, ssh, stack
from tools.team.layout import EVERY_ADDRESS, NETWORK_DEFAULTS, Layout, default_dir, port_in_use, prepare, read_settings

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
    return stack.local_uri(settings)


NETWORK = tuple(NETWORK_DEFAULTS)
PORTS = ("mlflow_port", "postgres_port", "ssh_port")


def network_settings(args, layout: Layout) -> dict | None:
    """{"listen", "auth", "tls", "ssh"} as `up` is asked (the folder's where a flag is not given),
    or None when nothing is asked. Beyond loopback authentication and TLS are on, and a request to
    turn either off there is refused: the server would take anyone's requests, or passwords in
    clear text, from the network. Beyond loopback the DVC remote is served over SSH too, unless
    --no-ssh (then the other machines have no remote)."""
    asked = {"listen": args.listen, "auth": args.auth, "tls": args.tls, "ssh": args.ssh}
    if all(v is None for v in asked.values()):
        settings = read_settings(layout)
        if settings and not auth.is_loopback(settings.get("listen", "127.0.0.1")):
            check_locked(settings, f"{layout.settings}")
        return None
    kept = read_settings(layout)
    listen = asked["listen"] or kept.get("listen", "127.0.0.1")
    beyond = not auth.is_loopback(listen)

    def lock(key: str) -> bool:
        """The flag as given; else on beyond loopback; else the folder's."""
        if asked[key] is not None:
            return bool(asked[key])
        return True if beyond else bool(kept.get(key, False))

    network = {"listen": listen, "auth": lock("auth"), "tls": lock("tls"), "ssh": lock("ssh")}
    check_locked(network, "--listen")
    return network


def check_locked(network: dict, where: str) -> None:
    if auth.is_loopback(network["listen"]):
        return
    off = [name for name, key in (("authentication", "auth"), ("TLS", "tls")) if not network.get(key)]
    if off:
        raise PipelineError(
            f"{where}: listening on {network['listen']}, beyond loopback, needs {' and '.join(off)} on: without "
            "them anyone on the network reads and writes every run, or reads the members' passwords on the "
            "wire. Leave --no-auth/--no-tls out (beyond loopback both are on by default), or listen on "
            "127.0.0.1"
        )


def log_tails(layout: Layout) -> str:
    from tools.team.postgres import tail

    names = [name for name in LOGS if name != "sshd.log" or (layout.logs / name).exists()]  # sshd's: with --ssh
    return "\n".join(f"--- {layout.logs / name} (last lines):\n{tail(layout.logs / name)}" for name in names)


LOGS = ("stack.log", "postgres.log", "mlflow.log", "sshd.log")


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
    cafile = layout.cafile(settings)
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
        if state and state.get("ready") and http_error(health, cafile) is None:
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
    layout = Layout(args.dir.expanduser().resolve())
    network = network_settings(args, layout)
    state = running_state(layout)
    if state is not None and state.get("ready") and network is not None:
        now = {k: state.get(k, d) for k, d in NETWORK_DEFAULTS.items()}
        if now != network:
            raise PipelineError(
                f"the team stack in {layout.root} runs already, {describe(now)}: `./dev team down --dir "
                f"{layout.root}` first to start it {describe(network)}"
            )
    if state is None and (network or read_settings(layout)).get("ssh"):
        ssh.check(layout)  # before anything is made or started: sshd could not confine the members
    layout, settings = prepare(args.dir, args.port, network, args.ssh_port)
    proc = None
    if state is not None and state.get("ready"):
        if args.port is not None and state.get("mlflow_port") != args.port:
            raise PipelineError(
                f"the team stack in {layout.root} runs already, with MLflow on port {state.get('mlflow_port')}: "
                f"`./dev team down --dir {layout.root}` first to move it to {args.port}"
            )
        if args.ssh_port is not None and state.get("ssh_port") != args.ssh_port:
            raise PipelineError(
                f"the team stack in {layout.root} runs already, with sshd on port {state.get('ssh_port')}: "
                f"`./dev team down --dir {layout.root}` first to move it to {args.ssh_port}"
            )
        settings = {k: state.get(k, settings.get(k)) for k in (*PORTS, *NETWORK)}
        print(f"[team] the team stack in {layout.root} runs already", file=sys.stderr)
    elif state is None:
        servers = (("MLflow", "mlflow_port"), ("PostgreSQL", "postgres_port"), ("sshd", "ssh_port"))
        for name, key in servers[: 3 if settings.get("ssh") else 2]:
            if port_in_use(settings[key]):
                raise PipelineError(
                    f"{name}'s port 127.0.0.1:{settings[key]} ({layout.settings}: {key}) is taken by another "
                    f"process; stop it, or choose another port"
                    + {"mlflow_port": " with --port N", "ssh_port": " with --ssh-port N"}.get(
                        key, f" by editing {key} in that file"
                    )
                )
        print(f"[team] starting the team stack in {layout.root} (logs: {layout.logs})", file=sys.stderr)
        proc = start_supervisor(layout)
    wait_until_ready(layout, settings, proc, args.start_timeout)
    remote = "DVC remote left as it is (--no-dvc-remote)"
    if not args.no_dvc_remote:
        remote = configure_dvc_remote(args.project.resolve(), layout.dvc_remote)
    uri = tracking_uri(settings)
    print(
        f"[team] MLflow at {uri}, {describe(settings)} (PostgreSQL on 127.0.0.1:{settings['postgres_port']}, "
        f"artifacts in {layout.artifacts}); {remote}",
        file=sys.stderr,
    )
    if settings.get("ssh"):
        print(f"[team] {ssh_remote_line(layout, settings)}", file=sys.stderr)
    if settings.get("auth"):
        print(
            f"[team] the admin's password is in {layout.admin_password} (0600); add members with "
            '`./dev team user add NAME` (docs/team.md, "A team server others can reach")',
            file=sys.stderr,
        )
    print(
        "[team] in a browser, open the model runs, not the bare URL (MLflow's GenAI home): with the export below, "
        "./dev ui prints their links on this server",
        file=sys.stderr,
    )
    print('[team] to log to it, export this (or: eval "$(./dev team up)"):', file=sys.stderr)
    print("\n".join(auth.exports(layout, settings, uri)), flush=True)
    return 0


def ssh_remote_line(layout: Layout, settings: dict) -> str:
    url = ssh.remote_url(member_host(settings["listen"]), settings["ssh_port"])
    return (
        f"the DVC remote for other machines: {url} over SSH (sshd's host key {ssh.host_key_fingerprint(layout)}); "
        "let a member in with `./dev team user key NAME THEIR_KEY.pub`, and they run, in their checkout: "
        + "; ".join(ssh.member_commands(url, REMOTE_NAME))
    )


def member_host(listen: str) -> str:
    """The name other machines reach this one by: the address it listens on, or, listening on
    every address, the machine's name."""
    return socket.getfqdn() if listen in EVERY_ADDRESS else listen


def describe(network: dict) -> str:
    locks = [name for name, key in (("authentication", "auth"), ("TLS", "tls")) if network.get(key)]
    with_ = " and ".join(locks) or "neither authentication nor TLS"
    remote = f", the DVC remote over SSH on port {network.get('ssh_port')}" if network.get("ssh") else ""
    return f"listening on {network.get('listen', '127.0.0.1')} with {with_}{remote}"


def running_stack(args) -> tuple[Layout, dict, str]:
    """The folder, its running stack's state and its URI, or an error saying to start it."""
    layout = Layout(args.dir.expanduser().resolve())
    state = running_state(layout)
    if not state or not state.get("ready"):
        raise PipelineError(f"no team stack runs in {layout.root}: start it (`./dev team up`)")
    return layout, state, tracking_uri(state)


def backup_command(args) -> int:
    from tools.team.backup import backup

    layout, state, _ = running_stack(args)
    dest = args.dest.expanduser().resolve()
    print(f"[team] backing up the stack in {layout.root} into {dest}", file=sys.stderr)
    made = backup(layout, state, dest)
    print(
        f"[team] backed up databases {', '.join(made['databases'])} and {len(made['files'])} files "
        f"({made['bytes'] / 1e6:.1f} MB) in {made['seconds']:.1f} s into {dest} (0700: it holds the stack's "
        "passwords; keep it as private as the stack's folder)",
        file=sys.stderr,
    )
    return 0


def restore_command(args) -> int:
    from tools.team.backup import restore

    layout = Layout(args.dir.expanduser().resolve())
    if running_state(layout) is not None:
        raise PipelineError(f"a team stack runs in {layout.root}: restore makes a new folder; choose another --dir")
    src = args.src.expanduser().resolve()
    print(f"[team] restoring {src} into {layout.root}", file=sys.stderr)
    made = restore(src, layout.root)
    print(
        f"[team] restored databases {', '.join(made['databases'])} and {len(made['files'])} files into "
        f"{layout.root}; start it with `./dev team up --dir {layout.root}`",
        file=sys.stderr,
    )
    return 0


def user(args) -> int:
    if args.action == "key":
        return user_key(Layout(args.dir.expanduser().resolve()), args.name, args.keyfile)
    layout, state, uri = running_stack(args)
    if args.action == "add":
        if args.ssh_key is not None:
            ssh.read_public_key(args.ssh_key)  # a bad key file stops it before the user is made
        path = auth.add_user(layout, state, uri, args.name)
        print(
            f"[team] user {args.name} made on {uri}; the password is in {path} (0600): hand it over privately. "
            f"They set MLFLOW_TRACKING_URI={uri}, MLFLOW_TRACKING_USERNAME={args.name} and MLFLOW_TRACKING_PASSWORD"
            + (f", and MLFLOW_TRACKING_SERVER_CERT_PATH to a copy of {layout.tls_cert}" if state.get("tls") else ""),
            file=sys.stderr,
        )
        return user_key(layout, args.name, args.ssh_key) if args.ssh_key is not None else 0
    experiment_id = auth.grant(layout, state, uri, args.name, args.experiment, args.permission)
    print(
        f"[team] {args.name} has {args.permission} on experiment {args.experiment!r} (id {experiment_id})",
        file=sys.stderr,
    )
    return 0


def user_key(layout: Layout, name: str, keyfile: Path) -> int:
    """A member's public key let in to the DVC remote over SSH (sshd reads the file at each login:
    no restart)."""
    auth.check_user_name(name)
    if not layout.settings.exists():
        raise PipelineError(f"no team stack folder at {layout.root}: make it with `./dev team up --ssh`")
    fingerprint = ssh.add_key(layout, name, keyfile.expanduser())
    settings = read_settings(layout)
    print(f"[team] {name}'s key {fingerprint} can use the DVC remote over SSH", file=sys.stderr)
    if settings.get("ssh"):
        print(f"[team] {ssh_remote_line(layout, settings)}", file=sys.stderr)
    else:
        print("[team] this stack serves no SSH yet: `./dev team down`, then `./dev team up --ssh`", file=sys.stderr)
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
    cafile = layout.cafile(state)
    healthy = bool(state.get("ready")) and http_error(f"{tracking_uri(state)}/health", cafile) is None
    print(
        f"team stack in {layout.root}: supervisor pid {state.get('pid')}, "
        f"{'MLflow answers' if healthy else 'MLflow does not answer (yet)'}"
    )
    print(f"  MLFLOW_TRACKING_URI={tracking_uri(state)} ({describe(state)})")
    print(f"  PostgreSQL: 127.0.0.1:{settings['postgres_port']} (data {layout.pgdata})")
    print(f"  artifacts:  {layout.artifacts}")
    print(f"  DVC remote: {layout.dvc_remote}")
    if state.get("ssh"):
        print(f"  over SSH:   {ssh.remote_url(member_host(state['listen']), state['ssh_port'])} "
              f"(host key {ssh.host_key_fingerprint(layout)}; members' keys in {layout.authorized_keys})")  # fmt: skip
    print(f"  logs:       {layout.logs}")
    return 0 if healthy else 1


def copy_store_command(args) -> int:
    from mlflow.exceptions import MlflowException

    from pipeline.tracking.store import project_root
    from tools.team.copy_store import copy_store
    from tools.team.store_compare import store_differences

    source = args.source or f"sqlite:///{project_root() / 'mlflow.db'}"
    dest, credentials = args.dest, {}
    if dest is None:
        layout = Layout(args.dir.expanduser().resolve())
        state = running_state(layout)
        if not state or not state.get("ready"):
            raise PipelineError(
                f"no team stack runs in {layout.root} to copy to: start it (`./dev team up`), or name the server "
                "with --to http://HOST:PORT"
            )
        dest = tracking_uri(state)
        credentials = auth.client_env(layout, state)  # the stack's admin, where it has authentication
    print(f"[team] copying the runs of {source} to {dest}", file=sys.stderr)
    try:
        with temporary_env(credentials):
            summary = copy_store(source, dest, args.experiment, progress=not args.quiet)
    except MlflowException as e:  # before any run: a store that does not answer, or refuses
        raise PipelineError(f"copying {source} to {dest}: {e.message}") from e
    print(f"[team] {summary.line(source, dest)}", file=sys.stderr)
    if args.verify:
        t0 = time.monotonic()
        with temporary_env(credentials):
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
        ("user", "the server's members (with authentication): add one, or grant one a permission"),
        ("backup", "back the running stack's databases, artifacts, DVC remote and secrets up into a new folder"),
        ("restore", "make a stack folder (missing or empty) from a backup; then `up` starts it"),
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
            sub.add_argument(
                "--listen",
                metavar="ADDR",
                help="the address MLflow listens on (default: the folder's, first 127.0.0.1); beyond loopback "
                "(0.0.0.0, an interface's address) authentication and TLS are on and cannot be turned off",
            )
            sub.add_argument(
                "--auth",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="MLflow's basic-auth app: users, passwords and per-experiment permissions in PostgreSQL",
            )
            sub.add_argument(
                "--tls",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="https with a self-signed certificate made into DIR/secrets/tls/ (clients verify it)",
            )
            sub.add_argument(
                "--ssh",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="serve the DVC remote to other machines over SSH: Debian's sshd on --ssh-port, members' keys "
                "only, SFTP only, confined to the remote's folder (needs root; default: on beyond loopback)",
            )
            sub.add_argument("--ssh-port", type=int, help="sshd's port (default: the folder's, first 2222)")
        if name == "backup":
            sub.add_argument("dest", type=Path, help="a new (or empty) folder for the backup")
        if name == "restore":
            sub.add_argument("src", type=Path, help="a folder `backup` made")
        if name == "user":
            actions = sub.add_subparsers(dest="action", required=True)
            add = actions.add_parser("add", help="a new member, with a generated password written to a 0600 file")
            add.add_argument("name")
            add.add_argument("--ssh-key", type=Path, metavar="FILE", help="and their public key, as `user key` does")
            key = actions.add_parser(
                "key", help="let a member's public key (FILE, e.g. id_ed25519.pub) in to the DVC remote over SSH"
            )
            key.add_argument("name")
            key.add_argument("keyfile", type=Path, metavar="FILE")
            given = actions.add_parser(
                "grant", help="a member's permission on an experiment: READ, EDIT, MANAGE or NO_PERMISSIONS"
            )
            given.add_argument("name")
            given.add_argument("experiment", help="the experiment's name")
            given.add_argument("permission", choices=auth.PERMISSIONS)
            for action in (add, given, key):  # `user add NAME --dir DIR` as well as `user --dir DIR add NAME`
                action.add_argument("--dir", type=Path, default=argparse.SUPPRESS, help="the stack's folder")
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
    for flag in ("port", "ssh_port"):
        value = getattr(args, flag, None)
        if value is not None and not 1 <= value <= 65535:
            parser.error(f"--{flag.replace('_', '-')} {value}: expected a port 1-65535")
    try:
        commands = {
            "up": up,
            "down": down,
            "status": status,
            "copy-store": copy_store_command,
            "user": user,
            "backup": backup_command,
            "restore": restore_command,
        }
        return commands[args.command](args)
    except PipelineError as e:
        print(f"team {args.command}: {e}", file=sys.stderr)
        return 1
