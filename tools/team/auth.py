"""The team server's locks: MLflow's own authentication app and TLS (docs/team.md, "A team
server others can reach").

- Authentication is MLflow's basic-auth app (`mlflow server --app-name basic-auth`): its users,
  passwords (salted hashes) and per-experiment permissions live in a database of their own,
  `mlflow_auth`, on the stack's PostgreSQL. The admin's password is generated into
  DIR/secrets/mlflow-admin.password (0600) and handed to the server at its first start through
  its environment (MLFLOW_AUTH_ADMIN_PASSWORD), never a command line or a config file; a member's
  (`./dev team user add NAME`) into DIR/secrets/users/NAME.password. New users may read every
  experiment (default_permission = READ, so a team compares its runs); an experiment's creator
  manages it, and `./dev team user grant` gives others EDIT or MANAGE, or takes READ away.
- TLS is uvicorn's own (`--uvicorn-opts --ssl-certfile/--ssl-keyfile`): a self-signed certificate
  made once into DIR/secrets/tls/ for the names the server answers to, which clients verify
  (MLFLOW_TRACKING_SERVER_CERT_PATH); a certificate of the team's own CA can replace the files.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import socket
from pathlib import Path

from pipeline.core.errors import PipelineError
from tools.team.layout import DATABASE, EVERY_ADDRESS, Layout, write_secret

AUTH_DATABASE = "mlflow_auth"  # MLflow's users and permissions, beside its runs (DATABASE)
ADMIN = "admin"
PERMISSIONS = ("READ", "EDIT", "MANAGE", "NO_PERMISSIONS")  # MLflow's own names (mlflow.server.auth.permissions)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
CERT_DAYS = 825  # what browsers accept for a server certificate


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def secret_of(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise PipelineError(f"{path}: cannot be read ({e.strerror or e}); `./dev team up` makes it") from e


def ensure_secrets(layout: Layout) -> None:
    """The admin's password and the secret MLflow signs its CSRF tokens with, made once."""
    for path, size in ((layout.admin_password, 24), (layout.flask_secret, 32)):
        if not path.exists():
            write_secret(path, secrets.token_urlsafe(size) + "\n")
    layout.users.mkdir(mode=0o700, exist_ok=True)


def write_auth_config(layout: Layout, postgres_port: int) -> None:
    """basic_auth.ini for the server (MLFLOW_AUTH_CONFIG_PATH): no password in it (libpq reads
    the database's from PGPASSFILE; the admin's comes in the environment)."""
    write_secret(
        layout.auth_config,
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = postgresql+psycopg2://{DATABASE}@127.0.0.1:{postgres_port}/{AUTH_DATABASE}\n"
        f"admin_username = {ADMIN}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
    )


def server_env(layout: Layout) -> dict[str, str]:
    """What the auth app reads from its environment (the process's own, which `ps` does not show)."""
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(layout.auth_config),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secret_of(layout.flask_secret),
        "MLFLOW_AUTH_ADMIN_PASSWORD": secret_of(layout.admin_password),  # used at the first start only
    }


def server_names(listen: str) -> list[str]:
    """The names a client may reach the server by: loopback, this host's names, the address it
    listens on."""
    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    if listen not in EVERY_ADDRESS:
        names.add(listen)
    return sorted(n for n in names if n)


def ensure_certificate(layout: Layout, listen: str) -> None:
    """A self-signed certificate (and its key, 0600) for server_names(listen), made again when
    the names change; a certificate put there by hand (no names.json beside it) is kept."""
    names = server_names(listen)
    record = layout.tls_dir / "names.json"
    if layout.tls_cert.exists() and layout.tls_key.exists():
        if not record.exists():
            return  # the team's own certificate
        try:
            if json.loads(record.read_text()) == names:
                return
        except (OSError, ValueError):
            pass
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    layout.tls_dir.mkdir(mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"energy-flow team stack on {socket.gethostname()}")])
    alternatives = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_secret(layout.tls_key, pem_key.decode())
    layout.tls_cert.write_text(cert.public_bytes(serialization.Encoding.PEM).decode())
    record.write_text(json.dumps(names))


