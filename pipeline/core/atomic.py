"""Atomic file writes: write to a temp file in the same directory, fsync, then rename.

A stage killed mid-write leaves either the old file or no file, never a half-written one that
DVC would cache. Its temp file (`.<name>.<pid>.<random>.tmp`, hidden) stays behind, as nothing
runs after SIGKILL: the next write of the same file removes the temps whose writer is gone. DVC
removes a stage's outputs before running it again; this covers the files a stage writes that are
not DVC outputs (the report's HTML and plots, the run's time and memory).

A write that fails because the disk is full (ENOSPC, or EDQUOT: the quota) is reported as
DiskFull, naming the file and saying the previous one was kept, instead of an OSError traceback
from deep inside torch.save or numpy."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from pipeline.core.errors import DiskFull
from pipeline.core.lifetime import process_exists

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How a full disk shows, as seen on a full 512 KiB tmpfs: Python's own writes and pyarrow raise
# OSError(ENOSPC); np.save (numpy's tofile) raises OSError("76800 requested and 48096 written")
# without an errno; torch.save into a Python file object raises a RuntimeError ("unexpected pos")
# whose __context__ is the OSError(ENOSPC) (into a path it says only "iostream error").
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def current_umask() -> int:
    """The process's umask, read where Linux shows it (/proc/self/status, kernels since 4.7)
    without changing it; elsewhere set and put back at once (os.umask is the only way to read it
    there). At the moment of use, not at import: importing this module changes nothing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def disk_full_errno(e: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT if `e`, or an exception it was raised from or while handling, is a full
    disk (see above); else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFull):
            return e.errno
        if isinstance(e, OSError):
            if e.errno in DISK_FULL_ERRNOS:
                return e.errno
            if e.errno is None and _SHORT_WRITE.search(str(e)):
                return errno.ENOSPC
        e = e.__cause__ or e.__context__
    return None


def is_disk_full(e: BaseException) -> bool:
    return disk_full_errno(e) is not None


def _free_space(path: Path) -> str:
    """Free space on the filesystem holding `path` (its nearest existing ancestor), e.g. "0 B"."""
    for p in (path, *path.parents):
        if p.exists():
            try:
                free = shutil.disk_usage(p).free
            except OSError:
                return "unknown"
            for unit in ("B", "KiB", "MiB", "GiB"):
                if free < 1024 or unit == "GiB":
                    return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
                free /= 1024
    return "unknown"


def disk_full_error(dest: str | os.PathLike, e: BaseException, kept: str, hint: str = "") -> DiskFull:
    """The DiskFull for a failed write of `dest`: `kept` says what was left as it was, `hint`
    where else the output could go (e.g. "set embed.out_dir to another disk")."""
    dest = Path(dest)
    code = disk_full_errno(e) or errno.ENOSPC
    what = "the disk quota is used up" if code == errno.EDQUOT else "the disk is full"
    advice = f"free some space there{f' or {hint}' if hint else ''}, then run the stage again"
    return DiskFull(
        f"{dest}: {what} ({os.strerror(code)}) while writing to it, {_free_space(dest.parent)} free "
        f"on that filesystem now; {kept}; {advice}",
        dest,
        code,
    )


def remove_dead_writers_temps(dest: Path) -> None:
    """The temp files of `dest` whose writing process no longer exists (killed mid-write). A live
    writer's temp (another process writing the same file now) is left alone."""
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.(\d+)\.[a-z0-9_]{{8}}\.tmp")
    with contextlib.suppress(OSError):
        for entry in os.scandir(dest.parent):
            found = pattern.fullmatch(entry.name)
            if found and entry.is_file(follow_symlinks=False) and not process_exists(int(found.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `dest`; on success rename it onto `dest`, on error remove it.
    The temp's name carries this process's id, so that a later write can tell a killed writer's
    leftover (removed) from a live one's (kept)."""
    dest = Path(dest)
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_temps(dest)
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; the file should look like any other
        yield tmp
        # A full disk may show only here: data the writer buffered is allocated at flush time.
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if is_disk_full(e) and not isinstance(e, DiskFull):
            kept = f"the previous {dest.name} is left as it was" if dest.exists() else f"{dest.name} was not written"
            raise disk_full_error(dest, e, kept + " and the partial file removed") from e
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
