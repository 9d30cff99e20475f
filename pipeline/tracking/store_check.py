"""What MLFLOW_TRACKING_URI (and the other MLFLOW_* variables) may hold, checked before a stage works.

MLflow itself says a store is wrong only when the first run starts, after the stage's work, and in
a traceback of its own. Here each answer is one line naming the variable, what it holds and what
would be valid (VALID). A directory store (a bare path or file://) is one only with
MLFLOW_ALLOW_FILE_STORE=true, as in MLflow 3, and only if it is an MLflow file store, empty or new.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

# URI schemes MLflow stores runs in (its own list, in the error it raises for any other; a
# database scheme may carry a driver: postgresql+psycopg2). A bare path has no scheme.
STORE_SCHEMES = (
    "",
    "file",
    "databricks",
    "databricks-uc",
    "uc",
    "http",
    "https",
    "postgresql",
    "mysql",
    "sqlite",
    "mssql",
)
VALID = (
    "expected sqlite:///PATH (a SQLite database, or a new file), http(s)://HOST:PORT or a database URI "
    "(postgresql://, mysql://, mssql://)"
)
SQLITE_HEADER = b"SQLite format 3\x00"
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def bad_scheme(uri: str) -> str | None:
    """Why MLflow cannot store runs at `uri` whatever answers there (an unknown scheme), or None."""
    scheme = _scheme(uri)
    if scheme in STORE_SCHEMES or _is_drive(uri):
        return None
    return f"MLflow cannot store runs under the scheme {scheme!r}; {VALID}"


def store_problem(uri: str) -> str | None:
    """Why `uri` is no store of runs (its scheme, or the local file or directory it names), or None.
    A server or database is not asked here: unreachable_reason does that."""
    try:
        scheme = bad_scheme(uri)
        if scheme:
            return scheme
        kind = "" if _is_drive(uri) else _scheme(uri)
        path = urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if kind else uri
        if "\0" in path:
            return f"the path holds a NUL character; {VALID}"
        if kind == "sqlite":
            return _sqlite_problem(uri)
        if kind in ("", "file"):
            return _inside_outputs(Path(path)) or _directory_problem(Path(path))
    except ValueError as e:  # urllib's own refusal (an unclosed [ of an IPv6 host)
        return f"not a URI ({e}); {VALID}"
    except OSError as e:  # a name too long for the file system
        return f"not a path this machine can use ({e.strerror or e}); {VALID}"
    return None


def _sqlite_problem(uri: str) -> str | None:
    rest = uri.split(":", 1)[1]
    if not rest.startswith("///"):
        return None  # sqlite:// (in memory) or a host form: SQLAlchemy's to judge
    db = Path(urllib.parse.unquote(rest[3:].split("?", 1)[0]))
    inside = _inside_outputs(db)
    if inside:
        return inside
    if db.is_dir():
        return f"{db} is a directory; {VALID}, e.g. sqlite:///{db / 'mlflow.db'}"
    if not db.exists():
        return None  # MLflow creates it (the directory above it is made under the init lock)
    try:
        with db.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        return f"{db} cannot be read ({e.strerror or e}); {VALID}"
    if head and head != SQLITE_HEADER:  # (an empty file is a new database)
        return (
            f"{db} is not a SQLite database (it does not start with SQLite's header), and MLflow would "
            f"write its tables into it; {VALID}, e.g. a new file beside it"
        )
    return None


def _inside_outputs(store: Path) -> str | None:
    """A local store (the database, or a directory store) inside a folder that holds a stage's
    outputs, which DVC deletes and replaces (data/shards, models, ...): the runs would be lost with
    the next run of that stage, and the store's files would sit among the outputs. Relative paths
    are the project's (the stages run in its root)."""
    from pipeline.core.paths import REPO_ROOT

    root = REPO_ROOT.resolve()
    where = (store if store.is_absolute() else root / store).resolve()
    for folder in stage_output_folders(root):
        if where == folder or folder in where.parents:
            return (
                f"{where} is inside {folder.relative_to(root)}/, a folder of stage outputs that DVC deletes and "
                "replaces when the stage runs (dvc.yaml): the runs would go with it; put the store outside "
                "the stages' output folders"
            )
    return None


def stage_output_folders(root: Path) -> list[Path]:
    """The folders dvc.yaml's stages write their outputs into: a directory output itself
    (data/shards, models), or the folder of a file output (metrics/, telemetry/, reports/)."""
    import yaml

    try:
        doc = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    folders = set()
    for stage in (doc.get("stages") or {}).values():
        for key in ("outs", "metrics", "plots"):
            for entry in (stage or {}).get(key) or []:
                rel = next(iter(entry)) if isinstance(entry, dict) else str(entry)
                path = root / rel
                folders.add(path.parent if Path(rel).suffix else path)
    return sorted(f.resolve() for f in folders if f.resolve() != root)


def _directory_problem(root: Path) -> str | None:
    if os.environ.get(ALLOW_FILE_STORE, "").strip().lower() not in ("true", "1"):
        return (
            f"{root} is a directory store, which MLflow 3 refuses unless {ALLOW_FILE_STORE}=true; {VALID} "
            "(`mlflow migrate-filestore` moves an existing one)"
        )
    if root.is_file():
        return f"{root} is a file, not a directory of runs; {VALID}"
    if not root.exists():
        return None  # a new store
    try:
        entries = list(root.iterdir())
    except OSError as e:
        return f"{root} cannot be read ({e.strerror or e}); {VALID}"
    if not entries or any((e / "meta.yaml").is_file() for e in entries if e.is_dir()) or (root / ".trash").is_dir():
        return None
    return (
        f"{root} is a directory that is neither empty nor an MLflow file store (no experiment's meta.yaml in it), "
        f"and MLflow would write its runs among its files; {VALID}"
    )


def mlflow_env_problem() -> str | None:
    """The first MLFLOW_* variable set to a value MLflow cannot read (MLFLOW_HTTP_REQUEST_TIMEOUT=abc:
    MLflow would raise in the middle of a run), as one line naming it, or None."""
    if not any(k.startswith("MLFLOW_") for k in os.environ):
        return None
    from mlflow import environment_variables as variables

    for var in vars(variables).values():
        if isinstance(var, variables._EnvironmentVariable) and var.is_set():  # noqa: SLF001 - MLflow's own table
            try:
                var.get()
            except ValueError:
                words = {int: "an integer", float: "a number"}
                kind = (
                    "true or false"
                    if isinstance(var, variables._BooleanEnvironmentVariable)  # noqa: SLF001
                    else words.get(var.type, var.type.__name__)
                )
                return f"{var.name} = {var.get_raw()!r}: expected {kind} (MLflow reads it)"
    return None


def _scheme(uri: str) -> str:
    return urllib.parse.urlsplit(uri).scheme.split("+")[0].lower()


def _is_drive(uri: str) -> bool:
    return len(_scheme(uri)) == 1 and uri[1:2] == ":"  # a Windows drive: a path
