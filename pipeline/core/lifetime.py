"""How long a process of ours lives, and what it leaves: no process outlives the command that
started it, and the temp directory of a process that was killed is removed by the next one
(docs/training.md, "Nothing outlives the launcher").

- The parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, `die_with_parent`): torchrun starts
  its workers in sessions of their own, so a signal to the launcher's process group never reaches
  them, and a killed launcher leaves them to init; this reaches them. A parent names itself to its
  child in ENERGY_FLOW_PARENT_PID (`child_env`). The kernel sends the signal when the parent
  *thread* that started the child ends, so a child is started from the main thread.
- A bound on a stop (`bound_stops`): once SIGTERM or Ctrl-C has come, the process ends within
  `STOP_GRACE` seconds, even when its main thread is stuck where Python cannot raise.
- Private temp directories named with their owner's pid (`use_private_temp_dir` as the process's
  TMPDIR, `private_temp_dir` for a block): removed when the owner is done, or, when it was
  killed, by the next one to make such a directory (as pipeline/core/atomic.py does with temps).

Nothing here runs at import: a stage process calls it from stages/startup.py.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

PARENT_ENV = "ENERGY_FLOW_PARENT_PID"
# A stage's clean stop holds the signal until its step is done, then writes a checkpoint and ends
# its MLflow run: seconds. Far longer means it is stuck; torchrun's agent gives its workers the
# same time before it kills them.
STOP_GRACE = 30.0
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for `sig` when this process's parent dies; if the parent is no longer
    `parent` (it died before the call), `sig` comes now. False where the kernel cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a child stage process that is to die with this one."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def follow_parent() -> bool:
    """Die with the parent that started this process: the one named in ENERGY_FLOW_PARENT_PID
    (taken out of the environment, so that this process's own children do not inherit a name
    that is not their parent's); else, in a rank that torchrun started (TORCHELASTIC_RUN_ID), its
    agent, and in a stage that DVC runs (DVC_STAGE), DVC. A process started by a person (a shell,
    nohup) is left to live on its own."""
    value = os.environ.pop(PARENT_ENV, "")
    if value.isdigit():
        return die_with_parent(int(value))
    if "TORCHELASTIC_RUN_ID" in os.environ or "DVC_STAGE" in os.environ:
        return die_with_parent(os.getppid())
    return False


class _Bound:
    grace = STOP_GRACE
    armed = False
    temp_dir: Path | None = None  # use_private_temp_dir's


def use_private_temp_dir(prefix: str) -> Path | None:
    """Make a new directory `<prefix><pid>-<random>` in the temp directory this process was given
    (first removing the ones dead processes left there) and make it this process's temp
    directory: TMPDIR, which its children inherit, and Python's tempfile. It is removed when the
    process exits, a bounded stop's end included; a process killed outright leaves it to the next."""
    base = Path(tempfile.gettempdir())
    remove_dead_owners_dirs(base, prefix)
    try:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    except OSError:  # a full or read-only temp directory: the stage says so where it writes, if it does
        return None
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)
    _Bound.temp_dir = path
    atexit.register(remove_private_temp_dir)
    return path


def remove_private_temp_dir() -> None:
    """Remove this process's private temp directory now (it is about to end without atexit)."""
    if _Bound.temp_dir is not None:
        shutil.rmtree(_Bound.temp_dir, ignore_errors=True)


def bound_stops(name: str, grace: float = STOP_GRACE) -> bool:
    """End this process `grace` seconds after the first SIGTERM, SIGINT, SIGHUP or SIGQUIT that
    reaches a Python handler of it, with one line on stderr and the signal's exit code, whatever
    its main thread is doing then. The signal is seen through Python's wakeup fd, which the C-level handler
    writes at once, so a main thread blocked in C code does not delay it. False (nothing armed)
    off the main thread or where another wakeup fd is set (an event loop's)."""
    _Bound.grace = grace
    if _Bound.armed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return False
    _Bound.armed = True
    threading.Thread(target=_end_after_grace, args=(read_end, name), name="stop-bound", daemon=True).start()
    return True


def set_stop_grace(grace: float) -> None:
    """Change the bound that `bound_stops` armed (a launcher waits for its ranks' stops and then
    torchrun's kill). It arms nothing: a test or a tool calling a stage's code is not bounded."""
    _Bound.grace = grace


def _end_after_grace(fd: int, name: str) -> None:
    while True:
        data = os.read(fd, 64)
        if not data:
            return
        stops = [s for s in data if s in STOP_SIGNALS]
        if stops:
            break
    signum = signal.Signals(stops[0])
    start = time.monotonic()
    while time.monotonic() - start < _Bound.grace:
        time.sleep(0.1)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            f"[{name}] still running {_Bound.grace:g} s after {signum.name}: ended without finishing its stop\n"
        )
        sys.stderr.flush()
    remove_private_temp_dir()
    os._exit(128 + signum)


def process_exists(pid: int) -> bool:
    """A process with this pid is alive (or not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_dead_owners_dirs(base: Path, prefix: str) -> list[Path]:
    """The directories `<prefix><pid>-<random>` in `base` of this user whose process is gone
    (killed before it could remove them); returns what was removed. A live owner's are kept."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)-[A-Za-z0-9_]{{8}}")
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            found = pattern.fullmatch(entry.name)
            if not found or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid() or process_exists(int(found.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def private_temp_dir(prefix: str, base: str | os.PathLike | None = None) -> Iterator[Path]:
    """A new directory `<prefix><pid>-<random>` in `base` (the system temp directory), removed
    with all it holds when the block ends; first the ones dead processes left are removed."""
    base = Path(base or tempfile.gettempdir())
    remove_dead_owners_dirs(base, prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
