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
from pipeline.perf_files import read_perf
from pipeline.report.build import build_report, log_report, verdict_line
from pipeline.report.checks import REMEASURE
from pipeline.stage_outputs import read_csv, read_json

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    model_path = repo_path(cfg.train.out_dir) / "model.pt"
    run_id = tracking.read_run_file("train", model_path)["run_id"] if tracking.enabled() else ""
    steps = read_csv(TELEMETRY_DIR / "train_steps.csv", "train", required=("step",))
    perf = read_perf(cfg)  # time and memory, beside the DVC outputs (pipeline/perf_files.py)
    if perf.steps is not None:
        steps = steps.merge(perf.steps, on="step", how="left")
    else:
        log.warning("%s: the memory and step-time checks are skipped. %s", perf.missing, REMEASURE)
    events = read_json(TELEMETRY_DIR / "train_events.json", "train", expect=list)
    train_metrics = {**read_json(METRICS_DIR / "train.json", "train"), **perf.totals}
    eval_metrics = read_json(METRICS_DIR / "eval.json", "evaluate")
    result = build_report(cfg, run_id, steps, events, train_metrics, eval_metrics, unmeasured=perf.missing)
    with tracking.mlflow_run("report", cfg.run.preset, run_id=run_id):
        log_report(result)
    log.info(verdict_line(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, embed.out_dir, model, train, fault, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
