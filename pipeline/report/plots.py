"""The report's PNGs: one figure per failure mode, drawn from the same numbers the checks use.

Figures are built with the object API on an Agg canvas (no pyplot, no global backend switch, no
display needed), so plotting is safe inside a stage, a test or a worker thread. A plot whose
column is missing is left out of the returned mapping rather than drawn empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from pipeline.core.atomic import atomic_path
from pipeline.report import checks

DPI = 100
FIGSIZE = (8.0, 3.5)  # 800x350 px: readable in a Markdown preview without scrolling sideways
ZONE_COLOURS = {"healthy": "#2ca02c", "warning": "#f2c400", "critical": "#ff7f0e", "exploded": "#d62728"}


def new_figure(width: float = FIGSIZE[0], height: float = FIGSIZE[1]):
    """(figure, axes) drawn off-screen (no pyplot: no global state, no display needed)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _figure(title: str, ylabel: str):
    fig, ax = new_figure()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _shade_warmup(ax, df: pd.DataFrame, warmup: int) -> None:
    if warmup > 0 and len(df) and df["step"].min() <= warmup:
        ax.axvspan(df["step"].min(), warmup, color="grey", alpha=0.15, lw=0, label="warm-up (excluded)")


def _mark_top(ax, xs: Sequence[float], label: str) -> None:
    """Red x at the top edge: x in data coordinates, y in axes coordinates (these rows have no
    finite value to place them at)."""
    if len(xs):
        ax.scatter(
            xs,
            np.full(len(xs), 0.97),
            marker="x",
            color="#d62728",
            s=30,
            zorder=5,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label=label,
        )


