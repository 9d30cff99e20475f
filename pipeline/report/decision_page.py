"""The page of a `./dev decide` decision (tools/decide.py): the outcome first, then the looks, each
metric's interval, both arms' training loss with their seeds' spread, and the items that flipped.
HTML from a Jinja2 template (pipeline/report/templates/decision.html.j2), plots as PNGs embedded in it, so the page
is one self-contained file beside the stability report."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from jinja2 import Environment, FileSystemLoader, select_autoescape
from matplotlib.figure import Figure

from pipeline.report.plots import DPI, new_figure
from pipeline.stats.metrics import format_metric

TEMPLATES = Path(__file__).parent / "templates"
OUTCOME_COLOURS = {"better": "#2e7d32", "worse": "#c62828", "equivalent": "#1565c0", "inconclusive": "#b26a00"}
ARM_COLOURS = {"A": "#1f77b4", "B": "#d62728"}


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def curves_plot(curves: Mapping[str, Mapping[str, Mapping[str, list]]]) -> str | None:
    """Each arm's training loss: the mean over its seeds, and the band from its lowest to highest."""
    if not any(curves.get(k) for k in ("A", "B")):
        return None
    fig, ax = new_figure()
    for arm, per_seed in curves.items():
        if not per_seed:
            continue
        steps = sorted(set.intersection(*(set(c["step"]) for c in per_seed.values())))
        if not steps:
            continue
        rows = np.array([[dict(zip(c["step"], c["loss"]))[s] for s in steps] for c in per_seed.values()], dtype=float)
        colour = ARM_COLOURS.get(arm, "#555")
        ax.plot(steps, np.nanmean(rows, axis=0), color=colour, lw=1.5, label=f"{arm}: mean of {len(rows)} seed(s)")
        if len(rows) > 1:
            ax.fill_between(
                steps,
                np.nanmin(rows, axis=0),
                np.nanmax(rows, axis=0),
                color=colour,
                alpha=0.2,
                lw=0,
                label=f"{arm}: seeds' range",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("train/loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Training loss", fontsize=11)
    return _png(fig)


def looks_plot(result: Mapping[str, Any]) -> str | None:
    """The decided metric's interval after each seed pair, against 0 and the margin."""
    looks = result.get("looks") or []
    if not looks:
        return None
    fig, ax = new_figure(height=3.0)
    margin = float(result["margin"])
    x = [lk["rounds"] for lk in looks]
    mid = [lk["difference"] for lk in looks]
    low = [lk["difference"] - lk["ci_low"] for lk in looks]
    high = [lk["ci_high"] - lk["difference"] for lk in looks]
    ax.axhspan(-margin, margin, color="#1565c0", alpha=0.12, lw=0, label=f"+-margin ({margin:g})")
    ax.axhline(0, color="#444", lw=0.8)
    ax.errorbar(x, mid, yerr=[low, high], fmt="o", color="#222", capsize=4, label="B - A, each look's interval")
    ax.set_xticks(x)
    ax.set_xlabel("seed pairs")
    ax.set_ylabel(f"{result['metric']}: B - A")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{result['metric']} after each seed pair", fontsize=11)
    return _png(fig)


def metrics_plot(result: Mapping[str, Any]) -> str | None:
    """Every metric's difference and interval in units of its own margin, so that they share one
    axis: inside the band [-1, 1] is too small to matter; mse is turned so that right is better."""
    metrics = result.get("metrics") or {}
    if not metrics:
        return None
    fig, ax = new_figure(height=0.45 * len(metrics) + 1.0)
    names = list(metrics)
    for i, m in enumerate(names):
        d = metrics[m]
        sign = 1.0 if d["higher_is_better"] else -1.0
        scale = d["margin"] or 1.0
        lo, hi = sorted((sign * d["ci_low"] / scale, sign * d["ci_high"] / scale))
        mid = sign * d["difference"] / scale
        colour = OUTCOME_COLOURS.get(d["outcome"], "#555")
        ax.plot([lo, hi], [i, i], color=colour, lw=3 if m == result["metric"] else 1.8)
        ax.plot([mid], [i], "o", color=colour)
    ax.axvspan(-1, 1, color="#1565c0", alpha=0.12, lw=0)
    ax.axvline(0, color="#444", lw=0.8)
    # Linear within a few margins, logarithmic beyond: one metric hundreds of margins off (mse's
    # margin is tiny) must not squash the others to a point.
    ax.set_xscale("symlog", linthresh=2)
    ax.set_yticks(
        range(len(names)), [f"{m}{' (lower better)' if not metrics[m]['higher_is_better'] else ''}" for m in names]
    )
    ax.invert_yaxis()
    ax.set_xlabel("B - A in margins (right: B better; shaded: within the margin; log scale beyond 2)")
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def render_page(result: Mapping[str, Any]) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))

    plots = {
        "curves": curves_plot(result.get("curves") or {}),
        "looks": looks_plot(result),
        "metrics": metrics_plot(result),
    }
    return env.get_template("decision.html.j2").render(
        r=result, plots=plots, fmt=format_metric, colour=OUTCOME_COLOURS.get(result["outcome"], "#555")
    )
