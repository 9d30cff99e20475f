"""The grad_norm check's messages."""

from __future__ import annotations

from typing import Mapping

SOURCE_COUNTS = "per-step zone counts"
SOURCE_ROWS = "logged rows (window means)"
FIX = (
    "Clip gradients at max_norm=1.0 (train.grad_clip; after scaler.unscale_), lower the LR or "
    "lengthen warm-up, and check precision/scaler settings (bf16, or GradScaler init_scale=2**10 "
    "rather than 2**16)."
)


def not_logged_fix(col: str) -> str:
    return f"Log {col} (pre-clipping) to enable this check."


def summary(frac: Mapping[str, float], critical: float, n_steps: int, median: float, peak: float, p: Mapping) -> str:
    exploded = f"; exploded (non-finite, see nonfinite) {100 * frac['exploded']:.1f} %" if frac["exploded"] else ""
    return (
        f"Norm critical (> {p['grad_critical']:g}) in {100 * critical:.1f} % of the finite steps "
        f"(limit {100 * p['grad_max_critical_fraction']:g} %) of {n_steps:,}; healthy {100 * frac['healthy']:.1f} %, "
        f"warning (> {p['grad_warning']:g}) {100 * frac['warning']:.1f} %{exploded}; "
        f"median norm {median:.3g}, max {peak:.3g}."
    )
