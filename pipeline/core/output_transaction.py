"""A stage's outputs put in place together, or not at all: a failed run keeps the last good one.

    with outputs("train", [model_file, metrics_file]) as tx:
        save(tx.path(model_file))       # written aside, in a staging directory beside the output
        write(tx.path(metrics_file))
        tx.remove(checkpoint)           # gone only when the rest is in place
    # here every output is the new one; had anything raised, every one would be the previous one

Each destination's parent directory gets a hidden staging directory (same file system, so every
move is a rename), `.<stage>-outputs.<pid>.<random>.staging`, made when the transaction opens: an
output directory that cannot be written to fails then, before any work. The writers write into
it; `commit` checks that every staged output is there and fits its place (a file never replaces a
directory), then swaps them in one by one, keeping each previous version aside (a hard link for a
file, so the destination is never missing; a rename for a directory). If a swap fails, the ones
already made are undone in reverse and the previous outputs are as they were.

A process killed mid-commit leaves its staging directory with a journal (JOURNAL: "committing",
then "committed") and the previous versions in it. The next transaction of the same stage in the
same directory finds it, sees its writer is gone, puts the previous versions back unless the
journal says the commit completed, and removes it. Only staging directories this stage made (the
name and the journal say so) whose process is gone, on this host, are touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Iterable, Iterator

from pipeline.core.atomic import current_umask, disk_full_error, is_disk_full
from pipeline.core.errors import PipelineError
from pipeline.core.lifetime import process_exists

JOURNAL = "journal.json"
_PREVIOUS = ".previous"  # suffix of a destination's previous version inside the staging directory
# `.<stage>-outputs.<pid>.<8 hex>.staging`
STAGING_NAME = re.compile(r"\.([a-z]+)-outputs\.(\d+)\.[0-9a-f]{8}\.staging")


def is_staging(name: str) -> bool:
    """A staging directory's name (output_dirs counts it as the stage's own, not a stranger's file)."""
    return STAGING_NAME.fullmatch(name) is not None


