"""Stability checks: one verdict per failure mode, the prototype's (docs/prototype.md) and others;
docs/checks.md describes each check, its thresholds and what to do when it fails.

Each check reads the train stage's telemetry (one row per logged optimizer step, plus an event
list) and returns a CheckResult (result.py): status pass|warn|fail|skip|n/a, summary, evidence,
fix. A check whose columns are missing says "skip" and why; it never guesses and never crashes.

The failure modes, and the check (one module each) that catches it:
- memory exhausted on batch 2 (graph kept alive across steps)  -> memory_growth
- step time collapsing after batch 1 (host syncs, empty_cache)  -> step_time (step_time_degradation)
- a GPU left idle by host syncs, tiny kernels or data waits       -> device_utilisation (CUDA runs)
- NaN gradients in AddmmBackward0                                -> nonfinite
- grad_norm=inf from a GradScaler starting at 2**16              -> nonfinite, scaler
- gradient norms that sit in the critical zone                   -> grad_norm
- loss spikes                                                    -> loss_spikes
- a loss that climbs back above its best and stays there          -> loss_regression
- a GradScaler that starts too high and keeps overflowing        -> scaler (fp16 runs only)
- flows that die before arriving / adaptive stop doing nothing    -> convergence
- a run that "finishes" without learning anything, or worse than a
  baseline that needs no training                                 -> learning (needs eval metrics)

What each check says (summary, fix) lives in wording/, apart from the judgement; suite.py runs
them all; metrics_file.py turns the result into the metrics files; params.py reads the thresholds.
The names below are the package's public ones.
"""

from pipeline.report.checks.convergence import check_convergence
from pipeline.report.checks.device_utilisation import DEVICE_BUSY, check_device_utilisation
from pipeline.report.checks.grad_norm import check_grad_norm, zone_step_fractions
from pipeline.report.checks.learning import check_learning
from pipeline.report.checks.loss_regression import check_loss_regression, find_regressions, regression_scan
from pipeline.report.checks.loss_spikes import check_loss_spikes, spike_scan
from pipeline.report.checks.memory_growth import MEMORY_SERIES, check_memory_growth, fit_memory
from pipeline.report.checks.metrics_file import WALL_CLOCK_CHECKS, stability_metrics
from pipeline.report.checks.nonfinite import check_nonfinite, nonfinite_steps
from pipeline.report.checks.params import TRAIN_KEYS, RunFacts, resolve_params
from pipeline.report.checks.result import STATUSES, CheckResult
from pipeline.report.checks.scaler import check_scaler, scaler_history
from pipeline.report.checks.step_time import FLOW_STEP_MS, check_step_time, judged_time, step_time_split
from pipeline.report.checks.suite import CHECK_ORDER, MEASURED_CHECKS, WARNED, headline_verdict, run_checks
from pipeline.report.checks.telemetry import prepare_steps
from pipeline.report.checks.wording.common import REMEASURE

__all__ = [
    "CHECK_ORDER",
    "DEVICE_BUSY",
    "FLOW_STEP_MS",
    "MEASURED_CHECKS",
    "MEMORY_SERIES",
    "REMEASURE",
    "STATUSES",
    "TRAIN_KEYS",
    "WALL_CLOCK_CHECKS",
    "WARNED",
    "CheckResult",
    "RunFacts",
    "check_convergence",
    "check_device_utilisation",
    "check_grad_norm",
    "check_learning",
    "check_loss_regression",
    "check_loss_spikes",
    "check_memory_growth",
    "check_nonfinite",
    "check_scaler",
    "check_step_time",
    "find_regressions",
    "fit_memory",
    "headline_verdict",
    "judged_time",
    "nonfinite_steps",
    "prepare_steps",
    "regression_scan",
    "resolve_params",
    "run_checks",
    "scaler_history",
    "spike_scan",
    "stability_metrics",
    "step_time_split",
    "zone_step_fractions",
]
