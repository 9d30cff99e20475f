"""loss_regression: the smoothed loss held above its running best (a stretch of training that
undid progress), which the spike test misses once its trailing window has absorbed the higher
level; and the module whose gradient or update ratio moved first."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import after_warmup, finite_rows
from pipeline.report.checks.wording import loss_regression as say

# Columns that say what the optimizer did to each module: grad/<module>/norm (the trainer logs one
# per top-level module) and grad/<module>/update_ratio where a trainer logs it per module; the
# global grad/update_ratio (|update| / |weights|, sampled once per logged row) stands for all.
MODULE_SERIES = re.compile(r"^grad/(?P<module>[^/]+)/(?P<kind>norm|update_ratio)$")
MIN_REGRESSION_ROWS = 5  # a median over fewer finite rows smooths nothing


def regression_scan(df: pd.DataFrame, p: Mapping) -> pd.DataFrame | str:
    """Per finite-loss row after warm-up: step, loss, smoothed (a centred rolling median), best
    (the running minimum of smoothed before this row) and rise (smoothed / best - 1); or why not.

    The median spans 2h + 1 rows, h = max(2, regression_min_steps / 2 rows): a centred median of
    2h + 1 rows erases any excursion of h rows or fewer, so a spike (the loss_spikes check's
    business) never reaches the rise test, while a step up that lasts longer keeps its start and
    end steps (a median does not smear an edge as a mean does, and centred it does not lag)."""
    if "train/loss" not in df.columns:
        return "train/loss not logged"
    d = finite_rows(after_warmup(df, p["warmup_steps"]), "train/loss").reset_index(drop=True)
    if len(d) < MIN_REGRESSION_ROWS:
        return f"{len(d)} finite loss rows after warm-up (need {MIN_REGRESSION_ROWS})"
    steps = d["step"].to_numpy()
    spacing = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    half = max(2, int(p["regression_min_steps"] // (2 * max(spacing, 1.0))))
    smoothed = d["train/loss"].rolling(2 * half + 1, center=True, min_periods=1).median().to_numpy()
    if not (smoothed > 0).all():
        return "the loss is not positive throughout: a rise relative to its best is undefined"
    best = np.minimum.accumulate(smoothed)
    before = np.concatenate([[smoothed[0]], best[:-1]])
    return pd.DataFrame(
        {
            "step": steps,
            "loss": d["train/loss"].to_numpy(),
            "smoothed": smoothed,
            "best": before,
            "rise": smoothed / before - 1,
        }
    ).assign(window_rows=2 * half + 1)


def find_regressions(scan: pd.DataFrame, p: Mapping) -> list[dict]:
    """Each stretch where the smoothed loss stays above its running best before the stretch by more
    than regression_rise: start, peak, the best it is measured against, end (the first row back
    within the limit) or none; `regression` is True when it lasted more than regression_min_steps
    (or still lasts at the end of training, for that long)."""
    steps, smoothed, best = scan["step"].to_numpy(), scan["smoothed"].to_numpy(), scan["best"].to_numpy()
    limit = 1 + p["regression_rise"]
    found, i, n = [], 1, len(scan)
    while i < n:
        if smoothed[i] <= best[i] * limit:
            i += 1
            continue
        ref, start = best[i], i  # the running best cannot move while the loss is above it
        j = i
        while j < n and smoothed[j] > ref * limit:
            j += 1
        peak = start + int(np.argmax(smoothed[start:j]))
        recovered = j < n
        duration = int(steps[j] - steps[start]) if recovered else int(steps[-1] - steps[start])
        found.append(
            {
                "start_step": int(steps[start]),
                "peak_step": int(steps[peak]),
                "peak_loss": float(smoothed[peak]),
                "best_loss": float(ref),
                "peak_rise": float(smoothed[peak] / ref - 1),
                "rise_loss": float(smoothed[peak] - ref),
                "duration": duration,
                "recovered": recovered,
                "recovery_step": int(steps[j]) if recovered else None,
                "regression": duration > p["regression_min_steps"],
            }
        )
        i = j
    return found


def module_series(df: pd.DataFrame) -> dict[str, str]:
    """{column: label} of the per-module gradient norms and update ratios the telemetry holds, and
    the global update ratio."""
    out = {}
    for col in df.columns:
        m = MODULE_SERIES.match(str(col))
        if m:
            out[col] = say.series_label(m["module"], m["kind"])
    if "grad/update_ratio" in df.columns:
        out["grad/update_ratio"] = say.GLOBAL_UPDATE_RATIO
    return out


def regression_movers(df: pd.DataFrame, reg: Mapping, p: Mapping, half_rows: int) -> list[dict]:
    """Per module series: its level before the regression (median over the regression_min_steps
    before the start), its level around the start (median over the regression_min_steps from the
    start, or until the recovery) and the factor between them. A series moved when that factor is
    beyond 1 + regression_rise either way (the bar the loss itself had to pass); its first step is
    where its smoothed value (the same centred median as the loss's) first crossed that bar, from
    half a span before the start. Sorted: moved series by first step, the larger factor first among
    equals; then the others, larger factor first."""
    span = p["regression_min_steps"]
    start = reg["start_step"]
    end = max(min(start + span, reg["recovery_step"] or math.inf), start + 1)
    bar = math.log1p(p["regression_rise"])
    out = []
    for col, label in module_series(df).items():
        d = finite_rows(after_warmup(df, p["warmup_steps"]), col)
        d = d[d[col] > 0]  # a factor of a zero level says nothing
        before = d[(d["step"] >= start - span) & (d["step"] < start)][col]
        if len(before) < 2:  # a regression right after warm-up: what there is before it
            before = d[d["step"] < start][col]
        around = d[(d["step"] >= start) & (d["step"] < end)][col]
        if before.empty or around.empty:
            continue
        base = float(before.median())
        factor = float(around.median()) / base
        first = None
        if abs(math.log(factor)) > bar:
            smooth = d.set_index("step")[col].rolling(2 * half_rows + 1, center=True, min_periods=1).median()
            near = smooth[(smooth.index >= start - span / 2) & (smooth.index < end)]
            shift = np.log(near.to_numpy() / base) * (1 if factor > 1 else -1)
            crossed = near.index[shift > bar]
            first = int(crossed[0]) if len(crossed) else int(start)
        out.append({"series": col, "label": label, "factor": factor, "first_step": first})
    return sorted(out, key=lambda m: (m["first_step"] is None, m["first_step"] or 0, -abs(math.log(m["factor"]))))


def check_loss_regression(df: pd.DataFrame, p: Mapping) -> CheckResult:
    scan = regression_scan(df, p)
    if isinstance(scan, str):
        return CheckResult("skip", say.skip_summary(scan), {"reason": scan}, say.skip_fix(MIN_REGRESSION_ROWS))
    rise, min_steps = p["regression_rise"], p["regression_min_steps"]
    window = int(scan["window_rows"].iloc[0])
    i_max = int(np.argmax(scan["rise"].to_numpy()[1:])) + 1 if len(scan) > 1 else 0
    found = find_regressions(scan, p)
    regressions = [r for r in found if r["regression"]]
    # A rise still open at the end of training, shorter than regression_min_steps: too short to
    # call a regression, but the model the run ends with is that much worse than its best.
    pending = [r for r in found if not r["regression"] and not r["recovered"]]
    evidence: dict[str, Any] = {
        "regressions": len(regressions),
        "rows": len(scan),
        "window_rows": window,
        "max_rise": max(0.0, float(scan["rise"].iloc[i_max])),  # a loss that only falls: 0, not -0.2 %
        "max_rise_step": int(scan["step"].iloc[i_max]),
        "limit_rise": rise,
        "min_duration": min_steps,
    }
    rule = say.rule(rise, min_steps)
    if not regressions:
        if pending:
            r = pending[-1]
            evidence.update({k: r[k] for k in ("start_step", "peak_step", "peak_loss", "best_loss", "peak_rise")})
            return CheckResult("warn", say.pending(r, rule), evidence, say.FIX)
        summary = say.clean(window, evidence["max_rise"], evidence["max_rise_step"], rule)
        return CheckResult("pass", summary, evidence, None)

    unrecovered = [r for r in regressions if not r["recovered"]]
    worst = max(regressions, key=lambda r: r["peak_rise"])
    movers = regression_movers(df, worst, p, (window - 1) // 2)
    evidence.update(
        {
            "unrecovered_regressions": len(unrecovered),
            "start_step": worst["start_step"],
            "peak_step": worst["peak_step"],
            "peak_loss": worst["peak_loss"],
            "best_loss": worst["best_loss"],
            "peak_ratio": worst["peak_loss"] / worst["best_loss"],
            "peak_rise": worst["peak_rise"],
            "rise_loss": worst["rise_loss"],
            "duration": worst["duration"],
            "recovered": worst["recovered"],
        }
    )
    if worst["recovered"]:
        evidence["recovery_step"] = worst["recovery_step"]
    if movers:
        first = movers[0]
        if first["first_step"] is not None:
            evidence.update(
                moved_first=first["label"], moved_first_ratio=first["factor"], moved_first_step=first["first_step"]
            )
        else:  # nothing crossed the bar: the largest change, not called a mover
            evidence.update(largest_change=first["label"], largest_change_ratio=first["factor"])
        evidence["movers"] = say.movers(movers)
    if len(regressions) > 1:
        evidence["regression_list"] = say.regression_list(regressions)
    elsewhere = unrecovered[0] if unrecovered and unrecovered[0] is not worst else None
    summary = say.summary(len(regressions), worst, movers, elsewhere, rise)
    status = "fail" if unrecovered else "warn"
    return CheckResult(status, summary, evidence, say.FIX)