def client_env(layout: Layout, settings: dict, user: str = ADMIN) -> dict[str, str]:
    """The variables MLflow's client reads to reach the server as `user` (the password read from
    its file here, for this process only)."""
    env = {}
    if settings.get("tls"):
        env["MLFLOW_TRACKING_SERVER_CERT_PATH"] = str(layout.tls_cert)
    if settings.get("auth"):
        path = layout.admin_password if user == ADMIN else layout.users / f"{user}.password"
        env.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=secret_of(path))
    return env


def exports(layout: Layout, settings: dict, uri: str) -> list[str]:
    """The shell lines `eval "$(./dev team up)"` runs: the password as `$(cat FILE)`, so it is in
    no command line, no shell history and nothing this command prints."""
    lines = [f"export MLFLOW_TRACKING_URI={uri}"]
    if settings.get("auth"):
        lines += [
            f"export MLFLOW_TRACKING_USERNAME={ADMIN}",
            f'export MLFLOW_TRACKING_PASSWORD="$(cat {layout.admin_password})"',
        ]
    if settings.get("tls"):
        lines.append(f"export MLFLOW_TRACKING_SERVER_CERT_PATH={layout.tls_cert}")
    return lines


VALID_NAME = "letters, digits, '.', '_' and '-', starting with a letter, at most 64"


def check_user_name(name: str) -> None:
    import re

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]{0,63}", name or "") or name == ADMIN:
        raise PipelineError(f"user name {name!r}: expected {VALID_NAME} ({ADMIN!r} is the stack's own)")


def auth_client(layout: Layout, settings: dict, uri: str):
    """MLflow's AuthServiceClient for the running server, as the admin."""
    import warnings

    with warnings.catch_warnings():  # the server's module, imported with it, warns of Starlette's WSGI adapter
        warnings.simplefilter("ignore", DeprecationWarning)
        from mlflow.server.auth.client import AuthServiceClient

    if not settings.get("auth"):
        raise PipelineError(
            f"the team stack in {layout.root} runs without authentication: users exist only with it "
            "(`./dev team down`, then `./dev team up --auth`, or --listen ADDR, which turns it on)"
        )
    return AuthServiceClient(uri)


def add_user(layout: Layout, settings: dict, uri: str, name: str) -> Path:
    """A member with a generated password, written to DIR/secrets/users/NAME.password (0600)."""
    from mlflow.exceptions import MlflowException

    from pipeline.core.environment import temporary_env

    check_user_name(name)
    path = layout.users / f"{name}.password"
    password = secrets.token_urlsafe(18)
    with temporary_env(client_env(layout, settings)):
        client = auth_client(layout, settings, uri)
        try:
            client.create_user(name, password)
        except MlflowException as e:
            raise PipelineError(f"user {name}: the server refused to make it: {e.message}") from None
    layout.users.mkdir(mode=0o700, exist_ok=True)
    write_secret(path, password + "\n")
    return path


def grant(layout: Layout, settings: dict, uri: str, name: str, experiment: str, permission: str) -> str:
    """`permission` on the experiment named `experiment` for user `name`; its id."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from pipeline.core.environment import temporary_env

    if permission not in PERMISSIONS:
        raise PipelineError(f"permission {permission!r}: expected one of {', '.join(PERMISSIONS)}")
    with temporary_env(client_env(layout, settings)):
        found = MlflowClient(uri).get_experiment_by_name(experiment)
        if found is None:
            raise PipelineError(f"no experiment named {experiment!r} on {uri}")
        try:
            auth_client(layout, settings, uri).grant_user_permission(
                name, "experiment", found.experiment_id, permission
            )
        except MlflowException as e:
            raise PipelineError(f"granting {permission} on {experiment!r} to {name}: {e.message}") from None
    return found.experiment_id
