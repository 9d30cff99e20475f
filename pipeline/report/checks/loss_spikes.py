"""loss_spikes: a loss far above its trailing window (mean + k·std, the trainer's own detector),
from the logged rows and the trainer's loss_spike events; did the loss come back?"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline.core.config import MIN_SPIKE_WINDOW
from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import finite_number, finite_rows
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import loss_spikes as say


def spike_scan(df: pd.DataFrame, p: Mapping) -> pd.DataFrame:
    """Per finite-loss row: step, loss, threshold (mean + k*std of the trailing window of finite
    losses, NaN with fewer than 10), sigma, ratio (loss / trailing mean), spike (bool)."""
    cols = ["step", "loss", "threshold", "sigma", "ratio", "spike"]
    if "train/loss" not in df.columns:
        return pd.DataFrame(columns=cols)
    d = finite_rows(df, "train/loss").reset_index(drop=True)
    loss = d["train/loss"]
    # As the trainer's detector: a window shorter than MIN_SPIKE_WINDOW (only a plain mapping can
    # hold one; the schema refuses it) judges once it is full.
    trailing = loss.shift(1).rolling(p["spike_window"], min_periods=min(MIN_SPIKE_WINDOW, p["spike_window"]))
    mean = trailing.mean()
    # Floor std at 1e-9 * |mean| so a perfectly flat loss does not divide by zero.
    std = np.maximum(trailing.std(), 1e-9 * mean.abs())
    # A row is the mean loss of the steps since the previous row. A shorter window (the run's
    # last, partial one) is noisier by sqrt(usual / its own steps): widen its band accordingly,
    # or a single final step reads as a 6-sigma spike against 5-step means.
    window = d["step"].diff().fillna(d["step"].iloc[0]).clip(lower=1)
    std = std * np.sqrt(np.maximum(window.median() / window, 1.0))
    threshold = mean + p["spike_k"] * std
    return pd.DataFrame(
        {
            "step": d["step"],
            "loss": loss,
            "threshold": threshold,
            "sigma": (loss - mean) / std,
            "ratio": loss / mean,
            "spike": (loss > threshold).fillna(False).astype(bool),
        }
    )


def unrecovered_spikes(scan: pd.DataFrame, spike_steps: Sequence[int]) -> list[int]:
    """Spikes the loss did not come back from: the median of the last 10 % of rows (those after
    the spike) is not back under the detection threshold in force at the spike, i.e. inside the
    loss's normal range of that time."""
    n_tail = max(1, math.ceil(0.1 * len(scan)))
    steps_arr = scan["step"].to_numpy()
    thr, loss = scan["threshold"].to_numpy(), scan["loss"].to_numpy()
    tail_steps, tail_loss = steps_arr[-n_tail:], loss[-n_tail:]
    unrecovered = []
    for s in spike_steps:  # searchsorted, not a scan per spike: runs can have 1e5 rows
        i = np.searchsorted(steps_arr, s)  # first row at or after the spike
        ref = np.nan if i == len(scan) else (thr[i] if np.isfinite(thr[i]) else loss[i])
        after = tail_loss[tail_steps > s]
        if after.size == 0 or not np.isfinite(ref) or np.median(after) >= ref:
            unrecovered.append(s)
    return unrecovered


def check_loss_spikes(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> CheckResult:
    spike_events = [e for e in events or () if e.get("kind") == "loss_spike" and e.get("step") is not None]
    event_steps = sorted({int(e["step"]) for e in spike_events})
    if "train/loss" not in df.columns:
        if not event_steps:
            return CheckResult("skip", say.NOTHING, {}, common.log_to_enable("train/loss"))
        evidence = {"count": len(event_steps), "steps": common.steps_text(event_steps), "from_events": len(event_steps)}
        return CheckResult("warn", say.events_only(event_steps), evidence, say.FIX)
    scan = spike_scan(df, p)
    if scan.empty:
        return CheckResult("skip", say.NO_FINITE_LOSS, {}, common.log_to_enable("train/loss"))
    rows = scan[scan["spike"]]
    spike_steps = sorted(set(rows["step"].astype(int)) | set(event_steps))
    if not spike_steps:
        summary = say.clean(len(scan), p["spike_k"], p["spike_window"])
        return CheckResult("pass", summary, {"count": 0, "rows": len(scan)}, None)

    unrecovered = unrecovered_spikes(scan, spike_steps)
    tail = scan.iloc[-max(1, math.ceil(0.1 * len(scan))) :]
    # Severity: the spike's loss over the trailing mean. A row is a window's mean loss, which
    # dilutes one bad step; an event holds the step's own loss against its threshold (mean +
    # k·std >= mean, so loss / threshold understates the ratio): take the larger.
    ratios = [(float(r["ratio"]), int(r["step"])) for _, r in rows.iterrows() if np.isfinite(r["ratio"])]
    ratios += [
        (float(e["loss"]) / float(e["threshold"]), int(e["step"]))
        for e in spike_events
        if finite_number(e.get("threshold")) and e["threshold"] > 0 and finite_number(e.get("loss"))
    ]
    worst_ratio, worst_step = max(ratios) if ratios else (float("nan"), spike_steps[0])
    severe = sorted({st for r, st in ratios if r >= p["spike_fail_factor"]})
    largest = rows.loc[rows["loss"].idxmax()] if len(rows) else None
    evidence: dict[str, Any] = {
        "count": len(spike_steps),
        "steps": common.steps_text(spike_steps),
        "first_step": spike_steps[0],
        "from_rows": len(rows),
        "from_events": len(event_steps),
        "max_ratio": worst_ratio,
        "max_ratio_step": worst_step,
        "severe": len(severe),
        "fail_factor": p["spike_fail_factor"],
        "tail_median_loss": float(tail["loss"].median()),
        "recovered": not unrecovered,
        "unrecovered": len(unrecovered),
    }
    if largest is not None:
        evidence["largest_spike_step"] = int(largest["step"])
        evidence["largest_spike_loss"] = float(largest["loss"])
        evidence["largest_spike_sigma"] = float(largest["sigma"])
    status = "fail" if unrecovered or severe else "warn"
    summary = say.summary(spike_steps, evidence, bool(ratios))
    return CheckResult(status, summary, evidence, say.FIX)
