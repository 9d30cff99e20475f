"""A SQLite store that was copied or moved with its folder, pointed back at its own artifacts.

The project's store keeps its artifacts in mlruns/ beside mlflow.db (store.artifact_location),
and MLflow records that place as an absolute path: on every experiment, run and logged model. A
checkout copied with `cp -a` (or moved) takes mlflow.db and mlruns/ along, but the database still
names the old folder: the copy would read its artifacts from there, and write new ones into it.

`relocate` rewrites those locations to the mlruns/ beside the database, once, when a stage or tool
first opens the store (store._open_sqlite_store, under its lock). It only touches locations of
the form <folder>/mlruns[/...] made by that rule for a database that is not this one (a different
file at <folder>/mlflow.db, or none), and only where the artifacts came along (the experiment's
folder is in the new mlruns/) or are gone from the old place; artifacts a user keeps elsewhere on
purpose are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

# MLflow's columns that hold an artifact location (its SQLAlchemy store's tables); a column a
# store's schema version lacks is skipped.
LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)
ARTIFACTS = "mlruns"


def _as_path(location: str) -> tuple[str, Path] | None:
    """(prefix, path) of a local location: "file://" + path, or a bare absolute path."""
    if location.startswith("file://"):
        rest = location[len("file://") :]
        return ("file://", Path(rest)) if rest.startswith("/") else None
    return ("", Path(location)) if location.startswith("/") else None


def _old_root(location: str) -> Path | None:
    """The mlruns/ folder a location lies in (the last path part so named), or None."""
    parsed = _as_path(location)
    if parsed is None:
        return None
    path = parsed[1]
    for candidate in (path, *path.parents):
        if candidate.name == ARTIFACTS:
            return candidate
    return None


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return False


def moved_roots(db: Path, locations: list[tuple[str, str]]) -> dict[Path, Path]:
    """{old mlruns/: this database's mlruns/} for the old folders to rewrite. `locations`:
    (experiment id, artifact location) of each experiment."""
    here = db.resolve().parent / ARTIFACTS
    moved: dict[Path, Path] = {}
    for experiment_id, location in locations:
        old = _old_root(location or "")
        if old is None or old == here or old in moved:
            continue
        if (old.parent / db.name).exists() and _same_file(old.parent / db.name, db):
            continue  # the same database reached by another path (a symlink): nothing moved
        rest = _as_path(location)[1].relative_to(old)
        came_along = (here / rest).exists() or (here / experiment_id).exists()
        if came_along or not old.exists():
            moved[old] = here
    return moved


def _rewrite(value: str, moved: dict[Path, Path]) -> str:
    parsed = _as_path(value)
    if parsed is None:
        return value
    prefix, path = parsed
    for old, new in moved.items():
        if path == old or old in path.parents:
            return prefix + str(new / path.relative_to(old))
    return value


def relocate(db: Path) -> int:
    """Rewrite the locations that name another folder's mlruns/ (see the module's docstring);
    the number of values rewritten (0: the store is where it was made)."""
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return 0
        experiments = con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        moved = moved_roots(db, [(str(i), loc) for i, loc in experiments])
        if not moved:
            return 0
        changed = 0
        with con:  # one transaction: all of them or none
            for table, column in LOCATION_COLUMNS:
                if table not in tables or column not in {r[1] for r in con.execute(f"PRAGMA table_info({table})")}:
                    continue
                rows = con.execute(f"SELECT rowid, {column} FROM {table} WHERE {column} IS NOT NULL").fetchall()
                for rowid, value in rows:
                    new = _rewrite(value, moved)
                    if new != value:
                        con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (new, rowid))
                        changed += 1
    olds = ", ".join(str(o) for o in moved)
    log.warning(
        "%s was made in another folder: its artifact locations named %s; this checkout was copied or moved, so "
        "they now name %s beside it (%d locations rewritten)",
        db,
        olds,
        db.resolve().parent / ARTIFACTS,
        changed,
    )
    return changed
