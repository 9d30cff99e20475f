"""Plots and rendering: PNGs are real PNGs written atomically; the Markdown and HTML say the verdict,
name every check, link or embed the plots, and the HTML reaches nothing outside itself."""

import re

import numpy as np
import pandas as pd
import pytest

from pipeline.report.checks import CHECK_ORDER, run_checks
from pipeline.report.layout import eval_table
from pipeline.report.plots import make_plots
from pipeline.report.render import render_html, render_markdown

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PARAMS = {"planned_steps": 2000}
EVENTS = [
    {"step": 150, "kind": "nan_grad", "module": "carrier.gru.0", "action": "skipped"},
    {"step": 220, "kind": "loss_spike", "module": None, "action": "flagged"},
]
RUN_INFO = {"run_id": "abc123", "preset": "fault_nan", "steps": 300, "note": "<script>alert(1)</script>"}
EVAL = {  # the evaluate stage's keys: eval/<split>/<predictor>/<metric>[/ci95_low|ci95_high]
    "eval/test/model/cosine": 0.81,
    "eval/test/model/cosine/ci95_low": 0.79,
    "eval/test/model/cosine/ci95_high": 0.83,
    "eval/test/model/mse": 0.0021,
    "eval/test/model/top1": 0.42,
    "eval/test/model/top5": 0.77,
    "eval/val/model/cosine": 0.80,
    "eval/test/ridge/cosine": 0.74,
    "eval/test/identity/cosine": 0.31,
    "eval/val/ridge/mse": 0.0030,
    "eval/test/model_vs_ridge/cosine": 0.07,
    "train/loss": 1.2,
}


def faulty_run(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """A run with a leak (+300 MB/1k steps), a NaN step, a loss spike and an inf grad norm."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1)
    norm = rng.uniform(0.5, 3, n)
    norm[step == 150] = np.inf
    loss = 2 + 3 * np.exp(-step / 60) + rng.normal(0, 0.05, n)
    loss[step == 150] = np.nan
    loss[step == 220] = 9.0
    return pd.DataFrame(
        {
            "step": step,
            "epoch": 0,
            "train/loss": loss,
            "train/skipped": (step == 150).astype(int),
            "grad/global_norm": norm,
            "grad/clipped_norm": np.minimum(norm, 1.0),
            "train/lr": 1e-3,
            "perf/step_ms": 20 + rng.normal(0, 1, n),
            "perf/samples_per_s": 1600.0,
            "flow/steps_used": rng.integers(5, 9, n),
            "mem/rss_mb": 1500 + 0.3 * step + rng.uniform(-5, 5, n),
            "mem/device_allocated_mb": 0.0,
            "mem/device_peak_mb": 0.0,
        }
    )


@pytest.fixture(scope="module")
def plots_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("report") / "plots"


@pytest.fixture(scope="module")
def report(plots_dir):
    """The faulty run's checks and plots, made once (the plots take seconds) and only read below."""
    df = faulty_run()
    result = run_checks(df, EVENTS, PARAMS)
    plots = make_plots(df, EVENTS, PARAMS, plots_dir)
    return result, plots


def test_plots_are_valid_pngs_written_atomically(report, plots_dir):
    _, plots = report
    assert set(plots) == {"loss", "grad_norm", "memory", "step_time", "adaptive_steps"}
    for name, path in plots.items():
        assert path == plots_dir / f"{name}.png"
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5_000
    assert sorted(p.name for p in plots_dir.iterdir()) == sorted(f"{n}.png" for n in plots)


def test_plots_skip_missing_columns(tmp_path):
    df = faulty_run().drop(columns=["flow/steps_used", "perf/step_ms", "mem/rss_mb"])
    plots = make_plots(df, [], {}, tmp_path)
    # Memory: RSS dropped and device is 0 throughout (CPU), so there is nothing to draw.
    assert set(plots) == {"loss", "grad_norm"}
    assert make_plots(pd.DataFrame({"step": [1, 2, 3]}), None, None, tmp_path / "empty") == {}


def test_markdown_has_verdict_checks_fixes_and_plot_links(report):
    result, plots = report
    assert result["verdict"] == "unstable" and "memory_growth" in result["failed"]
    md = render_markdown(result, plots, RUN_INFO, EVAL)
    assert md.startswith("# Stability report")
    assert "**Verdict: UNSTABLE** — failed: memory_growth" in md
    for name in CHECK_ORDER:
        assert f"## {name}: " in md and f"| {name} |" in md
    assert "**Fix:** Memory grows ~" in md
    assert "![memory_growth](plots/memory.png)" in md and "![loss_spikes](plots/loss.png)" in md
    # loss.png serves two sections: drawn under the first shown (the failed loss_spikes), pointed to after.
    assert "![nonfinite]" not in md and "(plot: see loss_spikes above)" in md
    assert "(plots/adaptive_steps.png)" in md
    assert "- **run_id**: abc123" in md
    assert "<script>" not in md and "&lt;script&gt;" in md
    # The failed check's section precedes the passing ones.
    assert md.index("## memory_growth") < md.index("## step_time_degradation")


def test_markdown_plot_prefix_and_stable_verdict(tmp_path):
    rng = np.random.default_rng(0)
    step = np.arange(1, 301)
    df = pd.DataFrame(
        {"step": step, "train/loss": 2 + rng.normal(0, 0.05, 300), "mem/rss_mb": 1500 + rng.uniform(-5, 5, 300)}
    )
    result = run_checks(df, [], {})
    plots = make_plots(df, [], {}, tmp_path)
    md = render_markdown(result, plots, {}, None, plots_rel="../figs/")
    assert "**Verdict: STABLE**" in md
    assert "](../figs/memory.png)" in md and "## Evaluation" not in md and "## Run" not in md


def test_eval_table_rows_metrics_columns_split_by_model():
    header, rows = eval_table(EVAL)
    assert header == ["metric", "test model", "test identity", "test ridge", "val model", "val ridge"]
    table = {r[0]: r[1:] for r in rows}
    assert list(table) == ["cosine", "mse", "top1", "top5"]  # differences are not a predictor's column
    assert table["cosine"] == ["0.81 [0.79, 0.83]", "0.31", "0.74", "0.8", "—"]
    assert table["mse"][-1] == "3.00e-03"
    nested = eval_table({"eval": {"test": {"model": {"cosine": 0.5}, "ridge": {"cosine": 0.4}}}})
    assert nested == (["metric", "test model", "test ridge"], [["cosine", "0.5", "0.4"]])


def test_markdown_evaluation_section(report):
    result, plots = report
    md = render_markdown(result, plots, RUN_INFO, EVAL)
    assert "## Evaluation" in md
    assert "| metric | test model | test identity | test ridge | val model | val ridge |" in md


def test_html_is_self_contained_and_escaped(report):
    result, plots = report
    page = render_html(result, plots, RUN_INFO, EVAL)
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    srcs = re.findall(r'src="([^"]*)"', page)
    # loss.png serves two sections (nonfinite, loss_spikes) but is embedded once: 5 plots, 5 images.
    assert len(srcs) == 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(href|src)="(https?:)?//', page) and "<link" not in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "Verdict: UNSTABLE" in page
    for name in CHECK_ORDER:
        assert name in page
    assert "<th>test ridge</th>" in page
