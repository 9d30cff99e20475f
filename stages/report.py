"""report: turn the training run's telemetry and evaluation into a stability verdict with evidence
for each failure mode (memory growth, step-time degradation, non-finite steps, gradient-norm
zones, loss spikes, fp16 loss scaling, adaptive-step convergence, learning against baselines):
reports/stability.md and .html with PNG plots, and metrics/stability.json.
Adds verdict (tag), figures (metrics) and files (artifacts) to the model's MLflow run."""
from __future__ import annotations

import logging
import sys

from pipeline import tracking
from pipeline.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.report.build import build_report, log_report, verdict_line
from pipeline.stage_outputs import read_csv, read_json

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    run_id = tracking.read_run_file(repo_path(cfg.train.out_dir))["run_id"]
    steps = read_csv(TELEMETRY_DIR / "train_steps.csv", "train", required=("step",))
    events = read_json(TELEMETRY_DIR / "train_events.json", "train", expect=list)
    train_metrics = read_json(METRICS_DIR / "train.json", "train")
    eval_metrics = read_json(METRICS_DIR / "eval.json", "evaluate")
    result = build_report(cfg, run_id, steps, events, train_metrics, eval_metrics)
    with tracking.mlflow_run("report", cfg.run.preset, run_id=run_id):
        log_report(result)
    log.info(verdict_line(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, train.out_dir, train.grad_*, train.spike_*, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