def plot_loss(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    if "train/loss" not in df.columns:
        return None
    fig, ax = _figure("Training loss", "loss (mean over each logged window)")
    scan = checks.spike_scan(df, p)
    # The raw column, NaN included: the line breaks at a non-finite row instead of bridging it.
    loss = df["train/loss"].where(np.isfinite(df["train/loss"].to_numpy()))
    ax.plot(df["step"], loss, lw=1, color="#1f77b4", label="train/loss")
    bad = {r["step"] for r in checks.nonfinite_steps(df, events)}
    if "train/skipped" in df.columns:
        bad |= set(df.loc[df["train/skipped"] > 0, "step"].astype(int))
    _mark_top(ax, sorted(bad), "skipped / non-finite")
    spikes = scan[scan["spike"]]
    if len(spikes):
        ax.scatter(
            spikes["step"],
            spikes["loss"],
            s=70,
            facecolors="none",
            edgecolors="#ff7f0e",
            linewidths=1.5,
            zorder=4,
            label="spike",
        )
    for s in sorted({e["step"] for e in events or () if e.get("kind") == "loss_spike"} - set(spikes["step"])):
        ax.axvline(s, color="#ff7f0e", ls=":", lw=1)
    _draw_regressions(ax, df, p)
    positive = scan["loss"][scan["loss"] > 0]
    # Log scale once the loss spans > 50x, else one spike flattens the whole curve.
    if len(positive) == len(scan) and len(scan) and positive.max() / positive.min() > 50:
        ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _draw_regressions(ax, df: pd.DataFrame, p: Mapping) -> None:
    """The loss_regression check's evidence, only when it found a regression: the smoothed loss it
    judged, and a band from each regression's start to its recovery (or the end of training)."""
    scan = checks.regression_scan(df, p)
    if isinstance(scan, str):
        return
    found = [r for r in checks.find_regressions(scan, p) if r["regression"]]
    if not found:
        return
    rows = int(scan["window_rows"].iloc[0])
    ax.plot(scan["step"], scan["smoothed"], lw=1.5, color="#6a3d9a", label=f"smoothed (median of {rows} rows)")
    end = float(scan["step"].iloc[-1])
    for i, r in enumerate(found):
        ax.axvspan(
            r["start_step"],
            r["recovery_step"] if r["recovered"] else end,
            color="#d62728",
            alpha=0.12,
            lw=0,
            label="loss regression" if i == 0 else None,
        )


def plot_grad_norm(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    if "grad/global_norm" not in df.columns:
        return None
    fig, ax = _figure("Gradient norm (pre-clipping)", "grad/global_norm")
    norms = df["grad/global_norm"].to_numpy()
    ok = np.isfinite(norms) & (norms > 0)  # log scale: zeros cannot be drawn
    lo = min(norms[ok].min() if ok.any() else p["grad_healthy_min"], p["grad_healthy_min"]) / 2
    hi = max(norms[ok].max() if ok.any() else p["grad_critical"], p["grad_critical"]) * 2
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    # 1-2-5 ticks with plain labels: the zone limits (5, 10) can be read off the axis.
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.axhspan(
        p["grad_healthy_min"], p["grad_warning"], color=ZONE_COLOURS["healthy"], alpha=0.12, lw=0, label="healthy"
    )
    ax.axhspan(p["grad_warning"], p["grad_critical"], color=ZONE_COLOURS["warning"], alpha=0.18, lw=0, label="warning")
    ax.axhspan(p["grad_critical"], hi, color=ZONE_COLOURS["critical"], alpha=0.18, lw=0, label="critical")
    # The exploded zone has no y value: a red band along the top edge holds the non-finite rows.
    band = Rectangle(
        (0, 0.94), 1, 0.06, transform=ax.transAxes, color=ZONE_COLOURS["exploded"], alpha=0.15, lw=0, label="exploded"
    )
    ax.add_patch(band)
    steps = df["step"].to_numpy()
    ax.plot(steps[ok], norms[ok], lw=1, color="#1f77b4", label="global norm")
    if "grad/clipped_norm" in df.columns:
        c = df["grad/clipped_norm"].to_numpy()
        cok = np.isfinite(c) & (c > 0)
        ax.plot(steps[cok], c[cok], lw=0.8, ls="--", color="#555555", label="after clipping")
    _mark_top(ax, steps[~np.isfinite(norms)], "exploded (non-finite)")
    ax.legend(loc="lower right", fontsize=7, ncol=3)
    return fig


def plot_memory(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    series = [(n, c) for n, c in checks.MEMORY_SERIES.items() if c in df.columns]
    drawn = []
    for _, col in series:
        d = df[["step", col]][np.isfinite(df[col].to_numpy())]
        if len(d) and np.ptp(d[col].to_numpy()) > 0:  # all-zero device memory on CPU says nothing
            drawn.append((col, d))
    if not drawn:
        return None
    fig, ax = _figure("Memory", "MB")
    fits = {col: checks.fit_memory(df, col, p) for col, _ in drawn}
    first_fitted = min((f["first_step"] for f in fits.values() if isinstance(f, dict)), default=None)
    if first_fitted is not None and first_fitted > df["step"].min():
        # Warm-up and the first half of the rest: the allocator is still settling (see fit_memory).
        ax.axvspan(df["step"].min(), first_fitted, color="grey", alpha=0.12, lw=0, label="not fitted")
    lo = min(float(d[col].min()) for col, d in drawn)
    hi = max(float(d[col].max()) for col, d in drawn)
    if hi - lo < 50:  # at least 50 MB tall, so +-5 MB of jitter does not look like a climb
        mid = (hi + lo) / 2
        ax.set_ylim(mid - 25, mid + 25)
    for col, d in drawn:
        (line,) = ax.plot(d["step"], d[col], lw=1, label=col)
        fit = fits[col]
        if isinstance(fit, dict):
            x = np.array([fit["first_step"], fit["last_step"]], dtype=float)
            y = fit["intercept"] + fit["slope_mb_per_1k_steps"] / 1000 * x
            label = f"fit {fit['slope_mb_per_1k_steps']:+.1f} MB/1k steps (p={fit['p_value']:.2g})"
            ax.plot(x, y, ls="--", lw=1.5, color=line.get_color(), label=label)
    if "mem/device_peak_mb" in df.columns and np.nanmax(np.abs(df["mem/device_peak_mb"].to_numpy()), initial=0) > 0:
        ax.plot(df["step"], df["mem/device_peak_mb"], lw=0.8, alpha=0.5, color="grey", label="mem/device_peak_mb")
    ax.legend(loc="best", fontsize=8)
    return fig


def _time_with_medians(ax, df: pd.DataFrame, p: Mapping, col: str, colours: tuple[str, str, str], unit: str) -> None:
    """col over the steps, with the early and steady medians the step-time check compares."""
    d = df[["step", col]][np.isfinite(df[col].to_numpy())]
    ax.plot(d["step"], d[col], lw=0.8, color=colours[0], label=col)
    split = checks.step_time_split(df, p, col)
    if isinstance(split, str):
        return
    for part, name, colour in ((split[0], "early", colours[1]), (split[1], "steady", colours[2])):
        med = part[col].median()
        ax.hlines(
            med,
            part["step"].iloc[0],
            part["step"].iloc[-1],
            colors=colour,
            lw=2,
            label=f"{name} median {med:.3g} {unit}",
        )
    # A first step many times the rest (compile, autotune) would flatten the steady state to a line: scale to
    # the post-warm-up rows the check uses.
    post = d.loc[d["step"] > p["warmup_steps"], col]
    ax.set_ylim(0, post.max() * 1.1)


def plot_step_time(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    if "perf/step_ms" not in df.columns:
        return None
    per_flow = checks.judged_time(df, p) == checks.FLOW_STEP_MS
    fig, ax = _figure(
        "Step time" + (" (judged per flow step, right axis)" if per_flow else ""), "ms per optimizer step"
    )
    _shade_warmup(ax, df, p["warmup_steps"])
    _time_with_medians(ax, df, p, "perf/step_ms", ("#1f77b4", "#2ca02c", "#d62728"), "ms")
    handles, labels = ax.get_legend_handles_labels()
    if per_flow:
        right = ax.twinx()
        right.set_ylabel("ms per flow step")
        _time_with_medians(right, df, p, checks.FLOW_STEP_MS, ("#9467bd", "#17becf", "#8c564b"), "ms per flow step")
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="best", fontsize=8)
    return fig


def plot_device(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    """The device_utilisation check's evidence: the GPU's busy share of each sampled step against
    the warn and fail lines, with the host syncs per step beside it. None without GPU figures."""
    busy = checks.DEVICE_BUSY
    if busy not in df.columns or not np.isfinite(df[busy].to_numpy()).any():
        return None
    synthetic = "perf/busy_synthetic" in df.columns and bool((df["perf/busy_synthetic"] == 1).any())
    title = "GPU busy share of the sampled steps" + (" (synthetic: fault=sync_bound, no GPU)" if synthetic else "")
    fig, ax = _figure(title, "share of the step's wall time")
    _shade_warmup(ax, df, p["warmup_steps"])
    d = df[["step", busy]][np.isfinite(df[busy].to_numpy())]
    ax.plot(d["step"], d[busy], lw=0.8, marker=".", color="#1f77b4", label=busy)
    ax.axhline(p["device_busy_warn"], color="#b26a00", ls="--", lw=1, label=f"warns below {p['device_busy_warn']:g}")
    ax.axhline(p["device_busy_fail"], color="#c62828", ls="--", lw=1, label=f"fails below {p['device_busy_fail']:g}")
    ax.set_ylim(0, 1.05)
    handles, labels = ax.get_legend_handles_labels()
    if "perf/host_syncs" in df.columns and np.isfinite(df["perf/host_syncs"].to_numpy()).any():
        right = ax.twinx()
        syncs = df[["step", "perf/host_syncs"]][np.isfinite(df["perf/host_syncs"].to_numpy())]
        right.plot(syncs["step"], syncs["perf/host_syncs"], lw=0.8, color="grey", label="perf/host_syncs")
        right.set_ylabel("host syncs per step")
        right.set_ylim(0, max(float(syncs["perf/host_syncs"].max()), 1.0) * 1.2)
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="best", fontsize=8)
    return fig


def plot_adaptive_steps(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    if "flow/steps_used" not in df.columns:
        return None
    fig, ax = _figure("Adaptive steps used per batch", "flow/steps_used")
    d = df[["step", "flow/steps_used"]][np.isfinite(df["flow/steps_used"].to_numpy())]
    ax.plot(d["step"], d["flow/steps_used"], lw=0.8, alpha=0.6, color="#1f77b4", label="flow/steps_used")
    if len(d) >= 20:  # a rolling median shows the trend through per-batch jitter
        trend = d["flow/steps_used"].rolling(20, min_periods=1).median()
        ax.plot(d["step"], trend, lw=1.5, color="#ff7f0e", label="rolling median (20 rows)")
    ax.legend(loc="best", fontsize=8)
    return fig


def plot_scaler(df: pd.DataFrame, events, p: Mapping) -> Figure | None:
    hist = checks.scaler_history(df, events)
    if hist.empty:
        return None  # no GradScaler: nothing to draw
    fig, ax = _figure("fp16 loss scale (GradScaler)", "scale (log2 axis)")
    ax.set_yscale("log", base=2)
    rows = hist[~hist["backoff"]]
    ax.step(hist["step"], hist["scale"], where="post", lw=1.2, color="#1f77b4", label="amp/scale")
    if len(rows):
        ax.plot(rows["step"], rows["scale"], ".", ms=3, color="#1f77b4")
    backoffs = hist[hist["backoff"]]
    if len(backoffs):
        ax.scatter(
            backoffs["step"],
            backoffs["scale"],
            marker="v",
            color="#d62728",
            s=30,
            zorder=5,
            label=f"overflow backoff ({len(backoffs)})",
        )
    ax.axhline(p["scaler_min_scale"], color="#d62728", ls=":", lw=1, label=f"collapse (< {p['scaler_min_scale']:g})")
    ax.legend(loc="best", fontsize=8)
    return fig


def plot_learning(eval_metrics: Mapping | None, p: Mapping) -> Figure | None:
    """Test (else val) group top-1, MRR and cosine of the trained model beside its baselines:
    bars with their 95 % CIs as whiskers, because the question is "which is higher, and is the
    gap more than the noise", not a trend."""
    if not eval_metrics:
        return None
    split = next((s for s in ("test", "val") if f"eval/{s}/model/cosine" in eval_metrics), None)
    if split is None:
        return None
    names = ("model", "identity", "ridge", "nearest")
    colours = ("#1f77b4", "#bcbd22", "#2ca02c", "#9467bd")
    metrics = [
        m for m in ("group_top1", "group_top5", "mrr", "cosine", "top1") if f"eval/{split}/model/{m}" in eval_metrics
    ]
    fig, ax = _figure(f"Learning: trained model vs baselines ({split} split, 95 % CIs)", "score (higher is better)")
    ax.set_xlabel("")
    width = 0.8 / len(names)

    def num(key: str) -> float | None:
        v = eval_metrics.get(key)
        return float(v) if isinstance(v, (int, float)) and np.isfinite(v) else None

    for i, (name, colour) in enumerate(zip(names, colours)):
        vals = [num(f"eval/{split}/{name}/{m}") for m in metrics]
        lows = [num(f"eval/{split}/{name}/{m}/ci95_low") for m in metrics]
        highs = [num(f"eval/{split}/{name}/{m}/ci95_high") for m in metrics]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(metrics))]
        ys = [v if v is not None else 0.0 for v in vals]
        err = [
            [max(0.0, y - lo) if lo is not None else 0.0 for y, lo in zip(ys, lows)],
            [max(0.0, hi - y) if hi is not None else 0.0 for y, hi in zip(ys, highs)],
        ]
        bars = ax.bar(
            xs, ys, width=width * 0.95, color=colour, label=name, yerr=err, capsize=2, error_kw={"elinewidth": 0.8}
        )
        for bar, v in zip(bars, vals):
            if v is not None:
                ax.annotate(
                    f"{v:.2f}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 4),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(metrics)), [m.replace("group_top", "group top-").replace("top1", "top-1") for m in metrics])
    finite = [v for m in metrics for n in names if (v := num(f"eval/{split}/{n}/{m}")) is not None]
    lower = min([0.0] + [v - 0.05 for v in finite if v < 0])
    ax.set_ylim(lower, 1.3)  # headroom: the legend sits above bars that reach 1.0
    ax.set_yticks(np.arange(np.floor(lower * 5) / 5, 1.01, 0.2))  # scores live in [-1, 1]: no tick above 1
    ax.grid(axis="x", alpha=0)
    ax.legend(loc="upper center", fontsize=8, ncol=4)
    return fig


PLOTS: dict[str, Callable] = {
    "loss": plot_loss,
    "grad_norm": plot_grad_norm,
    "memory": plot_memory,
    "step_time": plot_step_time,
    "device": plot_device,
    "adaptive_steps": plot_adaptive_steps,
    "scaler": plot_scaler,
}


def make_plots(steps: pd.DataFrame, events, params, out_dir, eval_metrics: Mapping | None = None) -> dict[str, Path]:
    """Write the PNGs whose data is present into out_dir; return {name: path}, e.g.
    {"loss": out_dir / "loss.png"}. Each file is written atomically; a PNG of a previous run
    whose data is absent now (scaler.png after an fp16 run) is removed, so the folder never shows
    another run's plot."""
    p = checks.resolve_params(params)
    df = checks.prepare_steps(steps)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures = {name: draw(df, events, p) for name, draw in PLOTS.items()}
    figures["learning"] = plot_learning(eval_metrics, p)
    for name, fig in figures.items():
        if fig is None:
            (out_dir / f"{name}.png").unlink(missing_ok=True)
            continue
        dest = out_dir / f"{name}.png"
        with atomic_path(dest) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)
        written[name] = dest
    return written
