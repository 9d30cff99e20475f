"""Build the stability report from a run's telemetry, and log it to the run's MLflow run.

Used by the report stage (after evaluate) and by the train stage when training diverges: a run
that blew up is the one that most needs a diagnosis, and it never reaches the report stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from pipeline.core.atomic import write_json, write_text
from pipeline.core.output_transaction import OutputTransaction
from pipeline.core.paths import METRICS_DIR, REPORTS_DIR
from pipeline.report.checks.metrics_file import stability_metrics
from pipeline.report.checks.params import run_params
from pipeline.report.checks.suite import headline_verdict, run_checks
from pipeline.report.plots import make_plots
from pipeline.report.render import render_html, render_markdown
from pipeline.tracking import store as tracking
from pipeline.tracking.run_note import update_note

STABILITY_JSON = METRICS_DIR / "stability.json"
REPORT_FILES = (REPORTS_DIR / "stability.md", REPORTS_DIR / "stability.html")
EVIDENCE_JSON = REPORTS_DIR / "stability_evidence.json"  # not a DVC output: holds time and memory


def build_report(
    cfg,
    run_id: str,
    steps: pd.DataFrame,
    events: Sequence[Mapping],
    train_metrics: Mapping,
    eval_metrics: Mapping | None,
    unmeasured: str = "",
    tx: OutputTransaction | None = None,
) -> dict:
    """Checks, plots, reports/stability.md and .html, metrics/stability.json (the DVC metrics:
    no time or memory figures) and reports/stability_evidence.json (every check's evidence, time
    and memory included), each written atomically. `unmeasured`: why there are no time and
    memory measurements of this run (pipeline/train/perf_files.py), said by the checks that need them.
    `tx`: the stage's output transaction, into which every file is written (put in place together
    when the stage succeeds). Returns the checks' result with "plots" ({name: path}) added: where
    each plot will be once in place."""
    at = tx.path if tx is not None else Path
    params = run_params(cfg, train_metrics, len(steps))
    result = run_checks(steps, events, params, eval_metrics, unmeasured=unmeasured)
    plot_dir = REPORTS_DIR / "plots"
    plots = make_plots(steps, events, params, at(plot_dir), eval_metrics)  # staged: only this run's plots
    info = {"run_id": run_id, "preset": cfg.run.preset, **train_metrics}
    write_text(at(REPORT_FILES[0]), render_markdown(result, plots, info, eval_metrics))
    write_text(at(REPORT_FILES[1]), render_html(result, plots, info, eval_metrics))
    write_json(at(STABILITY_JSON), stability_metrics(result))
    write_json(at(EVIDENCE_JSON), stability_metrics(result, measured=True))
    return {**result, "plots": {name: plot_dir / path.name for name, path in plots.items()}}


# The verdict as one sortable number: 0 stable, 1 stable with warnings, 2 unstable.
VERDICT_CODES = {"stable": 0, "warned": 1, "unstable": 2}


def summary_metrics(result: Mapping) -> dict[str, float]:
    """The handful of numbers a runs table needs to sort and filter models by stability; each
    check's evidence stays in reports/stability_evidence.json (an artifact beside the HTML)."""
    statuses = [c["status"] for c in result["checks"].values()]
    warned = statuses.count("warn")
    code = VERDICT_CODES["unstable" if result["verdict"] != "stable" else "warned" if warned else "stable"]
    return {
        "stability/verdict_code": float(code),
        "stability/failed_checks": float(statuses.count("fail")),
        "stability/warned_checks": float(warned),
        "stability/checks_run": float(sum(s in ("pass", "warn", "fail") for s in statuses)),
    }


def log_report(result: Mapping, tx: OutputTransaction | None = None) -> None:
    """Into the model's MLflow run: the verdict and the failed and warned checks as tags
    (filterable: tags.`stability.verdict` = 'unstable'), summary_metrics (sortable), the
    reports, plots and the evidence JSON as artifacts under report/ (read from `tx` while staged)."""
    if not tracking.enabled():
        return
    now = tx.now if tx is not None else Path
    warned = [n for n, c in result["checks"].items() if c["status"] == "warn"]
    tracking.set_tags(
        {
            # "stable" only with no warning (a stable run whose model trails a baseline is
            # "stable, with warnings" in the runs table, not a green "stable").
            "stability.verdict": headline_verdict(result),
            "stability.failed": ",".join(result["failed"]) or "none",
            "stability.warned": ",".join(warned) or "none",
            **strongest_tag(result),
        }
    )
    tracking.log_metrics(summary_metrics(result))
    for path in REPORT_FILES:
        tracking.log_artifact_file(now(path), "report")
    for path in result["plots"].values():
        tracking.log_artifact_file(now(path), "report/plots")
    tracking.log_artifact_file(now(STABILITY_JSON), "report")
    tracking.log_artifact_file(now(EVIDENCE_JSON), "report")
    update_note()


def strongest_tag(result: Mapping) -> dict[str, str]:
    """The learning check's word on the strongest baseline, as the tag learning.vs_strongest (the
    run's description shows it): `equivalent to mlp on group_top1: +0.004 [-0.007, +0.014]`."""
    e = (result["checks"].get("learning") or {}).get("evidence") or {}
    if "vs_strongest_standing" not in e:
        return {}
    words = {"ahead": "ahead of", "behind": "BEHIND", "equivalent": "equivalent to", "undecided": "undecided against"}
    seeds = "" if e.get("vs_strongest_covers_seeds") else ", training luck not covered on both sides"
    return {
        "learning.vs_strongest": (
            f"{words[e['vs_strongest_standing']]} {e['strongest_baseline']} on {e['headline']}: "
            f"{e['vs_strongest']:+.3f} [{e['vs_strongest_ci95_low']:+.3f}, {e['vs_strongest_ci95_high']:+.3f}]{seeds}"
        )
    }


def verdict_line(result: Mapping) -> str:
    failed = f" (failed: {', '.join(result['failed'])})" if result["failed"] else ""
    warned = [n for n, c in result["checks"].items() if c["status"] == "warn"]
    warnings = f" (warnings: {', '.join(warned)})" if warned and not result["failed"] else ""
    where = REPORT_FILES[1].relative_to(REPORTS_DIR.parent)
    return f"verdict: {headline_verdict(result)}{failed}{warnings} -> {where}"
