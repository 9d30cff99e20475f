"""The nonfinite check's messages."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from pipeline.report.checks.wording.common import LIST_MAX

SKIP_SUMMARY = "No event list and no train/loss column."
SKIP_FIX = "Pass the train stage's events and log train/loss to enable this check."
OUTCOMES = {True: "training recovered", False: "training did not recover", None: "recovery unknown"}


def clean(total: int) -> str:
    return f"No non-finite loss or gradient in {total:,} steps."


def kinds(records: Sequence[Mapping]) -> str:
    """'nan_grad: 3, nan_loss: 1': how many of each kind, the most frequent first."""
    return ", ".join(f"{k}: {n}" for k, n in Counter(r["kind"] for r in records).most_common())


def event_list(records: Sequence[Mapping]) -> str:
    return "; ".join(
        f"step {r['step']} {r['kind']} in {r['module'] or '?'} ({r['action']})" for r in records[:LIST_MAX]
    ) + (f"; ... ({len(records) - LIST_MAX} more)" if len(records) > LIST_MAX else "")


def summary(count: int, fraction: float, total: int, limit: float, first: int, module: str | None, recovered) -> str:
    where = f" in {module}" if module else ""
    return (
        f"{count} non-finite step(s) ({100 * fraction:.2f} % of {total:,}, limit "
        f"{100 * limit:g} %); first at step {first}{where}; {OUTCOMES[recovered]}."
    )


def fix(module: str | None) -> str:
    return (
        "Lower the LR (or lengthen warm-up), clip gradients at 1.0 after scaler.unscale_, check the "
        "inputs for NaN/inf, and with fp16 use GradScaler(init_scale=2**10, growth_factor=1.5, "
        "growth_interval=200) instead of 2**16, 2.0, 100 — or train in bf16, which needs no scaler"
        + (f"; start with {module}, the first module with a non-finite gradient." if module else ".")
    )
