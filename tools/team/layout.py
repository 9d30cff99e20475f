"""The one folder a team stack lives in (`./dev team up --dir DIR`), and what it holds: docs/team.md
("The folder") draws it. Nothing here starts anything: tools/team/stack.py runs the servers,
tools/team/cli.py the commands."""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path

from pipeline.core.atomic import write_json
from pipeline.core.errors import PipelineError
from tools.servers import free_port

# Outside any checkout: every clone and worktree on the machine shares one stack, and neither
# `git clean -fdx` nor a fresh clone loses its runs; git and DVC never see it.
DEFAULT_DIR = Path("~/.energy-flow-team")
DIR_ENV = "ENERGY_FLOW_TEAM_DIR"
DEFAULT_MLFLOW_PORT = 5050  # not 5000: `./dev ui` takes that one
DEFAULT_SSH_PORT = 2222  # the DVC remote's sshd (tools/team/ssh.py): not 22, the machine's own sshd's
PRIVATE = 0o700
SECRET = 0o600
# Where MLflow listens, its locks (tools/team/auth.py) and whether sshd serves the DVC remote
# (tools/team/ssh.py), as `up` sets them; a folder from before them is a loopback stack without any.
NETWORK_DEFAULTS = {"listen": "127.0.0.1", "auth": False, "tls": False, "ssh": False}
EVERY_ADDRESS = ("0.0.0.0", "::")  # listening on these, a server is reached here on loopback
DATABASE = "mlflow"  # the database and the role the MLflow server logs in as (not a superuser)
SUPERUSER = "postgres"


def default_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser()


class Layout:
    """The paths of the folder (docs/team.md shows them). `state`, run/stack.json: the
    supervisor's pid, its process groups, and `ready` once MLflow answers."""

    def __init__(self, root: Path):
        self.root = root
        self.settings = root / "team.json"
        self.secrets = root / "secrets"
        self.password_file = self.secrets / "postgres.password"
        self.pgpass = self.secrets / "pgpass"
        # With authentication (tools/team/auth.py): the MLflow admin's password, the key MLflow
        # signs its CSRF tokens with, its auth app's config, the members' passwords, TLS.
        self.admin_password = self.secrets / "mlflow-admin.password"
        self.flask_secret = self.secrets / "mlflow-flask.secret"
        self.auth_config = self.secrets / "basic_auth.ini"
        self.users = self.secrets / "users"
        self.tls_dir = self.secrets / "tls"
        self.tls_cert = self.tls_dir / "cert.pem"
        self.tls_key = self.tls_dir / "key.pem"
        # The DVC remote over SSH (tools/team/ssh.py): sshd's host key and the members' public keys.
        self.ssh_dir = self.secrets / "ssh"
        self.ssh_host_key = self.ssh_dir / "host_ed25519"
        self.authorized_keys = self.ssh_dir / "authorized_keys"
        self.pgdata = root / "postgres"
        self.artifacts = root / "artifacts"
        self.dvc_remote = root / "dvc-remote"
        self.logs = root / "logs"
        self.run = root / "run"
        self.lock = self.run / "stack.lock"
        self.state = self.run / "stack.json"

    def cafile(self, settings: dict) -> Path | None:
        """The certificate a client verifies the server by (None: plain http)."""
        return self.tls_cert if settings.get("tls") else None


def prepare(
    root: Path, mlflow_port: int | None = None, network: dict | None = None, ssh_port: int | None = None
) -> tuple[Layout, dict]:
    """The folder made (or found) and its settings: {"mlflow_port", "postgres_port", "ssh_port",
    "listen", "auth", "tls", "ssh"}. Ports are chosen at the first call (`mlflow_port` or
    DEFAULT_MLFLOW_PORT, `ssh_port` or DEFAULT_SSH_PORT; PostgreSQL a free one) and kept; a port
    given later moves its server there. `network`: {"listen", "auth", "tls", "ssh"} as `up` was
    asked (tools/team/cli.py checks them), kept for the next start. The password is made once."""
    layout = Layout(root.expanduser().resolve())
    if layout.root.exists() and not layout.root.is_dir():
        raise PipelineError(
            f"team stack folder {layout.root}: exists and is not a folder; expected a folder or nothing"
        )
    for folder in (layout.root, layout.secrets, layout.logs, layout.run):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(PRIVATE)
    layout.artifacts.mkdir(exist_ok=True)
    layout.dvc_remote.mkdir(exist_ok=True)
    settings = read_settings(layout)
    changed = not settings
    if mlflow_port is not None and settings.get("mlflow_port") != mlflow_port:
        settings["mlflow_port"], changed = mlflow_port, True
    if ssh_port is not None and settings.get("ssh_port") != ssh_port:
        settings["ssh_port"], changed = ssh_port, True
    settings.setdefault("mlflow_port", DEFAULT_MLFLOW_PORT)
    settings.setdefault("ssh_port", DEFAULT_SSH_PORT)
    settings.setdefault("postgres_port", free_port())
    for key, default in NETWORK_DEFAULTS.items():
        if network is not None and settings.get(key, default) != network[key]:
            settings[key], changed = network[key], True
        settings.setdefault(key, default)
    if changed:
        write_json(layout.settings, settings)
    if not layout.password_file.exists():
        write_secret(layout.password_file, secrets.token_urlsafe(32) + "\n")
    return layout, settings


def read_settings(layout: Layout) -> dict:
    """team.json, or {} before the first `up`."""
    if not layout.settings.exists():
        return {}
    try:
        settings = json.loads(layout.settings.read_text())
    except (OSError, ValueError) as e:
        raise PipelineError(f"{layout.settings}: unreadable ({e}); expected the JSON `./dev team up` wrote") from e
    for key in ("mlflow_port", "postgres_port", "ssh_port"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, int) and 1 <= value <= 65535):
            raise PipelineError(f"{layout.settings}: {key} = {value!r}; expected a port 1-65535")
    return settings


def password(layout: Layout) -> str:
    return layout.password_file.read_text().strip()


def write_secret(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only from the first byte on (created 0600, not chmod-ed after)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_pgpass(layout: Layout, port: int) -> None:
    """libpq's password file for 127.0.0.1:`port`, any database and role (one password). libpq
    ignores the file unless it is 0600. (token_urlsafe makes no ':' or '\\' to escape.)"""
    write_secret(layout.pgpass, f"127.0.0.1:{port}:*:*:{password(layout)}\n")


def local_address(listen: str) -> str:
    """Where this machine reaches a server that listens on `listen`."""
    return "127.0.0.1" if listen in EVERY_ADDRESS else listen


def port_in_use(port: int) -> bool:
    """Something listens on 127.0.0.1:`port` (or holds it): binding it fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
