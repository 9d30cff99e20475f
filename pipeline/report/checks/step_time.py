"""step_time_degradation: training steps that get slower as the run goes on (host syncs,
empty_cache() in the loop, a logging cost that grows with history, data waits). The steady
median against the early one, per flow step where the trainer logs it."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import after_warmup, finite_rows
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import step_time as say

STEP_MS = "perf/step_ms"
FLOW_STEP_MS = "perf/flow_step_ms"  # a window's step time over its mean flow steps per training step
MIN_TIME_ROWS = 10  # so the early 20 % holds at least 2 rows


def step_time_split(df: pd.DataFrame, p: Mapping, col: str = STEP_MS) -> tuple[pd.DataFrame, pd.DataFrame] | str:
    """(early, steady) rows of `col` after warm-up: first 20 % and last 50 %, or why not."""
    d = finite_rows(after_warmup(df, p["warmup_steps"]), col)
    d = d[d[col] > 0]
    n = len(d)
    if n < MIN_TIME_ROWS:
        return f"{n} timed rows after warm-up (need {MIN_TIME_ROWS})"
    return d.iloc[: math.ceil(0.2 * n)], d.iloc[n - math.ceil(0.5 * n) :]


def judged_time(df: pd.DataFrame, p: Mapping) -> str:
    """The time the step-time check judges: perf/flow_step_ms where enough rows after warm-up have
    it, else perf/step_ms (telemetry from before the time per flow step was logged)."""
    per_flow = FLOW_STEP_MS in df.columns and not isinstance(step_time_split(df, p, FLOW_STEP_MS), str)
    return FLOW_STEP_MS if per_flow else STEP_MS


def median_at(df: pd.DataFrame, col: str, steps: pd.Series) -> float:
    """Median of df[col] over the rows of `steps` (NaN when col is not logged)."""
    if col not in df.columns:
        return float("nan")
    series = pd.to_numeric(df.set_index("step")[col], errors="coerce")
    series = series[~series.index.duplicated(keep="last")]
    return float(series.reindex(steps).median())


def flow_steps_ratio(df: pd.DataFrame, early: pd.DataFrame, steady: pd.DataFrame) -> float | None:
    """Median flow steps per training step over the steady rows, over the early rows' (the
    split's steps, read from df); None when not logged."""
    a = median_at(df, "flow/steps_used", early["step"])
    b = median_at(df, "flow/steps_used", steady["step"])
    return float(b / a) if np.isfinite(a) and np.isfinite(b) and a > 0 else None


def check_step_time(df: pd.DataFrame, p: Mapping) -> CheckResult:
    fix = say.FIX
    if STEP_MS not in df.columns:
        return CheckResult("skip", common.not_logged(STEP_MS), {}, common.log_to_enable(STEP_MS))
    # The adaptive flow loop takes more flow steps per batch as training changes the model (a bad
    # update such as fault=lr_spike's makes flows arrive later), and each flow step costs time: a
    # slower training step can be more work with nothing wrong in the loop. So the time per flow
    # step is judged where the trainer logs it; telemetry without it (older runs) is judged per
    # training step, as before.
    col = judged_time(df, p)
    per_flow = col == FLOW_STEP_MS
    split = step_time_split(df, p, col)
    if isinstance(split, str):
        fix = say.too_little_data_fix(MIN_TIME_ROWS)
        return CheckResult("skip", say.too_little_data(split), {"reason": split}, fix)
    early, steady = split
    early_ms = median_at(df, STEP_MS, early["step"])
    steady_ms = median_at(df, STEP_MS, steady["step"])
    step_ratio = steady_ms / early_ms
    early_judged, steady_judged = float(early[col].median()), float(steady[col].median())
    ratio = steady_judged / early_judged
    max_ratio = p["step_time_max_ratio"]
    timed = finite_rows(after_warmup(df, p["warmup_steps"]), col)
    rho, rho_p = stats.spearmanr(timed["step"], timed[col]) if len(timed) > 2 else (np.nan, np.nan)
    evidence: dict[str, Any] = {
        "judged": say.judged(per_flow),
        "early_median_ms": early_ms,
        "steady_median_ms": steady_ms,
    }
    if per_flow:  # step_ratio: context, what the ratio per training step would have said
        evidence.update(early_flow_step_ms=early_judged, steady_flow_step_ms=steady_judged, step_ratio=step_ratio)
    evidence.update(ratio=ratio, max_ratio=max_ratio, spearman_rho=float(rho), spearman_p=float(rho_p))
    evidence["early_steps"] = f"{int(early['step'].iloc[0])}-{int(early['step'].iloc[-1])}"
    evidence["steady_steps"] = f"{int(steady['step'].iloc[0])}-{int(steady['step'].iloc[-1])}"
    if "perf/samples_per_s" in df.columns:  # throughput: the same slices, the number people quote
        evidence["early_samples_per_s"] = median_at(df, "perf/samples_per_s", early["step"])
        evidence["steady_samples_per_s"] = median_at(df, "perf/samples_per_s", steady["step"])
    flow_ratio = flow_steps_ratio(df, early, steady)
    if flow_ratio is not None:
        evidence["flow_steps_ratio"] = flow_ratio
    status = "fail" if ratio > max_ratio else "pass"
    trend = say.trend(rho, rho_p)
    if per_flow:
        summary = say.per_flow_summary(evidence, trend)
        # The other way round: a step's work that does not scale with its flow steps (optimizer,
        # data, the layers around the lattice) spread over fewer flow steps raises the time per
        # flow step with nothing slower. When the step itself is within the limit, a warning.
        if status == "fail" and step_ratio <= max_ratio:
            status = "warn"
            summary += say.FEWER_FLOW_STEPS
            fix = say.FEWER_FLOW_STEPS_FIX
        return CheckResult(status, summary, evidence, fix)
    summary = say.per_step_summary(evidence, trend)
    # Without the time per flow step, a rise the flow steps account for is a warning that says so,
    # not a failure.
    if status == "fail" and flow_ratio is not None and ratio <= max_ratio * flow_ratio:
        status = "warn"
        summary += say.more_flow_steps(flow_ratio)
        fix = say.MORE_FLOW_STEPS_FIX
    return CheckResult(status, summary, evidence, fix)
