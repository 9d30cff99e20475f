"""One writer at a time per output: an advisory lock that names its holder.

Two stages writing one output at once would interleave, and the later would silently win. Before
any work a stage takes, for each output it writes, filelock's FileLock (flock) on a hidden file
beside it (`.<name>.lock`, docs/bad-inputs.md) naming the holder. filelock leaves the file on
release; we remove it while still holding it (filelock's acquire sees an unlinked file and takes
the one at the path instead). A lock file is never put inside an output (DVC hashes those) nor
anywhere but beside one of our outputs (never beside the dataset).

The stage that starts ranks under torchrun holds the locks for all of them: it sets HELD_ENV, and
a rank that finds it set takes none (its own attempt would fail against its launcher's lock)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterable, Iterator

from filelock import FileLock, Timeout

from pipeline.core.environment import temporary_env
from pipeline.core.errors import PipelineError

HELD_ENV = "ENERGY_FLOW_OUTPUTS_LOCKED_BY"
_COMMAND_CHARS = 120  # the holder's command line as shown: enough to tell the stage and its overrides


class OutputBusy(PipelineError):
    """Another live process is writing the output; the message names it and what to do."""


def lock_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.lock"


def _command() -> str:
    try:
        import psutil

        argv = psutil.Process().cmdline()
    except Exception:  # noqa: BLE001 - no process table: the holder is still named by its pid
        argv = []
    if not argv:
        return "?"
    shown = " ".join(" ".join([Path(argv[0]).name, *argv[1:]]).split())  # one line, whatever the arguments hold
    return shown if len(shown) <= _COMMAND_CHARS else shown[: _COMMAND_CHARS - 3] + "..."


def _describe(dest: Path, shown: str) -> str:
    try:
        holder = json.loads(lock_path(dest).read_text("utf-8"))
        pid, host, command, started = holder["pid"], holder["host"], holder["command"], holder["started"]
    except (OSError, ValueError, KeyError, TypeError):  # the holder is between taking the lock and writing it
        lock = lock_path(dest)
        return f"{shown} is being written by another process (its lock {lock} is held); wait for it or stop it"
    where = "" if host == socket.gethostname() else f" on host {host}"
    return f"{shown} is being written by pid {pid}{where} ({command}, started {started}); wait for it or stop it"


def _write_holder(fd: int) -> None:
    """filelock's on_acquired: this process, in place of the last holder's record."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command()}
    holder["started"] = time.strftime("%Y-%m-%d %H:%M:%S")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)


def _acquire(dest: Path, shown: str) -> FileLock:
    """`dest`'s lock, held by this process; OutputBusy if another holds it. (One try: a holder
    letting go in that very instant also reads as busy.)"""
    lock = FileLock(lock_path(dest), blocking=False, on_acquired=_write_holder)
    try:
        lock.acquire()
    except Timeout:
        raise OutputBusy(_describe(dest, shown)) from None
    return lock


def _release(dest: Path, lock: FileLock) -> None:
    with contextlib.suppress(OSError):
        os.unlink(lock_path(dest))  # while still held: a waiter that opened it retries on the new file
    lock.release()


@contextlib.contextmanager
def writing(outputs: Iterable[tuple[Path, str]]) -> Iterator[None]:
    """Hold the lock of every (output path, name shown in messages) for the block. Taken in a fixed
    order, without waiting: a busy one fails at once, releasing those already taken."""
    if _launcher_holds():
        yield
        return
    held: list[tuple[Path, FileLock]] = []
    try:
        for dest, shown in sorted({(Path(os.path.abspath(d)), s) for d, s in outputs}):
            held.append((dest, _acquire(dest, shown)))
        yield
    finally:
        for dest, lock in reversed(held):
            _release(dest, lock)


def _launcher_holds() -> bool:
    """HELD_ENV names a live ancestor of this process (the stage that started it under torchrun);
    a value inherited by anything else (a shell that exported it) does not count."""
    holder = os.environ.get(HELD_ENV, "")
    if not holder.isdigit():
        return False
    try:
        import psutil

        return int(holder) in {p.pid for p in psutil.Process().parents()}
    except Exception:  # noqa: BLE001 - no process table: take the locks, as a stage on its own does
        return False


# What each stage locks: its configured output directories, and the one metrics file that stands
# for the fixed files it writes (telemetry/, reports/, runs/ are written with it, by it alone).
_STAGE_OUTPUTS = {
    "embed": ("embed.out_dir",),
    "train": ("train.out_dir", "train.checkpoint_dir", "metrics/train.json"),
    "baseline": ("metrics/baseline.json",),
    "evaluate": ("metrics/eval.json",),
    "report": ("metrics/stability.json",),
}


def stage_outputs(cfg, stage: str) -> list[tuple[Path, str]]:
    """(path, name shown) of each output `stage` locks (see _STAGE_OUTPUTS)."""
    from omegaconf import OmegaConf

    from pipeline.core.paths import repo_path

    found = []
    for item in _STAGE_OUTPUTS.get(stage, ()):
        value = item if "/" in item else OmegaConf.select(cfg, item)
        if value:
            found.append((repo_path(str(value)), str(value)))
    return found


@contextlib.contextmanager
def held_for_ranks() -> Iterator[None]:
    """While this process starts ranks under torchrun: they inherit HELD_ENV and take no lock."""
    with temporary_env({HELD_ENV: str(os.getpid())}):
        yield
