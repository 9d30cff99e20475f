"""grad_norm: gradient norms that sit in the critical zone. The share of optimizer steps in each
zone of the pre-clip global norm (train.grad_warning, train.grad_critical), exact where the
trainer counts every step's zone."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import grad_norm as say

ZONE_COUNT_COLUMNS = {z: f"grad/steps_{z}" for z in ("healthy", "warning", "critical", "exploded")}
# A quarter of steps near the edge: one LR bump from exploding.
WARN_FRACTION = 0.25


def grad_zones(norms: np.ndarray, p: Mapping) -> dict[str, np.ndarray]:
    """Boolean mask per zone; exactly one zone per row. NaN/inf is 'exploded'."""
    fin = np.isfinite(norms)
    v = np.where(fin, norms, 0.0)
    low = fin & (v < p["grad_healthy_min"])
    critical = fin & (v > p["grad_critical"])
    warning = fin & (v > p["grad_warning"]) & ~critical
    return {
        "low": low,
        "healthy": fin & ~low & ~warning & ~critical,
        "warning": warning,
        "critical": critical,
        "exploded": ~fin,
    }


def zone_step_fractions(df: pd.DataFrame, p: Mapping) -> tuple[dict[str, float], int, str]:
    """Fraction of optimizer steps in each zone, how many steps, and the source.

    The trainer counts every step's zone (grad/steps_<zone>): exact, whatever log_every is. Rows
    alone only give each window's mean norm, which hides a single critical step among 10."""
    if all(c in df.columns for c in ZONE_COUNT_COLUMNS.values()):
        counts = {z: float(np.nansum(df[c].to_numpy())) for z, c in ZONE_COUNT_COLUMNS.items()}
        total = sum(counts.values())
        if total > 0:
            return {z: n / total for z, n in counts.items()}, int(total), say.SOURCE_COUNTS
    zones = grad_zones(df["grad/global_norm"].to_numpy(), p)
    zones["healthy"] = zones["healthy"] | zones.pop("low")
    return {z: float(mask.mean()) for z, mask in zones.items()}, len(df), say.SOURCE_ROWS


def check_grad_norm(df: pd.DataFrame, p: Mapping) -> CheckResult:
    col = "grad/global_norm"
    if col not in df.columns or len(df) == 0:
        return CheckResult("skip", common.not_logged(col), {}, say.not_logged_fix(col))
    frac, n_steps, source = zone_step_fractions(df, p)
    # Exploded (non-finite) steps are shown here but judged by nonfinite, whose fix names the
    # module: one NaN step is one failure, reported once. This check fails on finite norms that
    # are too large, the ones clipping and the LR control.
    finite_share = 1.0 - frac["exploded"]
    critical = frac["critical"] / finite_share if finite_share > 0 else 0.0
    norms = df[col].to_numpy()
    finite = norms[np.isfinite(norms)]
    peak = df["grad/max_norm"].to_numpy() if "grad/max_norm" in df.columns else norms
    peak = peak[np.isfinite(peak)]
    evidence: dict[str, Any] = {f"frac_{z}": f for z, f in frac.items()}
    evidence["steps"] = n_steps
    evidence["source"] = source
    zones = grad_zones(norms, p)
    evidence["frac_low_rows"] = float(zones["low"].mean())
    evidence["median_norm"] = float(np.median(finite)) if finite.size else float("nan")
    evidence["max_norm"] = float(peak.max()) if peak.size else float("nan")
    bad_rows = np.zeros(len(df), dtype=bool)
    for z in ("critical", "exploded"):
        if ZONE_COUNT_COLUMNS[z] in df.columns:
            bad_rows |= df[ZONE_COUNT_COLUMNS[z]].to_numpy() > 0
    bad_rows |= zones["critical"] | zones["exploded"]
    bad_steps = df["step"].to_numpy()[bad_rows]
    if bad_steps.size:
        evidence["first_bad_step"] = int(bad_steps[0])
    if "grad/clip_fraction" in df.columns and np.isfinite(df["grad/clip_fraction"].to_numpy()).any():
        evidence["clip_fraction"] = float(np.nanmean(df["grad/clip_fraction"].to_numpy()))
    elif "grad/clipped_norm" in df.columns:
        clipped = df["grad/clipped_norm"].to_numpy()
        ok = np.isfinite(clipped) & np.isfinite(norms)
        if ok.any():  # clipping scales to max_norm, so clipped < pre-clip norm means it acted
            evidence["clip_fraction"] = float((clipped[ok] < norms[ok] * (1 - 1e-6)).mean())
    evidence["frac_critical_of_finite"] = critical
    if critical > p["grad_max_critical_fraction"]:
        status = "fail"
    elif frac["warning"] > WARN_FRACTION:
        status = "warn"
    else:
        status = "pass"
    summary = say.summary(frac, critical, n_steps, evidence["median_norm"], evidence["max_norm"], p)
    return CheckResult(status, summary, evidence, say.FIX)