def _read_journal(staging: Path) -> dict | None:
    try:
        value = json.loads((staging / JOURNAL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_journal(staging: Path, journal: dict) -> None:
    tmp = staging / f".{JOURNAL}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(journal, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / JOURNAL)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush what was written at `path` (a file, or every file under a directory) before it
    replaces anything: a crash after the rename must not leave a destination with no data."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for f in files:
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def recover_dead_staging(parent: Path, stage: str) -> None:
    """Undo, then remove, what a killed transaction of `stage` left in `parent` (see the module doc)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        found = STAGING_NAME.fullmatch(entry.name)
        if not found or found.group(1) != stage or not entry.is_dir(follow_symlinks=False):
            continue
        staging = Path(entry.path)
        journal = _read_journal(staging)
        if journal is None or journal.get("stage") != stage or journal.get("host") != socket.gethostname():
            continue  # not ours to judge: another stage's, another host's, or no journal
        if int(found.group(2)) != journal.get("pid") or process_exists(int(found.group(2))):
            continue
        if journal.get("state") == "committing":
            for name in journal.get("writes") or []:
                dest, previous = parent / name, staging / (name + _PREVIOUS)
                if not (staging / name).exists() and not previous.exists() and (dest.exists() or dest.is_symlink()):
                    _discard(dest)  # new where there was nothing, moved in before the kill
            for previous in staging.glob(f"*{_PREVIOUS}"):
                dest = parent / previous.name[: -len(_PREVIOUS)]
                with contextlib.suppress(OSError):
                    if dest.is_dir() and not dest.is_symlink():
                        _discard(dest)  # the new version, swapped in before the kill
                    os.replace(previous, dest)
        shutil.rmtree(staging, ignore_errors=True)


class OutputTransaction:
    """The staged outputs of one stage run (use `outputs()`)."""

    def __init__(self, stage: str):
        self.stage = stage
        self._staging: dict[Path, Path] = {}  # parent directory -> its staging directory
        self._staged: dict[Path, Path] = {}  # destination -> staged path (in the order given)
        self._removed: list[Path] = []
        self._done = False

    # ------------------------------------------------------------------ staging
    def _staging_for(self, parent: Path) -> Path:
        if parent not in self._staging:
            parent.mkdir(parents=True, exist_ok=True)
            recover_dead_staging(parent, self.stage)
            staging = parent / f".{self.stage}-outputs.{os.getpid()}.{secrets.token_hex(4)}.staging"
            staging.mkdir()
            os.chmod(staging, 0o777 & ~current_umask())
            _write_journal(staging, self._journal("staging"))
            self._staging[parent] = staging
        return self._staging[parent]

    def _journal(self, state: str, parent: Path | None = None) -> dict:
        names = sorted(d.name for d in self._staged if d.parent == parent)
        return {"stage": self.stage, "pid": os.getpid(), "host": socket.gethostname(), "state": state, "writes": names}

    def prepare(self, dests: Iterable[str | os.PathLike]) -> None:
        """Make the staging directory of each destination's parent now, before any work."""
        for dest in dests:
            self._staging_for(Path(os.path.abspath(dest)).parent)

    def path(self, dest: str | os.PathLike) -> Path:
        """Where to write `dest` (a file, or a directory the writer makes there); the same path for
        the same destination."""
        dest = Path(os.path.abspath(dest))
        if dest not in self._staged:
            if any(d.name == dest.name and d.parent == dest.parent for d in self._removed):
                raise ValueError(f"{dest} is both written and removed by one transaction")
            self._staged[dest] = self._staging_for(dest.parent) / dest.name
        return self._staged[dest]

    def now(self, dest: str | os.PathLike) -> Path:
        """Where `dest`'s new content is until the commit: its staged path, or inside the staged
        directory of an ancestor, or `dest` itself when this transaction does not write it."""
        dest = Path(os.path.abspath(dest))
        for owner in (dest, *dest.parents):
            if owner in self._staged:
                return self._staged[owner] / dest.relative_to(owner)
        return dest

    def remove(self, dest: str | os.PathLike) -> None:
        """Delete `dest` (if it exists) when the transaction commits."""
        dest = Path(os.path.abspath(dest))
        self._staging_for(dest.parent)
        self._removed.append(dest)

    # ------------------------------------------------------------------ commit / abort
    def _check(self) -> None:
        for dest, staged in self._staged.items():
            if not staged.exists():
                raise PipelineError(f"{dest}: the {self.stage} stage did not write it; its previous outputs are kept")
            if dest.is_dir() and not dest.is_symlink() and not staged.is_dir():
                raise PipelineError(
                    f"{dest} is a directory where the {self.stage} stage writes a file; nothing was replaced (the "
                    "stage's previous outputs are as they were): move that directory away and run the stage again"
                )
            if staged.is_dir() and dest.exists() and not dest.is_dir():
                raise PipelineError(
                    f"{dest} is a file where the {self.stage} stage writes a directory; nothing was replaced (the "
                    "stage's previous outputs are as they were): move that file away and run the stage again"
                )

    def _set_journal(self, state: str) -> None:
        for parent, staging in self._staging.items():
            _write_journal(staging, self._journal(state, parent))

    def commit(self) -> None:
        """Put every staged output in place and do the removals, or (on any failure) none."""
        if self._done:
            return
        try:
            self._check()
            for staged in self._staged.values():
                _fsync_tree(staged)
            self._set_journal("committing")
        except BaseException:
            self.abort()
            raise
        undo: list[tuple[str, Path, Path | None]] = []  # (what was done, destination, its previous version)
        current = None
        try:
            for dest, staged in [*self._staged.items(), *((d, None) for d in self._removed)]:
                current = dest
                previous = self._staging[dest.parent] / (dest.name + _PREVIOUS)
                if not (dest.exists() or dest.is_symlink()):
                    if staged is not None:
                        os.replace(staged, dest)
                        undo.append(("new", dest, None))
                    continue
                if staged is not None and not dest.is_dir():
                    os.link(dest, previous, follow_symlinks=False)  # a file stays in place until replaced
                    undo.append(("linked", dest, previous))
                else:
                    os.replace(dest, previous)
                    undo.append(("moved away", dest, previous))
                if staged is not None:
                    os.replace(staged, dest)
                    undo[-1] = ("replaced", dest, previous)
        except BaseException as e:
            self._rollback(undo)
            self.abort()
            if isinstance(e, OSError):
                raise PipelineError(
                    f"{current}: could not be put in place ({e.strerror or e}); every output of the "
                    f"{self.stage} stage is as it was before this run"
                ) from e
            raise
        self._set_journal("committed")
        for parent in self._staging:
            _fsync_dir(parent)
        self._done = True
        self._clean()

    @staticmethod
    def _rollback(undo: list[tuple[str, Path, Path | None]]) -> None:
        for done, dest, previous in reversed(undo):
            with contextlib.suppress(OSError):
                if done == "new":
                    _discard(dest)
                elif done in ("moved away", "replaced"):
                    if dest.is_dir() and not dest.is_symlink():
                        _discard(dest)
                    os.replace(previous, dest)

    def abort(self) -> None:
        """Drop everything staged; the previous outputs stay as they are."""
        self._done = True
        self._clean()

    def _clean(self) -> None:
        for staging in self._staging.values():
            shutil.rmtree(staging, ignore_errors=True)

    def staged_dest_of(self, e: BaseException) -> Path | None:
        """The destination whose staged file a failed write `e` was writing, or None."""
        path = Path(getattr(e, "path", None) or getattr(e, "filename", None) or "")
        return next((d for d, s in self._staged.items() if path == s or s in path.parents), None)


@contextlib.contextmanager
def outputs(stage: str, dests: Iterable[str | os.PathLike] = ()) -> Iterator[OutputTransaction]:
    """A transaction over `stage`'s outputs: committed when the block ends normally, dropped when
    it raises. `dests`: the destinations known up front (their directories are checked now)."""
    tx = OutputTransaction(stage)
    try:
        tx.prepare(dests)
        yield tx
    except BaseException as e:
        tx.abort()
        dest = tx.staged_dest_of(e) if is_disk_full(e) else None
        if dest is not None:  # named by `dest`, not its staged path
            kept = f"the {stage} stage's previous outputs are left as they were and its partial ones removed"
            raise disk_full_error(dest, e, kept) from e
        raise
    else:
        tx.commit()
