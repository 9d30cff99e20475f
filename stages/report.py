"""report: turn the training run's telemetry and evaluation into a stability verdict with evidence
for each failure mode (memory growth, step-time degradation, non-finite steps, gradient-norm
zones, loss spikes, fp16 loss scaling, adaptive-step convergence, learning against baselines):
reports/stability.md and .html with PNG plots, and metrics/stability.json.
Adds verdict (tag), figures (metrics) and files (artifacts) to the model's MLflow run, leaving the
run's status as it was.

A run that diverged (metrics/train.json has train/diverged = 1) has no model and no evaluation:
the train stage starts this stage itself, which then reports from the partial telemetry and skips
the learning check."""

from __future__ import annotations

if __name__ == "__main__":  # run as a stage: before the imports below (stages/startup.py says why)
    from stages import startup

    startup.begin()

import logging
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.core.output_transaction import outputs
from pipeline.core.paths import METRICS_DIR, REPORTS_DIR, TELEMETRY_DIR, reading_rule, repo_path
from pipeline.core.stage_outputs import read_csv, read_json
from pipeline.report.build import EVIDENCE_JSON, REPORT_FILES, STABILITY_JSON, build_report, log_report, verdict_line
from pipeline.report.checks import REMEASURE
from pipeline.tracking import store as tracking
from pipeline.train.perf_files import PERF_ARTIFACT_DIR, PERF_CSV, PERF_JSON, Perf, read_perf

from ._cli import run_stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportInputs:
    """What the report judges: the telemetry (with the run's time and memory where they are its
    own), the trainer's events, the train and evaluate stages' metrics, and why the time and
    memory are missing ("" when measured)."""

    steps: pd.DataFrame
    events: list
    train_metrics: dict
    eval_metrics: dict | None
    unmeasured: str
    diverged: bool


def read_inputs(cfg, train_metrics: dict | None = None, run_id: str = "") -> ReportInputs:
    """`train_metrics`: metrics/train.json when the caller has read it already; `run_id`: the
    model's MLflow run, whose copies of the time and memory files stand in for missing ones."""
    if train_metrics is None:
        train_metrics = read_json(METRICS_DIR / "train.json", "train")
    diverged = bool(train_metrics.get("train/diverged"))
    steps = read_csv(TELEMETRY_DIR / "train_steps.csv", "train", required=("step",))
    perf = read_perf(cfg)  # time and memory, beside the DVC outputs (pipeline/train/perf_files.py)
    if perf.steps is None and run_id:
        perf = perf_of_run(cfg, run_id, perf)
    if perf.steps is not None:
        steps = steps.merge(perf.steps, on="step", how="left")
    else:
        log.warning("%s: the memory, step-time and device checks are skipped. %s", perf.missing, REMEASURE)
    events = read_json(TELEMETRY_DIR / "train_events.json", "train", expect=list)
    eval_metrics = None if diverged else read_json(METRICS_DIR / "eval.json", "evaluate")
    return ReportInputs(steps, events, {**train_metrics, **perf.totals}, eval_metrics, perf.missing, diverged)


def perf_of_run(cfg, run_id: str, local: Perf) -> Perf:
    """The time and memory files the model's train run logged to MLflow (train/train_perf.*),
    where the ones in telemetry/ are missing or of another run: a clone that pulled the model
    with `dvc pull` has none (they are no DVC output), yet the model's run has its own. `local`
    when the run has none either, or they are of other settings too."""
    with tempfile.TemporaryDirectory(prefix="report-perf-") as tmp:
        try:
            got = tracking.download_run_files(run_id, PERF_ARTIFACT_DIR, [PERF_CSV.name, PERF_JSON.name], Path(tmp))
        except Exception as e:  # noqa: BLE001 - a store that fails here costs these checks only, not the report
            log.warning("could not read the model run's time and memory files (%s: %s)", type(e).__name__, e)
            return local
        if not got:
            return local
        with reading_rule(True):  # this stage's own temporary folder, not a path of the config's
            perf = read_perf(cfg, Path(tmp))
    if perf.steps is None:
        return local
    log.info("time and memory: from the model's MLflow run %s (%s)", run_id, local.missing)
    return perf


def model_run_id(cfg, diverged: bool) -> str:
    """The model's MLflow run ("" with tracking off)."""
    if not tracking.enabled():
        return ""
    if diverged:  # no model to find the run by: the run file the diverged run wrote
        return tracking.read_run_file("train")["run_id"]
    return tracking.read_run_file("train", repo_path(cfg.train.out_dir) / "model.pt")["run_id"]


def run(cfg) -> dict:
    train_metrics = read_json(METRICS_DIR / "train.json", "train")
    run_id = model_run_id(cfg, bool(train_metrics.get("train/diverged")))
    inputs = read_inputs(cfg, train_metrics, run_id)
    # Written aside and put in place together (pipeline/core/output_transaction.py): a report that
    # fails half-way leaves the previous one whole.
    with outputs("report", [*REPORT_FILES, EVIDENCE_JSON, STABILITY_JSON, REPORTS_DIR / "plots"]) as tx:
        result = build_report(
            cfg,
            run_id,
            inputs.steps,
            inputs.events,
            inputs.train_metrics,
            inputs.eval_metrics,
            unmeasured=inputs.unmeasured,
            tx=tx,
        )
        with tracking.adding_to_run(run_id, "report"):
            log_report(result, tx)
    log.info(verdict_line(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, embed.out_dir, model, train, fault, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
