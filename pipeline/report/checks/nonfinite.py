"""nonfinite: NaN or inf losses and gradients (as NaN gradients in AddmmBackward0, or grad_norm=inf
from a GradScaler starting at 2**16), from the trainer's events and the logged rows."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.wording import nonfinite as say

NONFINITE_KINDS = ("nan_loss", "inf_loss", "nan_grad", "inf_grad")


def nonfinite_steps(df: pd.DataFrame, events: Sequence[Mapping] | None) -> list[dict]:
    """Non-finite steps, one record per step: the events, plus rows whose loss is non-finite but
    have no event (a train stage that logs the NaN but not the event is still caught)."""
    records: dict[int, dict] = {}
    for e in events or ():
        if e.get("kind") in NONFINITE_KINDS and e.get("step") is not None:
            step = int(e["step"])
            records.setdefault(
                step, {"step": step, "kind": e["kind"], "module": e.get("module"), "action": e.get("action") or "-"}
            )
    if "train/loss" in df.columns:
        loss = df["train/loss"].to_numpy()
        for step, value in zip(df["step"].to_numpy()[~np.isfinite(loss)], loss[~np.isfinite(loss)]):
            kind = "nan_loss" if np.isnan(value) else "inf_loss"
            records.setdefault(int(step), {"step": int(step), "kind": kind, "module": None, "action": "logged"})
    return [records[s] for s in sorted(records)]


def finite_after(df: pd.DataFrame, step: float) -> bool | None:
    """Did the run produce a finite loss (else, a finite grad norm) after `step`? None: unknown."""
    for col in ("train/loss", "grad/global_norm"):
        if col in df.columns:
            later = df.loc[df["step"] > step, col].to_numpy()
            return bool(np.isfinite(later).any())
    return None


def check_nonfinite(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> CheckResult:
    if events is None and "train/loss" not in df.columns:
        return CheckResult("skip", say.SKIP_SUMMARY, {}, say.SKIP_FIX)
    recs = nonfinite_steps(df, events)
    skipped_total = int(np.nansum(df["train/skipped"].to_numpy())) if "train/skipped" in df.columns else 0
    # Non-finite gradients the rows saw: the trainer's per-step count, else rows whose norm is
    # inf/NaN (this check, not grad_norm, judges them).
    if "grad/nonfinite_steps" in df.columns:
        bad_grad = df["grad/nonfinite_steps"].to_numpy() > 0
        exploded_total = int(np.nansum(df["grad/nonfinite_steps"].to_numpy()))
    elif "grad/global_norm" in df.columns:
        bad_grad = ~np.isfinite(df["grad/global_norm"].to_numpy())
        exploded_total = int(bad_grad.sum())
    else:
        bad_grad, exploded_total = np.zeros(len(df), dtype=bool), 0
    # Rows every k steps: train/skipped counts skips between rows, so it can exceed the events seen.
    count = max(len(recs), skipped_total, exploded_total)
    skip_rows = df.loc[df["train/skipped"] > 0, "step"].tolist() if "train/skipped" in df.columns else []
    known = [r["step"] for r in recs] + [int(s) for s in skip_rows] + [int(s) for s in df["step"].to_numpy()[bad_grad]]
    last_step = int(df["step"].max()) if len(df) else 0
    total = max([last_step, *known]) if known or last_step else 0
    if count == 0:
        return CheckResult("pass", say.clean(total), {"count": 0, "total_steps": total}, None)
    fraction = count / total if total else 1.0
    recovered = finite_after(df, max(known)) if known else None
    modules = [r["module"] for r in recs if r["module"]]
    evidence: dict[str, Any] = {
        "count": count,
        "events": len(recs),
        "total_steps": total,
        "fraction": fraction,
        "recovered": "unknown" if recovered is None else recovered,
        "first_step": min(known),
        "last_step": max(known),
        "first_module": modules[0] if modules else "unknown",
        "kinds": say.kinds(recs),
        "skipped_total": skipped_total,
        "event_list": say.event_list(recs),
    }
    rare = fraction <= p["nonfinite_warn_fraction"]
    status = "warn" if rare and recovered is True else "fail"
    first_module = modules[0] if modules else None
    summary = say.summary(count, fraction, total, p["nonfinite_warn_fraction"], min(known), first_module, recovered)
    return CheckResult(status, summary, evidence, say.fix(first_module))
