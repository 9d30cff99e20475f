"""Wording more than one check uses."""

from __future__ import annotations

from typing import Sequence

LIST_MAX = 20  # event/step lists in evidence: enough to see a pattern, short enough to read

# What to do when a run's time and memory were not measured or belong to another run.
REMEASURE = "To measure this run, train it again: `dvc repro --force --single-item train`, then `dvc repro`."


def steps_text(steps: Sequence[int]) -> str:
    """'12, 40, 41' and, past LIST_MAX, how many more."""
    shown = ", ".join(str(int(s)) for s in steps[:LIST_MAX])
    return shown + (f", ... ({len(steps) - LIST_MAX} more)" if len(steps) > LIST_MAX else "")


def unmeasured_summary(why: str) -> str:
    return f"No time or memory measurements of this run: {why}."


def not_logged(col: str) -> str:
    return f"{col} not logged."


def log_to_enable(what: str) -> str:
    return f"Log {what} to enable this check."
