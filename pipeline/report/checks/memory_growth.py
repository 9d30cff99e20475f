"""memory_growth: memory that climbs step after step, as when something keeps each step's
autograd graph alive. A least-squares line of host RSS and of device memory against the step."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import after_warmup, finite_rows
from pipeline.report.checks.wording import memory_growth as say

MEMORY_SERIES = {"rss": "mem/rss_mb", "device": "mem/device_allocated_mb"}
FIT_KEYS = ("slope_mb_per_1k_steps", "p_value", "r2", "start_mb", "end_mb", "projected_mb", "projected_growth_mb")
MIN_MEMORY_ROWS = 5  # a slope from fewer points is noise, whatever its p-value says


def fit_memory(df: pd.DataFrame, col: str, p: Mapping) -> dict | str:
    """OLS of memory (MB) on step after warm-up; a dict of the fit, or why there is none.

    A resumed run's rows before the resume come from the killed process, whose memory is not
    this one's (a resumed default run's fresh process starts lower than the killed one ended), so only the
    last process's rows, after its own warm-up, are fitted."""
    d = finite_rows(after_warmup(df, p["resumed_from_step"] + p["warmup_steps"]), col)
    if d["step"].nunique() < MIN_MEMORY_ROWS:
        return f"{len(d)} rows after warm-up (need {MIN_MEMORY_ROWS})"
    if len(d) >= 2 * MIN_MEMORY_ROWS:
        # Fit the second half only: the allocator's heap keeps growing for a while before it
        # plateaus (a clean default run's RSS climbs over its first part, then stays flat), which
        # a whole-run fit calls a steep, significant leak. A leak that keeps a
        # graph per step keeps climbing in the second half too.
        d = d.iloc[len(d) // 2 :]
    mb = d[col].to_numpy()
    if np.ptp(mb) == 0:  # device memory is 0 throughout on CPU
        return f"constant at {mb[0]:.1f} MB"
    fit = stats.linregress(d["step"].to_numpy(), mb)
    out = {
        "slope_mb_per_1k_steps": fit.slope * 1000,
        "p_value": fit.pvalue,
        "r2": fit.rvalue**2,
        "start_mb": mb[0],
        "end_mb": mb[-1],
        "intercept": fit.intercept,
        "first_step": int(d["step"].iloc[0]),
        "last_step": int(d["step"].iloc[-1]),
    }
    if p["planned_steps"]:
        out["projected_mb"] = fit.intercept + fit.slope * p["planned_steps"]
    end_step = max(p["planned_steps"] or 0, out["last_step"])
    out["projected_growth_mb"] = fit.slope * (end_step - out["first_step"])
    return out


def grows(fit: Mapping, p: Mapping) -> bool:
    # All three: significant (not noise), steep enough to matter (ReportConfig says why the
    # slope's bar), and a growth over the planned run that costs something.
    return (
        fit["p_value"] < p["memory_alpha"]
        and fit["slope_mb_per_1k_steps"] > p["memory_min_mb_per_1k"]
        and fit["projected_growth_mb"] > p["memory_min_growth_mb"]
    )


def check_memory_growth(df: pd.DataFrame, p: Mapping) -> CheckResult:
    fits: dict[str, dict] = {}
    not_tested: list[str] = []
    for name, col in MEMORY_SERIES.items():
        fit = fit_memory(df, col, p) if col in df.columns else "not logged"
        if isinstance(fit, str):
            not_tested.append(f"{col}: {fit}")
        else:
            fits[name] = fit
    if not fits:
        return CheckResult(
            "skip", say.skip_summary(not_tested), {"not_tested": "; ".join(not_tested)}, say.skip_fix(MIN_MEMORY_ROWS)
        )
    failing = [n for n, f in fits.items() if grows(f, p)]
    # The series that drives the verdict gets the unprefixed keys; the other one is prefixed.
    worst = max(failing or fits, key=lambda n: fits[n]["slope_mb_per_1k_steps"])
    evidence: dict[str, Any] = {"series": worst, **{k: fits[worst][k] for k in FIT_KEYS if k in fits[worst]}}
    for name, fit in fits.items():
        if name != worst:
            evidence.update({f"{name}_{k}": fit[k] for k in FIT_KEYS if k in fit})
    evidence["first_step"], evidence["last_step"] = fits[worst]["first_step"], fits[worst]["last_step"]
    peak = df["mem/device_peak_mb"].to_numpy() if "mem/device_peak_mb" in df.columns else np.array([])
    if np.isfinite(peak).any() and np.nanmax(peak) > 0:  # 0 throughout on CPU: says nothing
        evidence["device_peak_max_mb"] = float(np.nanmax(peak))
    if not_tested:
        evidence["not_tested"] = "; ".join(not_tested)
    status = "fail" if failing else "pass"
    summary = say.summary(fits, worst, bool(failing), p)
    return CheckResult(status, summary, evidence, say.fix(fits[worst]["slope_mb_per_1k_steps"]))
