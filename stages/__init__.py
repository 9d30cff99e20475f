"""Thin DVC entry points: parse config, call `pipeline`, write outputs, track.

Importing a stage takes seconds (torch, MLflow); Ctrl-C in that time would print a traceback of
whichever import it landed in. Until the stage's own handling takes over (stages/_cli.py), an
interrupt ends with one line instead.

Importing this package pins the portable CPU numerics (pipeline/core/numerics.py) for every stage:
`python -m stages.<name>`, DVC's commands and torchrun's ranks all import it before torch."""

import os
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
