"""Back up a team stack's stores and put them back (`./dev team backup DEST`, `./dev team restore
SRC`; docs/team.md, "Backing up and restoring").

A backup is a folder (0700) with: each database of the stack's PostgreSQL that MLflow uses
(`mlflow`, and `mlflow_auth` with authentication) as `pg_dump --format=custom` files, taken from
the running stack (one consistent snapshot per database while people work); the artifact store
and the DVC remote, copied file by file after the dumps (so every run in a dump finds its
artifacts: a run that logs more meanwhile has extra files, never missing ones); the folder's
team.json and secrets/ (the admin's and members' passwords, the TLS key: a restored server lets the
same people in with the same passwords); and manifest.json, the sha256 of every file, which
`restore` checks before it writes anything.

`restore` makes a stack folder that has no stack yet (missing, or empty): a new PostgreSQL cluster
with the backup's superuser password, the databases restored into it with `pg_restore`, then the
files. `./dev team up` then starts it with every run, artifact, user and permission back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from pipeline.core.atomic import write_json
from pipeline.core.errors import PipelineError
from tools.team import postgres
from tools.team.auth import AUTH_DATABASE
from tools.team.layout import DATABASE, PRIVATE, SUPERUSER, Layout, password, write_pgpass

MANIFEST = "manifest.json"
FOLDERS = ("artifacts", "dvc-remote", "secrets")  # copied as they are (secrets keep their 0600)
DUMP_TIMEOUT = 3600.0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): _sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != MANIFEST
    }


def _empty_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PipelineError(f"backup destination {dest}: exists and is not an empty folder; expected a new one")
    dest.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    dest.chmod(PRIVATE)


def _pg_env(layout: Layout) -> dict[str, str]:
    """libpq's password file for the pg_* clients: the password is on no command line."""
    return {**os.environ, "PGPASSFILE": str(layout.pgpass)}


def _databases(port: int, layout: Layout) -> list[str]:
    conn = postgres.connect(port, password(layout))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", ([DATABASE, AUTH_DATABASE],))
            return sorted(row[0] for row in cur.fetchall())
    finally:
        conn.close()


def backup(layout: Layout, state: dict, dest: Path) -> dict:
    """Back the running stack (`state`: its run/stack.json) up into the new folder `dest`; the
    manifest written (databases, file counts and bytes, seconds)."""
    started = time.monotonic()
    _empty_dest(dest)
    port = int(state["postgres_port"])
    write_pgpass(layout, port)
    dumps = []
    for name in _databases(port, layout):
        out = dest / f"{name}.dump"
        command = [str(postgres.bin_dir() / "pg_dump"), "--format=custom", "--no-owner", "--no-privileges"]
        command += ["-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER, "-f", str(out), name]
        done = subprocess.run(
            command, env=_pg_env(layout), capture_output=True, text=True, timeout=DUMP_TIMEOUT, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise PipelineError(f"pg_dump of database {name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        dumps.append(name)
    for folder in FOLDERS:
        if (layout.root / folder).is_dir():
            shutil.copytree(layout.root / folder, dest / folder, symlinks=True)
    shutil.copy2(layout.settings, dest / "team.json")
    files = _files(dest)
    manifest = {
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stack": str(layout.root),
        "databases": dumps,
        "files": files,
        "bytes": sum((dest / f).stat().st_size for f in files),
        "seconds": round(time.monotonic() - started, 1),
    }
    write_json(dest / MANIFEST, manifest)
    (dest / MANIFEST).chmod(0o600)
    return manifest


def check_backup(src: Path) -> dict:
    """The backup's manifest, once every file it lists is there with its digest."""
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise PipelineError(f"{src / MANIFEST}: unreadable ({e}); expected a folder `./dev team backup` made") from e
    for rel, digest in manifest.get("files", {}).items():
        path = src / rel
        if not path.is_file():
            raise PipelineError(f"backup {src}: {rel} is missing; the backup is incomplete, nothing was restored")
        if _sha256(path) != digest:
            raise PipelineError(f"backup {src}: {rel} differs from its digest in {MANIFEST}; nothing was restored")
    for name in manifest.get("databases", []):
        if f"{name}.dump" not in manifest["files"]:
            raise PipelineError(f"backup {src}: the dump of {name} is not in {MANIFEST}; nothing was restored")
    return manifest


def restore(src: Path, root: Path) -> dict:
    """The stack folder `root` (missing or empty) made from the backup `src`."""
    manifest = check_backup(src)
    if root.exists() and any(root.iterdir()):
        raise PipelineError(
            f"{root}: not empty; restore makes a new stack folder and never writes over one (`./dev team down`, "
            "then move it away, or restore into another --dir)"
        )
    made_root = not root.exists()
    root.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    root.chmod(PRIVATE)
    layout = Layout(root)
    try:
        shutil.copy2(src / "team.json", layout.settings)
        for folder in FOLDERS:
            if (src / folder).is_dir():
                shutil.copytree(src / folder, root / folder, symlinks=True)
        for folder in (layout.logs, layout.run, layout.artifacts, layout.dvc_remote):
            folder.mkdir(exist_ok=True)
        settings = json.loads(layout.settings.read_text())
        port = int(settings["postgres_port"])
        postgres.initialise(layout)
        write_pgpass(layout, port)
        with postgres.running(layout, port, layout.logs / "postgres.log"):
            postgres.ensure_database(port, password(layout), tuple(n for n in manifest["databases"] if n != DATABASE))
            for name in manifest["databases"]:
                command = [str(postgres.bin_dir() / "pg_restore"), "--no-owner", "--role", DATABASE, "--exit-on-error"]
                command += ["-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER, "-d", name, str(src / f"{name}.dump")]
                done = subprocess.run(
                    command,
                    env=_pg_env(layout),
                    capture_output=True,
                    text=True,
                    timeout=DUMP_TIMEOUT,
                    stdin=subprocess.DEVNULL,
                )
                if done.returncode != 0:
                    raise PipelineError(f"pg_restore of {name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    except BaseException:
        # A restore that did not finish leaves no half stack that `up` would start as if whole
        # (the folder was empty or missing: everything in it is the restore's own).
        for child in list(root.iterdir()) if root.is_dir() else []:
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
        if made_root:
            shutil.rmtree(root, ignore_errors=True)
        raise
    return manifest
