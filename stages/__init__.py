"""Thin DVC entry points: parse config, call `pipeline`, write outputs, track.

Importing a stage takes seconds (torch, MLflow); Ctrl-C in that time would print a traceback of
whichever import it landed in, or, landing inside torch's C++ initialisation, abort the process
("terminate called after throwing an instance of 'pybind11::error_already_set'"). So a stage run
as `python -m stages.<name>` holds Ctrl-C while it imports: the signal is noted, not raised, and
once the imports are done (end_startup, from stages/_cli.py) the stage ends with one line, killed
by SIGINT as Ctrl-C ends a process. An interrupt raised anyway (the stage imported another way)
also ends with one line (the excepthook below).

Importing this package pins the portable CPU numerics (pipeline/core/numerics.py) for every stage:
`python -m stages.<name>`, DVC's commands and torchrun's ranks all import it before torch."""

import os
import signal
import sys

# Before any stage module imports torch: MKL and ATen read these settings once, at their first use.
from pipeline.core import numerics as _numerics

NUMERICS = _numerics.pin()  # the portable CPU numerics (or ENERGY_FLOW_NUMERICS=native): what is in effect


def _one_line_for_interrupt(kind, value, tb, _default=sys.excepthook):
    if issubclass(kind, KeyboardInterrupt):
        stage = os.path.splitext(os.path.basename(sys.argv[0] or "stage"))[0]
        print(f"[{stage}] stopped by Ctrl-C while starting: nothing was done", file=sys.stderr)
        return
    _default(kind, value, tb)


if sys.excepthook is sys.__excepthook__:  # leave a hook someone else set (an IDE, a debugger)
    sys.excepthook = _one_line_for_interrupt


# `python -m stages.<name>`: while Python locates the module, sys.argv[0] is "-m". Imported any
# other way (tests, tools), the process's own Ctrl-C handling is left alone.
_HOLDING = sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
_held: list[int] = []


def _hold_interrupt(signum, frame):
    _held.append(signum)


if _HOLDING:
    signal.signal(signal.SIGINT, _hold_interrupt)


def end_startup(stage: str) -> None:
    """The stage's imports are done: Ctrl-C raises KeyboardInterrupt again (the stage handles it),
    and one that came during the imports ends the process now, as Ctrl-C would have."""
    global _HOLDING
    if not _HOLDING:
        return
    _HOLDING = False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _held:
        print(f"[{stage}] stopped by Ctrl-C while starting: nothing was done", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
