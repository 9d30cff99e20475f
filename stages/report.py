"""report: turn the training run's telemetry and evaluation into a stability verdict with evidence
for each failure mode (memory growth, step-time degradation, non-finite steps, gradient-norm
zones, loss spikes, fp16 loss scaling, adaptive-step convergence, learning against baselines):
reports/stability.md and .html with PNG plots, and metrics/stability.json.
Adds verdict (tag), figures (metrics) and files (artifacts) to the model's MLflow run."""
from __future__ import annotations

import json
import logging
import sys

import pandas as pd

from pipeline import tracking
from pipeline.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.report.build import build_report, log_report, verdict_line

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    run_id = tracking.read_run_file(repo_path(cfg.train.out_dir))["run_id"]
    steps = pd.read_csv(TELEMETRY_DIR / "train_steps.csv")
    events = json.loads((TELEMETRY_DIR / "train_events.json").read_text())
    train_metrics = json.loads((METRICS_DIR / "train.json").read_text())
    eval_metrics = json.loads((METRICS_DIR / "eval.json").read_text())
    result = build_report(cfg, run_id, steps, events, train_metrics, eval_metrics)
    with tracking.mlflow_run("report", cfg.run.preset, run_id=run_id):
        log_report(result)
    log.info(verdict_line(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, train.out_dir, train.grad_*, train.spike_*, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
