"""convergence: adaptive computation over training. How many flow steps each batch ran, against
the model's bounds (flows that die before arriving; adaptive stopping that never fires), and the
throughput that bought."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import after_warmup, finite_rows
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import convergence as say

AT_CAP_WARN = 0.9  # this share of steady rows at the cap: adaptive stopping never fires
GROWTH_WARN = 1.5  # steady over early flow steps per batch past this: flows slow down


def check_convergence(df: pd.DataFrame, p: Mapping) -> CheckResult:
    col = "flow/steps_used"
    if col not in df.columns:
        return CheckResult("skip", common.not_logged(col), {}, common.log_to_enable(col))
    d = finite_rows(after_warmup(df, p["warmup_steps"]), col)
    if len(d) < 2:
        d = finite_rows(df, col)
    if len(d) == 0:
        return CheckResult("skip", say.no_finite(col), {}, common.log_to_enable(col))
    n = len(d)
    early, steady = d.iloc[: max(1, math.ceil(0.2 * n))], d.iloc[n - max(1, math.ceil(0.5 * n)) :]
    early_med, steady_med = float(early[col].median()), float(steady[col].median())
    cap, arrive = p["step_cap"], p["min_steps_to_arrive"]
    evidence: dict[str, Any] = {
        "early_median_steps": early_med,
        "steady_median_steps": steady_med,
        "steps_ratio": steady_med / early_med if early_med > 0 else float("nan"),
        "min_steps": float(d[col].min()),
        "max_steps": float(d[col].max()),
    }
    if cap:
        evidence["step_cap"] = cap
        evidence["frac_at_cap"] = float((steady[col] >= cap - 1e-9).mean())
    if arrive:
        evidence["min_steps_to_arrive"] = arrive
    if "flow/flow_steps" in df.columns:
        fs = df["flow/flow_steps"].to_numpy()
        if np.isfinite(fs).any():
            evidence["median_flow_steps"] = float(np.nanmedian(fs))
    if "perf/samples_per_s" in df.columns:
        sps = finite_rows(after_warmup(df, p["warmup_steps"]), "perf/samples_per_s")["perf/samples_per_s"]
        if len(sps):
            evidence["median_samples_per_s"] = float(sps.median())
            m = len(sps)
            evidence["early_samples_per_s"] = float(sps.iloc[: max(1, math.ceil(0.2 * m))].median())
            evidence["steady_samples_per_s"] = float(sps.iloc[m - max(1, math.ceil(0.5 * m)) :].median())
    summary = say.summary(evidence, cap, arrive)
    if arrive and steady_med < arrive:
        status, fix = "fail", say.NEVER_ARRIVE_FIX
        summary += say.NEVER_ARRIVE
    elif cap and evidence.get("frac_at_cap", 0) >= AT_CAP_WARN:
        status, fix = "warn", say.AT_CAP_FIX
        summary += say.at_cap(evidence["frac_at_cap"])
    elif early_med > 0 and steady_med / early_med > GROWTH_WARN:
        status, fix = "warn", say.GROWING_FIX
        summary += say.growing(steady_med / early_med)
    else:
        status, fix = "pass", None
        summary += "."
    return CheckResult(status, summary, evidence, fix)
