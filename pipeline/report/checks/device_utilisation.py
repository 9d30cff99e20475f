"""device_utilisation: a GPU left idle (CUDA runs). The median share of a sampled step's wall time
it ran kernels, after warm-up; when it is low, the cause the telemetry shows (host syncs, short
kernels, data waits). A run without CUDA has no device figures: n/a."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import after_warmup
from pipeline.report.checks.wording import common
from pipeline.report.checks.wording import device_utilisation as say

DEVICE_BUSY = "perf/gpu_busy"
# A kernel shorter than this ends before the host has dispatched the next: eager PyTorch spends
# about this much host time on each op it launches, so a step made of such kernels keeps the GPU
# waiting on launches however many there are (launch-bound).
SHORT_KERNEL_US = 20.0
# Waiting for its batch more than this share of the step, the loader sets the pace, not the model
# (gathering a batch from the page cache costs a default run a tiny share of its step).
DATA_BOUND_FRACTION = 0.3
SYNC_BOUND, LAUNCH_BOUND, DATA_BOUND = "sync-bound", "launch-bound", "data-bound"
DEVICE_CAUSES = (SYNC_BOUND, LAUNCH_BOUND, DATA_BOUND)


def device_rows(df: pd.DataFrame, p: Mapping) -> pd.DataFrame:
    """Rows with a finite perf/gpu_busy after warm-up; every such row when none is after it (a
    run shorter than its warm-up is still judged, on what it has)."""
    d = df[np.isfinite(df[DEVICE_BUSY].to_numpy())]
    late = after_warmup(d, p["warmup_steps"])
    return late if len(late) else d


def median_of(d: pd.DataFrame, col: str) -> float:
    """Median of the finite values of d[col]; NaN when there are none or col is not logged."""
    if col not in d.columns:
        return float("nan")
    v = d[col].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else float("nan")


def device_figures(d: pd.DataFrame) -> dict[str, float]:
    """Per-step medians of the sampled-step figures over rows d (NaN where not measured)."""
    data_share = float("nan")
    if {"perf/data_ms", "perf/step_ms"} <= set(d.columns):
        step_ms = d["perf/step_ms"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(step_ms > 0, d["perf/data_ms"].to_numpy(dtype=float) / step_ms, np.nan)
        data_share = median_of(pd.DataFrame({"share": share}), "share")
    return {
        "busy_fraction": median_of(d, DEVICE_BUSY),
        "host_syncs_per_step": median_of(d, "perf/host_syncs"),
        "ops_per_step": median_of(d, "perf/ops"),
        "kernels_per_step": median_of(d, "perf/kernels"),
        "kernel_us": median_of(d, "perf/kernel_us"),
        "data_wait_fraction": data_share,
    }


def device_causes(fig: Mapping[str, float], p: Mapping) -> list[dict]:
    """The causes of an idle GPU the figures show, strongest first: {"name", "said", "fix"}.
    A cause's strength is how many times past its bar its figure is, so causes measured in
    different units can be ranked."""
    found: list[tuple[float, dict]] = []
    syncs, limit = fig["host_syncs_per_step"], p["device_max_syncs"]
    if math.isfinite(syncs) and syncs > limit:
        cause = {"name": SYNC_BOUND, "said": say.sync_bound(syncs, limit), "fix": say.SYNC_BOUND_FIX}
        found.append((syncs / max(limit, 1), cause))
    kernels, kernel_us = fig["kernels_per_step"], fig["kernel_us"]
    if math.isfinite(kernel_us) and kernel_us < SHORT_KERNEL_US:
        said = say.launch_bound(kernels, kernel_us, SHORT_KERNEL_US)
        cause = {"name": LAUNCH_BOUND, "said": said, "fix": say.LAUNCH_BOUND_FIX}
        found.append((SHORT_KERNEL_US / max(kernel_us, 1e-3), cause))
    share = fig["data_wait_fraction"]
    if math.isfinite(share) and share > DATA_BOUND_FRACTION:
        said = say.data_bound(share, DATA_BOUND_FRACTION)
        found.append((share / DATA_BOUND_FRACTION, {"name": DATA_BOUND, "said": said, "fix": say.DATA_BOUND_FIX}))
    return [c for _, c in sorted(found, key=lambda sc: -sc[0])]


def check_device_utilisation(df: pd.DataFrame, p: Mapping) -> CheckResult:
    if DEVICE_BUSY not in df.columns:
        return CheckResult("skip", common.not_logged(DEVICE_BUSY), {}, say.not_logged_fix(DEVICE_BUSY))
    if not np.isfinite(df[DEVICE_BUSY].to_numpy()).any():
        late = after_warmup(df, p["warmup_steps"])
        fig = device_figures(late if len(late) else df)
        counted = {k: fig[k] for k in ("host_syncs_per_step", "ops_per_step") if math.isfinite(fig[k])}
        numbers = say.numbers({**fig, "kernels_per_step": float("nan"), "data_wait_fraction": float("nan")})
        return CheckResult("n/a", say.no_gpu(DEVICE_BUSY, numbers), counted, None)
    d = device_rows(df, p)
    fig = device_figures(d)
    synthetic = "perf/busy_synthetic" in d.columns and bool((d["perf/busy_synthetic"] == 1).any())
    busy, warn, fail = fig["busy_fraction"], p["device_busy_warn"], p["device_busy_fail"]
    status = "fail" if busy < fail else "warn" if busy < warn else "pass"
    causes = device_causes(fig, p) if status != "pass" else []
    passed = status == "pass"
    evidence: dict[str, Any] = {k: v for k, v in fig.items() if math.isfinite(v)}
    evidence.update(
        warn_below_fraction=warn,
        fail_below_fraction=fail,
        causes=say.causes(causes, passed),
        synthetic=synthetic,
        rows=len(d),
    )
    # One flag per cause as well: the evidence file keeps numbers and flags, not text.
    named = {c["name"] for c in causes}
    evidence.update({cause.replace("-", "_"): cause in named for cause in DEVICE_CAUSES})
    summary = say.summary(evidence, passed, causes, say.numbers(fig))
    return CheckResult(status, summary, evidence, say.fix(passed, causes))
