"""Atomic file writes: write to a temp file in the same directory, fsync, then rename.

A stage killed mid-write leaves either the old file or no file, never a half-written one that
DVC would cache."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `dest`; on success rename it onto `dest`, on error remove it."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; the file should look like any other
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_open(dest: str | os.PathLike, mode: str = "w", **kw) -> Iterator[IO]:
    with atomic_path(dest) as tmp, open(tmp, mode, **kw) as f:
        yield f


def write_json(dest: str | os.PathLike, obj) -> None:
    with atomic_open(dest, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, allow_nan=True)
        f.write("\n")


def write_text(dest: str | os.PathLike, text: str) -> None:
    with atomic_open(dest, "w", encoding="utf-8") as f:
        f.write(text)
