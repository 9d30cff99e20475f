"""Thin DVC entry points: parse config, call `pipeline`, write outputs, track.

Importing a stage takes seconds (torch, MLflow); Ctrl-C in that time would print a traceback of
whichever import it landed in. Until the stage's own handling takes over (stages/_cli.py), an
interrupt ends with one line instead."""
import os
import sys


def _one_line_for_interrupt(kind, value, tb, _default=sys.excepthook):
    if issubclass(kind, KeyboardInterrupt):
        stage = os.path.splitext(os.path.basename(sys.argv[0] or "stage"))[0]
        print(f"[{stage}] stopped by Ctrl-C while starting: nothing was done", file=sys.stderr)
        return
    _default(kind, value, tb)


if sys.excepthook is sys.__excepthook__:  # leave a hook someone else set (an IDE, a debugger)
    sys.excepthook = _one_line_for_interrupt
