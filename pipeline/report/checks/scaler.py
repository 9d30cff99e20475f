"""scaler: an fp16 GradScaler that starts too high and keeps overflowing (each backoff is a lost
update), or whose scale collapses below 1. fp32 and bf16 runs have no scaler: n/a."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline.report.checks.nonfinite import NONFINITE_KINDS
from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import finite_number, finite_rows
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import scaler as say


def scaler_history(df: pd.DataFrame, events: Sequence[Mapping] | None) -> pd.DataFrame:
    """(step, scale, backoff) per logged row and per backoff event, sorted by step. Empty when the
    run had no GradScaler (amp/scale NaN throughout: fp32/bf16)."""
    parts = []
    if "amp/scale" in df.columns:
        d = finite_rows(df, "amp/scale").rename(columns={"amp/scale": "scale"})
        parts.append(d.assign(backoff=False))
    ev = [
        (int(e["step"]), float(e["scale"]))
        for e in events or ()
        if e.get("kind") in NONFINITE_KINDS and e.get("step") is not None and finite_number(e.get("scale"))
    ]
    if ev:
        parts.append(pd.DataFrame(ev, columns=["step", "scale"]).assign(backoff=True))
    if not parts:
        return pd.DataFrame(columns=["step", "scale", "backoff"])
    return pd.concat(parts, ignore_index=True).sort_values(["step", "backoff"], kind="stable").reset_index(drop=True)


def check_scaler(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> CheckResult:
    hist = scaler_history(df, events)
    if hist.empty:
        return CheckResult("n/a", say.NO_SCALER, {}, None)
    scale = hist["scale"].to_numpy(dtype=float)
    backoff_steps = sorted(set(hist.loc[hist["backoff"], "step"].astype(int)))
    rows = hist[~hist["backoff"]]
    growths = int((np.diff(rows["scale"].to_numpy(dtype=float)) > 0).sum()) if len(rows) > 1 else 0
    total = int(max(df["step"].max() if len(df) else 0, max(backoff_steps, default=0)))
    fraction = len(backoff_steps) / total if total else 0.0
    i_min = int(np.argmin(scale))
    evidence: dict[str, Any] = {
        "first_scale": float(scale[0]),
        "min_scale": float(scale[i_min]),
        "min_scale_step": int(hist["step"].iloc[i_min]),
        "final_scale": float(scale[-1]),
        "backoffs": len(backoff_steps),
        "backoff_fraction": fraction,
        "growths": growths,
        "total_steps": total,
    }
    if backoff_steps:
        evidence["first_backoff_step"] = backoff_steps[0]
        evidence["backoff_steps"] = common.steps_text(backoff_steps)
    collapsed = scale[i_min] < p["scaler_min_scale"]
    if collapsed or fraction > p["scaler_max_backoff_fraction"]:
        status = "fail"
    elif backoff_steps:
        status = "warn"
    else:
        status = "pass"
    summary = say.summary(evidence, collapsed, p)
    return CheckResult(status, summary, evidence, say.fix(collapsed))
