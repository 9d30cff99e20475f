"""report: turn the training run's telemetry into a stability verdict with evidence for each
failure mode of the seeds (memory growth, step-time degradation, non-finite steps, gradient-norm
zones, loss spikes): reports/stability.md and .html with PNG plots, and metrics/stability.json.
Adds verdict (tag), figures (metrics) and files (artifacts) to the model's MLflow run."""
from __future__ import annotations

import json
import logging
import sys

import pandas as pd

from pipeline import tracking
from pipeline.atomic import write_json, write_text
from pipeline.paths import METRICS_DIR, REPORTS_DIR, TELEMETRY_DIR, repo_path
from pipeline.report.checks import TRAIN_KEYS, run_checks, stability_metrics
from pipeline.report.plots import make_plots
from pipeline.report.render import render_html, render_markdown

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    run_info = tracking.read_run_file(repo_path(cfg.train.out_dir))
    steps = pd.read_csv(TELEMETRY_DIR / "train_steps.csv")
    events = json.loads((TELEMETRY_DIR / "train_events.json").read_text())
    train_metrics = json.loads((METRICS_DIR / "train.json").read_text())
    eval_metrics = json.loads((METRICS_DIR / "eval.json").read_text())
    params = {**dict(cfg.report), **{k: cfg.train[k] for k in TRAIN_KEYS},
              "planned_steps": int(train_metrics.get("train/steps", len(steps))),
              "resumed_from_step": int(train_metrics.get("train/resumed_from_step", 0))}
    result = run_checks(steps, events, params)
    plots = make_plots(steps, events, params, REPORTS_DIR / "plots")
    info = {"run_id": run_info["run_id"], "preset": cfg.run.preset, **train_metrics}
    write_text(REPORTS_DIR / "stability.md", render_markdown(result, plots, info, eval_metrics))
    write_text(REPORTS_DIR / "stability.html", render_html(result, plots, info, eval_metrics))
    flat = stability_metrics(result)
    write_json(METRICS_DIR / "stability.json", flat)
    with tracking.mlflow_run("report", cfg.run.preset, run_id=run_info["run_id"],
                             tags={"stability.verdict": result["verdict"],
                                   "stability.failed": ",".join(result["failed"]) or "none"}):
        tracking.log_metrics({
            **{f"stability/{name}/pass": float(c["pass"]) for name, c in result["checks"].items()},
            **{f"stability/{name}/{k}": v for name, c in flat.items() if isinstance(c, dict)
               for k, v in c.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}})
        for name in ("stability.md", "stability.html"):
            tracking.log_artifact_file(REPORTS_DIR / name, "report")
        for path in plots.values():
            tracking.log_artifact_file(path, "report/plots")
        tracking.log_artifact_file(METRICS_DIR / "stability.json", "report")
    log.info("verdict: %s%s -> reports/stability.html", result["verdict"],
             f" (failed: {', '.join(result['failed'])})" if result["failed"] else "")
    return result


def main(argv: list[str] | None = None) -> int:
    return run_stage("report", __doc__, "run, train.out_dir, train.grad_*, train.spike_*, report", run, argv)


if __name__ == "__main__":
    sys.exit(main())
