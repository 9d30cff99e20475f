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

from pipeline.core.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.core.stage_outputs import read_csv, read_json
from pipeline.report.build import build_report, log_report, verdict_line
from pipeline.report.checks import REMEASURE
from pipeline.tracking import store as tracking
from pipeline.train.perf_files import read_perf

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    train_metrics = read_json(METRICS_DIR / "train.json", "train")
    diverged = bool(train_metrics.get("train/diverged"))
    if not tracking.enabled():
        run_id = ""
    elif diverged:  # no model to find the run by: the run file the diverged run wrote
        run_id = tracking.read_run_file("train")["run_id"]
    else:
        run_id = tracking.read_run_file("train", repo_path(cfg.train.out_dir) / "model.pt")["run_id"]
    steps = read_csv(TELEMETRY_DIR / "train_steps.csv", "train", required=("step",))
    perf = read_perf(cfg)  # time and memory, beside the DVC outputs (pipeline/train/perf_files.py)
    if perf.steps is not None:
        steps = steps.merge(perf.steps, on="step", how="left")
    else:
        log.warning("%s: the memory, step-time and device checks are skipped. %s", perf.missing, REMEASURE)
    events = read_json(TELEMETRY_DIR / "train_events.json", "train", expect=list)
    train_metrics = {**train_metrics, **perf.totals}
    eval_metrics = None if diverged else read_json(METRICS_DIR / "eval.json", "evaluate")
    result = build_report(cfg, run_id, steps, events, train_metrics, eval_metrics, unmeasured=perf.missing)
    with tracking.adding_to_run(run_id, "report"):
        log_report(result)
    log.info(verdict_line(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, embed.out_dir, model, train, fault, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
