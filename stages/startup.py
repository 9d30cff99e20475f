"""What a stage process does before its imports: `python -m stages.<name>` calls `begin()` first
(each stage module, under `if __name__ == "__main__":`, above its other imports); importing a
stage any other way (tests, tools) changes nothing in the process.

- The portable CPU numerics (pipeline/core/numerics.py) are pinned in the environment before torch
  is imported: MKL and ATen read those settings once, at their first use. The environment is
  inherited, so DVC's and torchrun's processes of the stage get them too.
- Ctrl-C is held while the stage imports. Importing takes seconds (torch, MLflow); Ctrl-C in that
  time would print a traceback of whichever import it landed in, or, landing inside torch's C++
  initialisation, abort the process ("terminate called after throwing an instance of
  'pybind11::error_already_set'"). A held signal is noted, not raised, and once the imports are
  done (end_startup, from stages/_cli.py) the stage ends with one line, killed by SIGINT as Ctrl-C
  ends a process. An interrupt raised anyway also ends with one line (the excepthook below).
- The process dies with the parent that started it, when that parent is ours (torchrun's
  launcher for a rank, the train stage for the report it runs), and any stop (SIGTERM, Ctrl-C)
  ends it within a bound, stuck or not; its temp directory is one of its own, removed when it
  ends (pipeline/core/lifetime.py).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field

from pipeline.core import lifetime, numerics


@dataclass
class _Startup:
    holding: bool = False  # Ctrl-C is being held (between begin and end_startup)
    held: list[int] = field(default_factory=list)  # signals that came meanwhile
    numerics: dict = field(default_factory=dict)  # what numerics.pin() set and kept


# A stage process's own temp directory, in the one it was given (pipeline/core/lifetime.py).
TEMP_DIR_PREFIX = "energy-flow-stage-"

# The one stage this process runs; begin() fills it, end_startup() reads it.
STARTUP = _Startup()


def begin() -> dict:
    """Pin the numerics, die with a parent of ours, take a temp directory of its own, bound any
    stop, hold Ctrl-C and print an interrupt as one line; returns what pin() did."""
    try:
        STARTUP.numerics = numerics.pin()
    except ValueError as e:  # ENERGY_FLOW_NUMERICS that is neither portable nor native
        stage = os.path.splitext(os.path.basename(sys.argv[0] or "stage"))[0]
        print(f"[{stage}] config error: environment variable {e}; fix or unset it", file=sys.stderr)
        raise SystemExit(2) from None
    lifetime.follow_parent()
    lifetime.use_private_temp_dir(TEMP_DIR_PREFIX)
    lifetime.bound_stops(_label())
    if sys.excepthook is sys.__excepthook__:  # leave a hook someone else set (an IDE, a debugger)
        sys.excepthook = _one_line_for_interrupt
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # the user's own handling is left alone
        STARTUP.holding = True
        signal.signal(signal.SIGINT, _hold_interrupt)
    return STARTUP.numerics


def _label() -> str:
    """How this process's lines start: the stage, and its rank when it is not rank 0."""
    stage = os.path.splitext(os.path.basename(sys.argv[0] or "stage"))[0]
    rank = os.environ.get("RANK", "0")
    return stage if rank in ("", "0") else f"{stage} rank {rank}"


def _one_line_for_interrupt(kind, value, tb, _default=sys.excepthook):
    if issubclass(kind, KeyboardInterrupt):
        print(f"[{_label()}] stopped by Ctrl-C while starting: nothing was done", file=sys.stderr)
        return
    _default(kind, value, tb)


def _hold_interrupt(signum, frame):
    STARTUP.held.append(signum)


def end_startup(stage: str) -> None:
    """The stage's imports are done: Ctrl-C raises KeyboardInterrupt again (the stage handles it),
    and one that came during the imports ends the process now, as Ctrl-C would have."""
    if not STARTUP.holding:
        return
    STARTUP.holding = False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if STARTUP.held:
        print(f"[{stage}] stopped by Ctrl-C while starting: nothing was done", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        lifetime.remove_private_temp_dir()  # the signal ends the process without atexit
        os.kill(os.getpid(), signal.SIGINT)
