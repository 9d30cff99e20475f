"""All the checks on one run, in their fixed order, and the verdict they add up to."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd

from pipeline.report.checks.convergence import check_convergence
from pipeline.report.checks.device_utilisation import check_device_utilisation
from pipeline.report.checks.grad_norm import check_grad_norm
from pipeline.report.checks.learning import check_learning
from pipeline.report.checks.loss_regression import check_loss_regression
from pipeline.report.checks.loss_spikes import check_loss_spikes
from pipeline.report.checks.memory_growth import check_memory_growth
from pipeline.report.checks.nonfinite import check_nonfinite
from pipeline.report.checks.params import resolve_params
from pipeline.report.checks.result import STATUS_RANK, CheckResult
from pipeline.report.checks.scaler import check_scaler
from pipeline.report.checks.step_time import check_step_time
from pipeline.report.checks.telemetry import prepare_steps
from pipeline.report.checks.wording.common import REMEASURE, unmeasured_summary

# (steps, events, params, eval metrics) -> result; each check takes what it reads.
Check = Callable[[pd.DataFrame, list | None, Mapping, Mapping | None], CheckResult]

# The canonical order (the report's within a status, the metrics file's): each check with the
# inputs it reads.
CHECKS: dict[str, Check] = {
    "memory_growth": lambda df, ev, p, em: check_memory_growth(df, p),
    "step_time_degradation": lambda df, ev, p, em: check_step_time(df, p),
    "device_utilisation": lambda df, ev, p, em: check_device_utilisation(df, p),
    "nonfinite": lambda df, ev, p, em: check_nonfinite(df, ev, p),
    "grad_norm": lambda df, ev, p, em: check_grad_norm(df, p),
    "loss_spikes": lambda df, ev, p, em: check_loss_spikes(df, ev, p),
    "loss_regression": lambda df, ev, p, em: check_loss_regression(df, p),
    "scaler": lambda df, ev, p, em: check_scaler(df, ev, p),
    "convergence": lambda df, ev, p, em: check_convergence(df, p),
    "learning": lambda df, ev, p, em: check_learning(em, p, df),
}
CHECK_ORDER = tuple(CHECKS)
# The checks that judge the run's time and memory measurements (telemetry/train_perf.*): skipped
# when the run has none of its own (`unmeasured`), and, since those figures differ on every run,
# their evidence stays out of the DVC metrics file (two identical runs must give identical
# hashes); the report and MLflow show it.
MEASURED_CHECKS = frozenset({"memory_growth", "step_time_degradation", "device_utilisation"})
WARNED = "stable, with warnings"


def run_checks(
    steps: pd.DataFrame | None,
    events: Sequence[Mapping] | None,
    params: Mapping | None,
    eval_metrics: Mapping | None = None,
    unmeasured: str = "",
) -> dict:
    """All checks. `checks` is ordered fail, warn, skip, pass, n/a (canonical order within a
    status); `failed` lists the failed check names in canonical order. `unmeasured`: why this
    run has no time and memory measurements; the checks of MEASURED_CHECKS are then skipped
    and say so, instead of judging columns that are not there."""
    p = resolve_params(params)
    df = prepare_steps(steps)
    events = list(events) if events is not None else None
    checks: dict[str, CheckResult] = {}
    for name, check in CHECKS.items():
        if unmeasured and name in MEASURED_CHECKS:
            checks[name] = CheckResult("skip", unmeasured_summary(unmeasured), {}, REMEASURE)
        else:
            checks[name] = check(df, events, p, eval_metrics)
    failed = [n for n in CHECK_ORDER if checks[n]["status"] == "fail"]
    ordered = dict(sorted(checks.items(), key=lambda kv: STATUS_RANK[kv[1]["status"]]))
    return {"verdict": "unstable" if failed else "stable", "checks": ordered, "failed": failed}


def headline_verdict(result: Mapping) -> str:
    """What a reader is told first (the banner, the MLflow tag stability.verdict): "stable" only
    when no check failed or warned; "stable, with warnings" when one warned (a model worse than a
    baseline is not one to show in green); "unstable" when one failed."""
    if result["verdict"] != "stable":
        return "unstable"
    return WARNED if any(c["status"] == "warn" for c in result["checks"].values()) else "stable"
