"""Stability checks: one verdict per failure mode, the prototype's (docs/prototype.md) and others;
docs/checks.md describes each check, its thresholds and what to do when it fails.

Each check reads the train stage's telemetry (one row per logged optimizer step, plus an event
list) and returns {"status": pass|warn|fail|skip|n/a, "pass", "summary", "evidence", "fix"}. A check
whose columns are missing says "skip" and why; it never guesses and never crashes.

The failure modes, and the check that catches each:
- memory exhausted on batch 2 (graph kept alive across steps)  -> memory_growth
- step time collapsing after batch 1 (host syncs, empty_cache)  -> step_time_degradation
- a GPU left idle by host syncs, tiny kernels or data waits       -> device_utilisation (CUDA runs)
- NaN gradients in AddmmBackward0                                -> nonfinite
- grad_norm=inf from a GradScaler starting at 2**16              -> nonfinite, scaler
- gradient norms that sit in the critical zone                   -> grad_norm
- loss spikes                                                    -> loss_spikes
- a loss that climbs back above its best and stays there          -> loss_regression
- a GradScaler that starts too high and keeps overflowing        -> scaler (fp16 runs only)
- flows that die before arriving / adaptive stop doing nothing    -> convergence
- a run that "finishes" without learning anything, or worse than a
  baseline that needs no training                                 -> learning (needs eval metrics)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from pipeline.core.config import MIN_SPIKE_WINDOW, ReportConfig, TrainConfig
from pipeline.core.errors import ConfigError

# Defaults are the schema's (pipeline/core/config.py ReportConfig, whose comments say why each value),
# used only for keys the params mapping lacks; planned_steps comes from the train stage's metrics.
# The zone and spike thresholds are the train stage's (train.grad_*, train.spike_*): the trainer
# flags with them, and the report must judge by the same numbers.
TRAIN_KEYS = ("grad_warning", "grad_critical", "spike_k", "spike_window")
# step_cap and min_steps_to_arrive are the model's flow-step bounds, also from the train metrics.
DEFAULTS: dict[str, Any] = {
    **asdict(ReportConfig()),
    **{k: getattr(TrainConfig(), k) for k in TRAIN_KEYS},
    "planned_steps": None,
    "resumed_from_step": 0,
    "step_cap": None,
    "min_steps_to_arrive": None,
}
_INT_KEYS = {
    "warmup_steps",
    "device_max_syncs",
    "regression_min_steps",
    "spike_window",
    "planned_steps",
    "resumed_from_step",
    "step_cap",
    "min_steps_to_arrive",
}

CHECK_ORDER = (
    "memory_growth",
    "step_time_degradation",
    "device_utilisation",
    "nonfinite",
    "grad_norm",
    "loss_spikes",
    "loss_regression",
    "scaler",
    "convergence",
    "learning",
)
NONFINITE_KINDS = ("nan_loss", "inf_loss", "nan_grad", "inf_grad")
MEMORY_SERIES = {"rss": "mem/rss_mb", "device": "mem/device_allocated_mb"}
MEMORY_LABELS = {"rss": "host RSS", "device": "device allocated"}
_FIT_KEYS = ("slope_mb_per_1k_steps", "p_value", "r2", "start_mb", "end_mb", "projected_mb", "projected_growth_mb")
# "n/a": the check does not apply to this run (the scaler check on an fp32 run): unlike "skip",
# nothing is missing, so the verdict line does not mention it.
STATUSES = ("fail", "warn", "skip", "pass", "n/a")
_STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
_MIN_MEMORY_ROWS = 5  # a slope from fewer points is noise, whatever its p-value says
_MIN_TIME_ROWS = 10  # so the early 20 % holds at least 2 rows
_LIST_MAX = 20  # event/step lists in evidence: enough to see a pattern, short enough to read


# ---------------------------------------------------------------- params and telemetry


def resolve_params(params: Mapping | None) -> dict[str, Any]:
    """Read every key this module uses (params["key"], so a DictConfig works), fill defaults for
    missing ones and convert each to int or float. Ranges are not checked here: the config schema
    (pipeline/core/config.py) refuses an impossible value when the config is loaded, before any stage
    runs, so the report stage and a diverged run's report get values already checked."""
    out: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        try:
            value = params[key] if params is not None else None
        except (KeyError, AttributeError, TypeError):
            value = None
        if value is None:
            out[key] = default
            continue
        try:
            out[key] = int(value) if key in _INT_KEYS else float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"report param {key}={value!r}: expected a number") from None
    return out


def prepare_steps(steps: pd.DataFrame | None) -> pd.DataFrame:
    """Numeric copy sorted by step; rows without a step dropped. Only `step` is required."""
    if steps is None:
        return pd.DataFrame({"step": pd.Series(dtype="float64")})
    if "step" not in steps.columns:
        raise ValueError(f"telemetry has no 'step' column (columns: {list(steps.columns)})")
    df = steps.apply(pd.to_numeric, errors="coerce").astype("float64")
    df = df.dropna(subset=["step"]).sort_values("step", kind="stable")
    return df.reset_index(drop=True)


def after_warmup(df: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    return df[df["step"] > warmup_steps]


def _finite(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """Rows of (step, col) where col is finite."""
    d = df[["step", col]]
    return d[np.isfinite(d[col].to_numpy())]


def _result(status: str, summary: str, evidence: dict, fix: str | None) -> dict:
    if status not in STATUSES:
        raise ValueError(f"check status {status!r}: expected one of {STATUSES}")
    return {
        "status": status,
        "pass": status != "fail",
        "summary": summary,
        "evidence": {k: _py(v) for k, v in evidence.items()},
        "fix": None if status == "pass" else fix,
    }


def _py(v: Any) -> Any:
    """numpy scalars -> Python scalars, so evidence serialises as JSON as it is."""
    return v.item() if isinstance(v, np.generic) else v


def _steps_text(steps: Sequence[int]) -> str:
    shown = ", ".join(str(int(s)) for s in steps[:_LIST_MAX])
    return shown + (f", ... ({len(steps) - _LIST_MAX} more)" if len(steps) > _LIST_MAX else "")


# ---------------------------------------------------------------- memory_growth


def fit_memory(df: pd.DataFrame, col: str, p: Mapping) -> dict | str:
    """OLS of memory (MB) on step after warm-up; a dict of the fit, or why there is none.

    A resumed run's rows before the resume come from the killed process, whose memory is not
    this one's (a resumed default run's fresh process starts lower than the killed one ended), so only the
    last process's rows, after its own warm-up, are fitted."""
    d = _finite(after_warmup(df, p["resumed_from_step"] + p["warmup_steps"]), col)
    if d["step"].nunique() < _MIN_MEMORY_ROWS:
        return f"{len(d)} rows after warm-up (need {_MIN_MEMORY_ROWS})"
    if len(d) >= 2 * _MIN_MEMORY_ROWS:
        # Fit the second half only: the allocator's heap keeps growing for a while before it
        # plateaus (a clean default run's RSS climbs over its first part, then stays flat), which
        # a whole-run fit calls a steep, significant leak. A leak that keeps a
        # graph per step keeps climbing in the second half too.
        d = d.iloc[len(d) // 2 :]
    mb = d[col].to_numpy()
    if np.ptp(mb) == 0:  # device memory is 0 throughout on CPU
        return f"constant at {mb[0]:.1f} MB"
    fit = stats.linregress(d["step"].to_numpy(), mb)
    out = {
        "slope_mb_per_1k_steps": fit.slope * 1000,
        "p_value": fit.pvalue,
        "r2": fit.rvalue**2,
        "start_mb": mb[0],
        "end_mb": mb[-1],
        "intercept": fit.intercept,
        "first_step": int(d["step"].iloc[0]),
        "last_step": int(d["step"].iloc[-1]),
    }
    if p["planned_steps"]:
        out["projected_mb"] = fit.intercept + fit.slope * p["planned_steps"]
    end_step = max(p["planned_steps"] or 0, out["last_step"])
    out["projected_growth_mb"] = fit.slope * (end_step - out["first_step"])
    return out


def _grows(fit: dict, p: Mapping) -> bool:
    # All three: significant (not noise), steep enough to matter (20 MB/1k = 1 GB per 50k steps),
    # and a growth over the planned run that costs something.
    return (
        fit["p_value"] < p["memory_alpha"]
        and fit["slope_mb_per_1k_steps"] > p["memory_min_mb_per_1k"]
        and fit["projected_growth_mb"] > p["memory_min_growth_mb"]
    )


def check_memory_growth(df: pd.DataFrame, p: Mapping) -> dict:
    fits: dict[str, dict] = {}
    not_tested: list[str] = []
    for name, col in MEMORY_SERIES.items():
        fit = fit_memory(df, col, p) if col in df.columns else "not logged"
        if isinstance(fit, str):
            not_tested.append(f"{col}: {fit}")
        else:
            fits[name] = fit
    if not fits:
        return _result(
            "skip",
            f"No memory series to test ({'; '.join(not_tested)}).",
            {"not_tested": "; ".join(not_tested)},
            "Log mem/rss_mb (and mem/device_allocated_mb on GPU) for at least warmup_steps + "
            f"{_MIN_MEMORY_ROWS} logged steps to enable this check.",
        )
    failing = [n for n, f in fits.items() if _grows(f, p)]
    # The series that drives the verdict gets the unprefixed keys; the other one is prefixed.
    worst = max(failing or fits, key=lambda n: fits[n]["slope_mb_per_1k_steps"])
    evidence: dict[str, Any] = {"series": worst, **{k: fits[worst][k] for k in _FIT_KEYS if k in fits[worst]}}
    for name, fit in fits.items():
        if name != worst:
            evidence.update({f"{name}_{k}": fit[k] for k in _FIT_KEYS if k in fit})
    evidence["first_step"], evidence["last_step"] = fits[worst]["first_step"], fits[worst]["last_step"]
    peak = df["mem/device_peak_mb"].to_numpy() if "mem/device_peak_mb" in df.columns else np.array([])
    if np.isfinite(peak).any() and np.nanmax(peak) > 0:  # 0 throughout on CPU: says nothing
        evidence["device_peak_max_mb"] = float(np.nanmax(peak))
    if not_tested:
        evidence["not_tested"] = "; ".join(not_tested)

    parts = [
        f"{MEMORY_LABELS[n]} {f['slope_mb_per_1k_steps']:+.1f} MB per 1k steps (p={f['p_value']:.2g}, R²={f['r2']:.2f})"
        for n, f in fits.items()
    ]
    span = f"over steps {fits[worst]['first_step']}-{fits[worst]['last_step']}"
    w = fits[worst]
    if failing:
        proj = f", projected {w['projected_mb']:,.0f} MB at step {p['planned_steps']:,}" if "projected_mb" in w else ""
        summary = f"Memory grows: {'; '.join(parts)} {span}{proj}."
        status = "fail"
    else:
        summary = (
            f"Memory flat: {'; '.join(parts)} {span} "
            f"(fails only when p < {p['memory_alpha']:g}, slope > {p['memory_min_mb_per_1k']:g} MB per 1k "
            f"and growth over the run > {p['memory_min_growth_mb']:g} MB)."
        )
        status = "pass"
    fix = (
        f"Memory grows ~{w['slope_mb_per_1k_steps']:.0f} MB per 1k steps: something keeps the autograd "
        "graph alive across steps — detach values you keep (loss.detach(), .item() only at log "
        "boundaries), don't store step tensors on modules or in history lists, never use "
        "retain_graph=True."
    )
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- step_time_degradation

FLOW_STEP_MS = "perf/flow_step_ms"  # a window's step time over its mean flow steps per training step


def step_time_split(df: pd.DataFrame, p: Mapping, col: str = "perf/step_ms") -> tuple[pd.DataFrame, pd.DataFrame] | str:
    """(early, steady) rows of `col` after warm-up: first 20 % and last 50 %, or why not."""
    d = _finite(after_warmup(df, p["warmup_steps"]), col)
    d = d[d[col] > 0]
    n = len(d)
    if n < _MIN_TIME_ROWS:
        return f"{n} timed rows after warm-up (need {_MIN_TIME_ROWS})"
    return d.iloc[: math.ceil(0.2 * n)], d.iloc[n - math.ceil(0.5 * n) :]


def judged_time(df: pd.DataFrame, p: Mapping) -> str:
    """The time the step-time check judges: perf/flow_step_ms where enough rows after warm-up have
    it, else perf/step_ms (telemetry from before the time per flow step was logged)."""
    per_flow = FLOW_STEP_MS in df.columns and not isinstance(step_time_split(df, p, FLOW_STEP_MS), str)
    return FLOW_STEP_MS if per_flow else "perf/step_ms"


def _median_at(df: pd.DataFrame, col: str, steps: pd.Series) -> float:
    """Median of df[col] over the rows of `steps` (NaN when col is not logged)."""
    if col not in df.columns:
        return float("nan")
    series = pd.to_numeric(df.set_index("step")[col], errors="coerce")
    series = series[~series.index.duplicated(keep="last")]
    return float(series.reindex(steps).median())


def check_step_time(df: pd.DataFrame, p: Mapping) -> dict:
    fix = (
        "Step time grows: look for per-step host syncs (.item()/.cpu()/printing a tensor every step "
        "— accumulate on device, sync every log_every steps), torch.cuda.empty_cache() in the loop "
        "(measured 15-20 % slower in the prototype, docs/prototype.md), "
        "a logging cadence whose cost grows with history, "
        "and data loading (compare data-wait time; use workers, pin_memory, prefetch)."
    )
    if "perf/step_ms" not in df.columns:
        return _result("skip", "perf/step_ms not logged.", {}, "Log perf/step_ms to enable this check.")
    # The adaptive flow loop takes more flow steps per batch as training changes the model (after
    # fault=lr_spike's x100 updates the smoke model went from 3 to 5 flow steps and its step time
    # rose 1.72x), and each flow step costs time: a slower training step can be more work with
    # nothing wrong in the loop. So the time per flow step is judged where the trainer logs it;
    # telemetry without it (older runs) is judged per training step, as before.
    col = judged_time(df, p)
    per_flow = col == FLOW_STEP_MS
    split = step_time_split(df, p, col)
    if isinstance(split, str):
        return _result(
            "skip",
            f"Too little timing data: {split}.",
            {"reason": split},
            f"Run more than warmup_steps + {_MIN_TIME_ROWS} logged steps to enable this check.",
        )
    early, steady = split
    early_ms = _median_at(df, "perf/step_ms", early["step"])
    steady_ms = _median_at(df, "perf/step_ms", steady["step"])
    step_ratio = steady_ms / early_ms
    early_judged, steady_judged = float(early[col].median()), float(steady[col].median())
    ratio = steady_judged / early_judged
    timed = _finite(after_warmup(df, p["warmup_steps"]), col)
    rho, rho_p = stats.spearmanr(timed["step"], timed[col]) if len(timed) > 2 else (np.nan, np.nan)
    evidence: dict[str, Any] = {
        "judged": "time per flow step" if per_flow else "time per training step",
        "early_median_ms": early_ms,
        "steady_median_ms": steady_ms,
    }
    if per_flow:
        evidence.update(
            early_flow_step_ms=early_judged,
            steady_flow_step_ms=steady_judged,
            step_ratio=step_ratio,  # context: what the ratio per training step would have said
        )
    evidence.update(
        {
            "ratio": ratio,
            "max_ratio": p["step_time_max_ratio"],
            "spearman_rho": float(rho),
            "spearman_p": float(rho_p),
            "early_steps": f"{int(early['step'].iloc[0])}-{int(early['step'].iloc[-1])}",
            "steady_steps": f"{int(steady['step'].iloc[0])}-{int(steady['step'].iloc[-1])}",
        }
    )
    if "perf/samples_per_s" in df.columns:  # throughput: the same slices, the number people quote
        evidence["early_samples_per_s"] = _median_at(df, "perf/samples_per_s", early["step"])
        evidence["steady_samples_per_s"] = _median_at(df, "perf/samples_per_s", steady["step"])
    flow_ratio = _flow_steps_ratio(df, early, steady)
    if flow_ratio is not None:
        evidence["flow_steps_ratio"] = flow_ratio
    status = "fail" if ratio > p["step_time_max_ratio"] else "pass"
    trend = f"Spearman rho={rho:.2f} (p={rho_p:.2g})"
    if per_flow:
        more = f", with {flow_ratio:.2f}x the flow steps per training step" if flow_ratio is not None else ""
        summary = (
            f"Steady-state median time per flow step {steady_judged:.3g} ms is {ratio:.2f}x the early median "
            f"{early_judged:.3g} ms (limit {p['step_time_max_ratio']:g}x); per training step {steady_ms:.1f} ms is "
            f"{step_ratio:.2f}x the early {early_ms:.1f} ms{more}; {trend}."
        )
        # The other way round: a step's work that does not scale with its flow steps (optimizer,
        # data, the layers around the lattice) spread over fewer flow steps raises the time per
        # flow step with nothing slower. When the step itself is within the limit, a warning.
        if status == "fail" and step_ratio <= p["step_time_max_ratio"]:
            status = "warn"
            summary += (
                " The time per training step stayed within the limit: fewer flow steps per batch, over which "
                "the step's fixed work is spread, can account for it."
            )
            fix = (
                "Time per flow step rose, the step itself did not slow past the limit: see the convergence "
                "check (fewer flow steps per batch). If the step is slower than it should be, look for per-step "
                "host syncs, empty_cache() calls and data waits."
            )
        return _result(status, summary, evidence, fix)
    summary = (
        f"Steady-state median step time {steady_ms:.1f} ms is {ratio:.2f}x the early median "
        f"{early_ms:.1f} ms (limit {p['step_time_max_ratio']:g}x); {trend}."
    )
    # Without the time per flow step, a rise the flow steps account for is a warning that says so,
    # not a failure.
    if status == "fail" and flow_ratio is not None and ratio <= p["step_time_max_ratio"] * flow_ratio:
        status = "warn"
        summary += (
            f" The model takes {flow_ratio:.2f}x the flow steps per training step it took early "
            "(flow/steps_used), which accounts for it: more work per step, not a slower loop."
        )
        fix = (
            "More flow steps per step: see the convergence check (flows that arrive later, or not at "
            "all, after a bad update or a too-high learning rate)."
        )
    return _result(status, summary, evidence, fix)


def _flow_steps_ratio(df: pd.DataFrame, early: pd.DataFrame, steady: pd.DataFrame) -> float | None:
    """Median flow steps per training step over the steady rows, over the early rows' (the
    split's steps, read from df); None when not logged."""
    a = _median_at(df, "flow/steps_used", early["step"])
    b = _median_at(df, "flow/steps_used", steady["step"])
    return float(b / a) if np.isfinite(a) and np.isfinite(b) and a > 0 else None


# ---------------------------------------------------------------- device_utilisation

DEVICE_BUSY = "perf/gpu_busy"
# A kernel shorter than this ends before the host has dispatched the next: eager PyTorch spends
# some 10-20 µs of host time on each op it launches, so a step made of such kernels keeps the GPU
# waiting on launches however many there are (launch-bound).
SHORT_KERNEL_US = 20.0
# Waiting for its batch more than this share of the step, the loader sets the pace, not the model
# (gathering a batch from the page cache costs a default run about 0.2 % of its step).
DATA_BOUND_FRACTION = 0.3
SYNC_BOUND, LAUNCH_BOUND, DATA_BOUND = "sync-bound", "launch-bound", "data-bound"
DEVICE_CAUSES = (SYNC_BOUND, LAUNCH_BOUND, DATA_BOUND)


def device_rows(df: pd.DataFrame, p: Mapping) -> pd.DataFrame:
    """Rows with a finite perf/gpu_busy after warm-up; every such row when none is after it (a
    run shorter than its warm-up is still judged, on what it has)."""
    d = df[np.isfinite(df[DEVICE_BUSY].to_numpy())]
    late = after_warmup(d, p["warmup_steps"])
    return late if len(late) else d


def _median_of(d: pd.DataFrame, col: str) -> float:
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
        data_share = _median_of(pd.DataFrame({"share": share}), "share")
    return {
        "busy_fraction": _median_of(d, DEVICE_BUSY),
        "host_syncs_per_step": _median_of(d, "perf/host_syncs"),
        "ops_per_step": _median_of(d, "perf/ops"),
        "kernels_per_step": _median_of(d, "perf/kernels"),
        "kernel_us": _median_of(d, "perf/kernel_us"),
        "data_wait_fraction": data_share,
    }


def device_causes(fig: Mapping[str, float], p: Mapping) -> list[dict]:
    """The causes of an idle GPU the figures show, strongest first: {"name", "said", "fix"}.
    A cause's strength is how many times past its bar its figure is, so causes measured in
    different units can be ranked."""
    found: list[tuple[float, dict]] = []
    syncs, limit = fig["host_syncs_per_step"], p["device_max_syncs"]
    if math.isfinite(syncs) and syncs > limit:
        said = f"{syncs:.0f} host syncs per step (more than report.device_max_syncs = {limit})"
        fix = (
            "Sync-bound: every host read (.item(), .tolist(), bool(tensor), nonzero, a boolean-mask "
            "index) makes the host wait for the GPU. Keep values on the device and read them once per "
            "step, as the training loop's one read does; the masked flow loop (train.flow_loop=masked, "
            "the default on CUDA) makes no read per flow step."
        )
        found.append((syncs / max(limit, 1), {"name": SYNC_BOUND, "said": said, "fix": fix}))
    kernels, kernel_us = fig["kernels_per_step"], fig["kernel_us"]
    if math.isfinite(kernel_us) and kernel_us < SHORT_KERNEL_US:
        said = (
            f"{kernels:,.0f} kernels of {kernel_us:.1f} µs per step (shorter than the "
            f"~{SHORT_KERNEL_US:g} µs a launch costs the host)"
        )
        fix = (
            "Launch-bound: many short kernels. Capture the flow loop as a CUDA graph (train.cuda_graph=always "
            "says why when it cannot; it needs the masked flow loop, train.flow_loop=masked, and one process), "
            "or raise train.batch_size so each kernel does more work."
        )
        found.append((SHORT_KERNEL_US / max(kernel_us, 1e-3), {"name": LAUNCH_BOUND, "said": said, "fix": fix}))
    share = fig["data_wait_fraction"]
    if math.isfinite(share) and share > DATA_BOUND_FRACTION:
        said = (
            f"{100 * share:.0f} % of the step waiting for data (perf/data_ms / perf/step_ms, more than "
            f"{100 * DATA_BOUND_FRACTION:.0f} %)"
        )
        fix = (
            "Data-bound: gather batches ahead on a background thread (train.prefetch=2 or more), pinned "
            "in memory on CUDA so the copy to the GPU does not wait on the host."
        )
        found.append((share / DATA_BOUND_FRACTION, {"name": DATA_BOUND, "said": said, "fix": fix}))
    return [c for _, c in sorted(found, key=lambda sc: -sc[0])]


def _device_numbers(fig: Mapping[str, float]) -> str:
    """The figures measured, in words: '42 host syncs, 1,200 kernels of 5.0 µs per step, ...'."""
    parts = []
    if math.isfinite(fig["host_syncs_per_step"]):
        syncs = fig["host_syncs_per_step"]
        parts.append(f"{syncs:.0f} host sync{'' if syncs == 1 else 's'}")
    if math.isfinite(fig["kernels_per_step"]):
        of = f" of {fig['kernel_us']:.1f} µs" if math.isfinite(fig["kernel_us"]) else ""
        parts.append(f"{fig['kernels_per_step']:,.0f} kernels{of}")
    elif math.isfinite(fig["ops_per_step"]):
        parts.append(f"{fig['ops_per_step']:,.0f} ops")
    text = ", ".join(parts) + " per step" if parts else ""
    if math.isfinite(fig["data_wait_fraction"]):
        text += (", " if text else "") + f"{100 * fig['data_wait_fraction']:.0f} % of the step waiting for data"
    return text


SYNTHETIC_SAID = (
    "These are synthetic device figures from fault=sync_bound on a machine without a GPU "
    "(perf/busy_synthetic = 1): the host syncs and ops are counted, the busy share and kernels are not measured."
)


def check_device_utilisation(df: pd.DataFrame, p: Mapping) -> dict:
    """Was the GPU kept busy? The median share of a sampled step's wall time it ran kernels,
    after warm-up; when it is low, the cause the telemetry shows (host syncs, short kernels,
    data waits) with its fix. A run without CUDA has no device figures: n/a."""
    if DEVICE_BUSY not in df.columns:
        return _result(
            "skip",
            f"{DEVICE_BUSY} not logged.",
            {},
            f"Log {DEVICE_BUSY} (the trainer's sampled-step profile, NaN off CUDA) to enable this check.",
        )
    if not np.isfinite(df[DEVICE_BUSY].to_numpy()).any():
        late = after_warmup(df, p["warmup_steps"])
        fig = device_figures(late if len(late) else df)
        counted = {k: fig[k] for k in ("host_syncs_per_step", "ops_per_step") if math.isfinite(fig[k])}
        numbers = _device_numbers({**fig, "kernels_per_step": float("nan"), "data_wait_fraction": float("nan")})
        return _result(
            "n/a",
            f"No GPU figures: {DEVICE_BUSY} is NaN on every row (a run without CUDA), so there is nothing to judge"
            + (f"; {numbers}" if numbers else "")
            + ".",
            counted,
            None,
        )
    d = device_rows(df, p)
    fig = device_figures(d)
    synthetic = "perf/busy_synthetic" in d.columns and bool((d["perf/busy_synthetic"] == 1).any())
    busy, warn, fail = fig["busy_fraction"], p["device_busy_warn"], p["device_busy_fail"]
    status = "fail" if busy < fail else "warn" if busy < warn else "pass"
    causes = device_causes(fig, p) if status != "pass" else []
    evidence: dict[str, Any] = {k: v for k, v in fig.items() if math.isfinite(v)}
    evidence.update(
        warn_below_fraction=warn,
        fail_below_fraction=fail,
        causes=", ".join(c["name"] for c in causes) or ("not identified" if status != "pass" else "none judged"),
        synthetic=synthetic,
        rows=len(d),
    )
    # One flag per cause as well: the evidence file keeps numbers and flags, not text.
    named = {c["name"] for c in causes}
    evidence.update({cause.replace("-", "_"): cause in named for cause in DEVICE_CAUSES})
    summary = (
        f"The GPU ran kernels {100 * busy:.0f} % of the sampled steps' wall time (median of {len(d)} rows; "
        f"warns below {100 * warn:.0f} %, fails below {100 * fail:.0f} %)"
    )
    numbers = _device_numbers(fig)
    if status == "pass":
        summary += (f"; {numbers}" if numbers else "") + "."
        fix = None
    elif causes:
        summary += ": " + "; ".join(f"{c['name']}, {c['said']}" for c in causes) + "."
        fix = " ".join(c["fix"] for c in causes)
    else:
        summary += f": cause not identified ({numbers or 'no sampled-step counts logged'})."
        fix = (
            "The GPU idles, but neither host syncs, short kernels nor data waits account for it: profile a "
            "step (torch.profiler) and look at the gaps between kernels."
        )
    if synthetic:
        summary += " " + SYNTHETIC_SAID
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- nonfinite


def nonfinite_steps(df: pd.DataFrame, events: Sequence[Mapping] | None) -> list[dict]:
    """Non-finite steps, one record per step: the events, plus rows whose loss is non-finite but
    have no event (a train stage that logs the NaN but not the event is still caught)."""
    records: dict[int, dict] = {}
    for e in events or ():
        if e.get("kind") in NONFINITE_KINDS and e.get("step") is not None:
            records.setdefault(
                int(e["step"]),
                {
                    "step": int(e["step"]),
                    "kind": e["kind"],
                    "module": e.get("module"),
                    "action": e.get("action") or "-",
                },
            )
    if "train/loss" in df.columns:
        loss = df["train/loss"].to_numpy()
        for step, value in zip(df["step"].to_numpy()[~np.isfinite(loss)], loss[~np.isfinite(loss)]):
            kind = "nan_loss" if np.isnan(value) else "inf_loss"
            records.setdefault(int(step), {"step": int(step), "kind": kind, "module": None, "action": "logged"})
    return [records[s] for s in sorted(records)]


def _finite_after(df: pd.DataFrame, step: float) -> bool | None:
    """Did the run produce a finite loss (else, a finite grad norm) after `step`? None: unknown."""
    for col in ("train/loss", "grad/global_norm"):
        if col in df.columns:
            later = df.loc[df["step"] > step, col].to_numpy()
            return bool(np.isfinite(later).any())
    return None


def check_nonfinite(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> dict:
    if events is None and "train/loss" not in df.columns:
        return _result(
            "skip",
            "No event list and no train/loss column.",
            {},
            "Pass the train stage's events and log train/loss to enable this check.",
        )
    recs = nonfinite_steps(df, events)
    skipped_total = int(np.nansum(df["train/skipped"].to_numpy())) if "train/skipped" in df.columns else 0
    # Non-finite gradients the rows saw: the trainer's per-step count, else rows whose norm is
    # inf/NaN (this check, not grad_norm, judges them).
    if "grad/nonfinite_steps" in df.columns:
        bad_grad = df["grad/nonfinite_steps"].to_numpy() > 0
        exploded_total = int(np.nansum(df["grad/nonfinite_steps"].to_numpy()))
    elif "grad/global_norm" in df.columns:
        bad_grad = ~np.isfinite(df["grad/global_norm"].to_numpy())
        exploded_total = int(bad_grad.sum())
    else:
        bad_grad, exploded_total = np.zeros(len(df), dtype=bool), 0
    # Rows every k steps: train/skipped counts skips between rows, so it can exceed the events seen.
    count = max(len(recs), skipped_total, exploded_total)
    skip_rows = df.loc[df["train/skipped"] > 0, "step"].tolist() if "train/skipped" in df.columns else []
    known = [r["step"] for r in recs] + [int(s) for s in skip_rows] + [int(s) for s in df["step"].to_numpy()[bad_grad]]
    last_step = int(df["step"].max()) if len(df) else 0
    total = max([last_step, *known]) if known or last_step else 0
    if count == 0:
        return _result(
            "pass", f"No non-finite loss or gradient in {total:,} steps.", {"count": 0, "total_steps": total}, None
        )
    fraction = count / total if total else 1.0
    recovered = _finite_after(df, max(known)) if known else None
    modules = [r["module"] for r in recs if r["module"]]
    evidence: dict[str, Any] = {
        "count": count,
        "events": len(recs),
        "total_steps": total,
        "fraction": fraction,
        "recovered": "unknown" if recovered is None else recovered,
        "first_step": min(known),
        "last_step": max(known),
        "first_module": modules[0] if modules else "unknown",
        "kinds": ", ".join(f"{k}: {n}" for k, n in Counter(r["kind"] for r in recs).most_common()),
        "skipped_total": skipped_total,
        "event_list": "; ".join(
            f"step {r['step']} {r['kind']} in {r['module'] or '?'} ({r['action']})" for r in recs[:_LIST_MAX]
        )
        + (f"; ... ({len(recs) - _LIST_MAX} more)" if len(recs) > _LIST_MAX else ""),
    }
    rare = fraction <= p["nonfinite_warn_fraction"]
    status = "warn" if rare and recovered is True else "fail"
    where = f" in {modules[0]}" if modules else ""
    outcome = {True: "training recovered", False: "training did not recover", None: "recovery unknown"}[recovered]
    summary = (
        f"{count} non-finite step(s) ({100 * fraction:.2f} % of {total:,}, limit "
        f"{100 * p['nonfinite_warn_fraction']:g} %); first at step {min(known)}{where}; {outcome}."
    )
    fix = (
        "Lower the LR (or lengthen warm-up), clip gradients at 1.0 after scaler.unscale_, check the "
        "inputs for NaN/inf, and with fp16 use GradScaler(init_scale=2**10, growth_factor=1.5, "
        "growth_interval=200) instead of 2**16, 2.0, 100 — or train in bf16, which needs no scaler"
        + (f"; start with {modules[0]}, the first module with a non-finite gradient." if modules else ".")
    )
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- grad_norm


def grad_zones(norms: np.ndarray, p: Mapping) -> dict[str, np.ndarray]:
    """Boolean mask per zone; exactly one zone per row. NaN/inf is 'exploded'."""
    fin = np.isfinite(norms)
    v = np.where(fin, norms, 0.0)
    low = fin & (v < p["grad_healthy_min"])
    critical = fin & (v > p["grad_critical"])
    warning = fin & (v > p["grad_warning"]) & ~critical
    return {
        "low": low,
        "healthy": fin & ~low & ~warning & ~critical,
        "warning": warning,
        "critical": critical,
        "exploded": ~fin,
    }


ZONE_COUNT_COLUMNS = {z: f"grad/steps_{z}" for z in ("healthy", "warning", "critical", "exploded")}


def zone_step_fractions(df: pd.DataFrame, p: Mapping) -> tuple[dict[str, float], int, str]:
    """Fraction of optimizer steps in each zone, how many steps, and the source.

    The trainer counts every step's zone (grad/steps_<zone>): exact, whatever log_every is. Rows
    alone only give each window's mean norm, which hides a single critical step among 10."""
    if all(c in df.columns for c in ZONE_COUNT_COLUMNS.values()):
        counts = {z: float(np.nansum(df[c].to_numpy())) for z, c in ZONE_COUNT_COLUMNS.items()}
        total = sum(counts.values())
        if total > 0:
            return {z: n / total for z, n in counts.items()}, int(total), "per-step zone counts"
    zones = grad_zones(df["grad/global_norm"].to_numpy(), p)
    n = len(df)
    return (
        {
            "healthy": float((zones["healthy"] | zones["low"]).mean()),
            "warning": float(zones["warning"].mean()),
            "critical": float(zones["critical"].mean()),
            "exploded": float(zones["exploded"].mean()),
        },
        n,
        "logged rows (window means)",
    )


def check_grad_norm(df: pd.DataFrame, p: Mapping) -> dict:
    col = "grad/global_norm"
    if col not in df.columns or len(df) == 0:
        return _result("skip", f"{col} not logged.", {}, f"Log {col} (pre-clipping) to enable this check.")
    frac, n_steps, source = zone_step_fractions(df, p)
    # Exploded (non-finite) steps are shown here but judged by nonfinite, whose fix names the
    # module: one NaN step is one failure, reported once. This check fails on finite norms that
    # are too large, the ones clipping and the LR control.
    finite_share = 1.0 - frac["exploded"]
    critical = frac["critical"] / finite_share if finite_share > 0 else 0.0
    norms = df[col].to_numpy()
    finite = norms[np.isfinite(norms)]
    peak = df["grad/max_norm"].to_numpy() if "grad/max_norm" in df.columns else norms
    peak = peak[np.isfinite(peak)]
    evidence: dict[str, Any] = {f"frac_{z}": f for z, f in frac.items()}
    evidence["steps"] = n_steps
    evidence["source"] = source
    evidence["frac_low_rows"] = float(grad_zones(norms, p)["low"].mean())
    evidence["median_norm"] = float(np.median(finite)) if finite.size else float("nan")
    evidence["max_norm"] = float(peak.max()) if peak.size else float("nan")
    bad_rows = np.zeros(len(df), dtype=bool)
    for z in ("critical", "exploded"):
        if ZONE_COUNT_COLUMNS[z] in df.columns:
            bad_rows |= df[ZONE_COUNT_COLUMNS[z]].to_numpy() > 0
    zones = grad_zones(norms, p)
    bad_rows |= zones["critical"] | zones["exploded"]
    bad_steps = df["step"].to_numpy()[bad_rows]
    if bad_steps.size:
        evidence["first_bad_step"] = int(bad_steps[0])
    if "grad/clip_fraction" in df.columns and np.isfinite(df["grad/clip_fraction"].to_numpy()).any():
        evidence["clip_fraction"] = float(np.nanmean(df["grad/clip_fraction"].to_numpy()))
    elif "grad/clipped_norm" in df.columns:
        clipped = df["grad/clipped_norm"].to_numpy()
        ok = np.isfinite(clipped) & np.isfinite(norms)
        if ok.any():  # clipping scales to max_norm, so clipped < pre-clip norm means it acted
            evidence["clip_fraction"] = float((clipped[ok] < norms[ok] * (1 - 1e-6)).mean())
    evidence["frac_critical_of_finite"] = critical
    if critical > p["grad_max_critical_fraction"]:
        status = "fail"
    elif frac["warning"] > 0.25:  # a quarter of steps near the edge: one LR bump from exploding
        status = "warn"
    else:
        status = "pass"
    exploded = f"; exploded (non-finite, see nonfinite) {100 * frac['exploded']:.1f} %" if frac["exploded"] else ""
    summary = (
        f"Norm critical (> {p['grad_critical']:g}) in {100 * critical:.1f} % of the finite steps "
        f"(limit {100 * p['grad_max_critical_fraction']:g} %) of {n_steps:,}; healthy {100 * frac['healthy']:.1f} %, "
        f"warning (> {p['grad_warning']:g}) {100 * frac['warning']:.1f} %{exploded}; "
        f"median norm {evidence['median_norm']:.3g}, max {evidence['max_norm']:.3g}."
    )
    fix = (
        "Clip gradients at max_norm=1.0 (train.grad_clip; after scaler.unscale_), lower the LR or "
        "lengthen warm-up, and check precision/scaler settings (bf16, or GradScaler init_scale=2**10 "
        "rather than 2**16)."
    )
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- loss_spikes


def spike_scan(df: pd.DataFrame, p: Mapping) -> pd.DataFrame:
    """Per finite-loss row: step, loss, threshold (mean + k*std of the trailing window of finite
    losses, NaN with fewer than 10), sigma, ratio (loss / trailing mean), spike (bool)."""
    cols = ["step", "loss", "threshold", "sigma", "ratio", "spike"]
    if "train/loss" not in df.columns:
        return pd.DataFrame(columns=cols)
    d = _finite(df, "train/loss").reset_index(drop=True)
    loss = d["train/loss"]
    # As the trainer's detector: a window shorter than MIN_SPIKE_WINDOW (only a plain mapping can
    # hold one; the schema refuses it) judges once it is full.
    trailing = loss.shift(1).rolling(p["spike_window"], min_periods=min(MIN_SPIKE_WINDOW, p["spike_window"]))
    mean = trailing.mean()
    # Floor std at 1e-9 * |mean| so a perfectly flat loss does not divide by zero.
    std = np.maximum(trailing.std(), 1e-9 * mean.abs())
    # A row is the mean loss of the steps since the previous row. A shorter window (the run's
    # last, partial one) is noisier by sqrt(usual / its own steps): widen its band accordingly,
    # or a single final step reads as a 6-sigma spike against 5-step means.
    window = d["step"].diff().fillna(d["step"].iloc[0]).clip(lower=1)
    std = std * np.sqrt(np.maximum(window.median() / window, 1.0))
    threshold = mean + p["spike_k"] * std
    return pd.DataFrame(
        {
            "step": d["step"],
            "loss": loss,
            "threshold": threshold,
            "sigma": (loss - mean) / std,
            "ratio": loss / mean,
            "spike": (loss > threshold).fillna(False).astype(bool),
        }
    )


def check_loss_spikes(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> dict:
    spike_events = [e for e in events or () if e.get("kind") == "loss_spike" and e.get("step") is not None]
    event_steps = sorted({int(e["step"]) for e in spike_events})
    fix = (
        "Lower the LR or lengthen warm-up, clip gradients at 1.0, look for bad batches at the spike "
        "steps, and skip the update on a spike (train.skip_spikes=true) instead of applying it."
    )
    if "train/loss" not in df.columns:
        if not event_steps:
            return _result(
                "skip", "train/loss not logged and no loss_spike events.", {}, "Log train/loss to enable this check."
            )
        return _result(
            "warn",
            f"{len(event_steps)} loss_spike event(s) (steps {_steps_text(event_steps)}); "
            "recovery cannot be checked without train/loss.",
            {"count": len(event_steps), "steps": _steps_text(event_steps), "from_events": len(event_steps)},
            fix,
        )
    scan = spike_scan(df, p)
    if scan.empty:
        return _result("skip", "train/loss has no finite values.", {}, "Log train/loss to enable this check.")
    rows = scan[scan["spike"]]
    spike_steps = sorted(set(rows["step"].astype(int)) | set(event_steps))
    if not spike_steps:
        return _result(
            "pass",
            f"No loss spike in {len(scan):,} logged steps "
            f"(loss > mean + {p['spike_k']:g}·std of the trailing {p['spike_window']} losses).",
            {"count": 0, "rows": len(scan)},
            None,
        )

    # Recovered: the median of the last 10 % of rows (those after the spike) is back under the
    # detection threshold in force at the spike, i.e. inside the loss's normal range of that time.
    n_tail = max(1, math.ceil(0.1 * len(scan)))
    tail = scan.iloc[-n_tail:]
    steps_arr = scan["step"].to_numpy()
    thr, loss = scan["threshold"].to_numpy(), scan["loss"].to_numpy()
    tail_steps, tail_loss = steps_arr[-n_tail:], loss[-n_tail:]
    unrecovered = []
    for s in spike_steps:  # searchsorted, not a scan per spike: runs can have 1e5 rows
        i = np.searchsorted(steps_arr, s)  # first row at or after the spike
        ref = np.nan if i == len(scan) else (thr[i] if np.isfinite(thr[i]) else loss[i])
        after = tail_loss[tail_steps > s]
        if after.size == 0 or not np.isfinite(ref) or np.median(after) >= ref:
            unrecovered.append(s)
    # Severity: the spike's loss over the trailing mean. A row is a window's mean loss, which
    # dilutes one bad step; an event holds the step's own loss against its threshold (mean +
    # k·std >= mean, so loss / threshold understates the ratio): take the larger.
    ratios = [(float(r["ratio"]), int(r["step"])) for _, r in rows.iterrows() if np.isfinite(r["ratio"])]
    ratios += [
        (float(e["loss"]) / float(e["threshold"]), int(e["step"]))
        for e in spike_events
        if _positive(e.get("threshold")) and _finite_number(e.get("loss"))
    ]
    worst_ratio, worst_step = max(ratios) if ratios else (float("nan"), spike_steps[0])
    severe = sorted({st for r, st in ratios if r >= p["spike_fail_factor"]})
    largest = rows.loc[rows["loss"].idxmax()] if len(rows) else None
    evidence: dict[str, Any] = {
        "count": len(spike_steps),
        "steps": _steps_text(spike_steps),
        "first_step": spike_steps[0],
        "from_rows": len(rows),
        "from_events": len(event_steps),
        "max_ratio": worst_ratio,
        "max_ratio_step": worst_step,
        "severe": len(severe),
        "fail_factor": p["spike_fail_factor"],
        "tail_median_loss": float(tail["loss"].median()),
        "recovered": not unrecovered,
        "unrecovered": len(unrecovered),
    }
    if largest is not None:
        evidence["largest_spike_step"] = int(largest["step"])
        evidence["largest_spike_loss"] = float(largest["loss"])
        evidence["largest_spike_sigma"] = float(largest["sigma"])
    status = "fail" if unrecovered or severe else "warn"
    top = f" (worst at step {worst_step}: {worst_ratio:.3g}x the trailing mean loss)" if ratios else ""
    outcome = (
        "loss recovered"
        if not unrecovered
        else f"{len(unrecovered)} not recovered (last-10 % median {evidence['tail_median_loss']:.4g})"
    )
    why = f"; {len(severe)} at >= {p['spike_fail_factor']:g}x (fails)" if severe else ""
    at = "step" if len(spike_steps) == 1 else "steps"
    summary = f"{len(spike_steps)} loss spike(s) at {at} {_steps_text(spike_steps)}{top}; {outcome}{why}."
    return _result(status, summary, evidence, fix)


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any) -> bool:
    return _finite_number(v) and v > 0


# ---------------------------------------------------------------- loss_regression

# Columns that say what the optimizer did to each module: grad/<module>/norm (the trainer logs one
# per top-level module) and grad/<module>/update_ratio where a trainer logs it per module; the
# global grad/update_ratio (|update| / |weights|, sampled once per logged row) stands for all.
_MODULE_SERIES = re.compile(r"^grad/(?P<module>[^/]+)/(?P<kind>norm|update_ratio)$")
_MIN_REGRESSION_ROWS = 5  # a median over fewer finite rows smooths nothing


def regression_scan(df: pd.DataFrame, p: Mapping) -> pd.DataFrame | str:
    """Per finite-loss row after warm-up: step, loss, smoothed (a centred rolling median), best
    (the running minimum of smoothed before this row) and rise (smoothed / best - 1); or why not.

    The median spans 2h + 1 rows, h = max(2, regression_min_steps / 2 rows): a centred median of
    2h + 1 rows erases any excursion of h rows or fewer, so a spike (the loss_spikes check's
    business) never reaches the rise test, while a step up that lasts longer keeps its start and
    end steps (a median does not smear an edge as a mean does, and centred it does not lag)."""
    if "train/loss" not in df.columns:
        return "train/loss not logged"
    d = _finite(after_warmup(df, p["warmup_steps"]), "train/loss").reset_index(drop=True)
    if len(d) < _MIN_REGRESSION_ROWS:
        return f"{len(d)} finite loss rows after warm-up (need {_MIN_REGRESSION_ROWS})"
    steps = d["step"].to_numpy()
    spacing = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    half = max(2, int(p["regression_min_steps"] // (2 * max(spacing, 1.0))))
    smoothed = d["train/loss"].rolling(2 * half + 1, center=True, min_periods=1).median().to_numpy()
    if not (smoothed > 0).all():
        return "the loss is not positive throughout: a rise relative to its best is undefined"
    best = np.minimum.accumulate(smoothed)
    before = np.concatenate([[smoothed[0]], best[:-1]])
    return pd.DataFrame(
        {
            "step": steps,
            "loss": d["train/loss"].to_numpy(),
            "smoothed": smoothed,
            "best": before,
            "rise": smoothed / before - 1,
        }
    ).assign(window_rows=2 * half + 1)


def find_regressions(scan: pd.DataFrame, p: Mapping) -> list[dict]:
    """Each stretch where the smoothed loss stays above its running best before the stretch by more
    than regression_rise: start, peak, the best it is measured against, end (the first row back
    within the limit) or none; `regression` is True when it lasted more than regression_min_steps
    (or still lasts at the end of training, for that long)."""
    steps, smoothed, best = scan["step"].to_numpy(), scan["smoothed"].to_numpy(), scan["best"].to_numpy()
    limit = 1 + p["regression_rise"]
    found, i, n = [], 1, len(scan)
    while i < n:
        if smoothed[i] <= best[i] * limit:
            i += 1
            continue
        ref, start = best[i], i  # the running best cannot move while the loss is above it
        j = i
        while j < n and smoothed[j] > ref * limit:
            j += 1
        peak = start + int(np.argmax(smoothed[start:j]))
        recovered = j < n
        duration = int(steps[j] - steps[start]) if recovered else int(steps[-1] - steps[start])
        found.append(
            {
                "start_step": int(steps[start]),
                "peak_step": int(steps[peak]),
                "peak_loss": float(smoothed[peak]),
                "best_loss": float(ref),
                "peak_rise": float(smoothed[peak] / ref - 1),
                "rise_loss": float(smoothed[peak] - ref),
                "duration": duration,
                "recovered": recovered,
                "recovery_step": int(steps[j]) if recovered else None,
                "regression": duration > p["regression_min_steps"],
            }
        )
        i = j
    return found


def module_series(df: pd.DataFrame) -> dict[str, str]:
    """{column: label} of the per-module gradient norms and update ratios the telemetry holds, and
    the global update ratio."""
    out = {}
    for col in df.columns:
        m = _MODULE_SERIES.match(str(col))
        if m:
            out[col] = f"{m['module']} {'gradient norm' if m['kind'] == 'norm' else 'update ratio'}"
    if "grad/update_ratio" in df.columns:
        out["grad/update_ratio"] = "update ratio (all parameters)"
    return out


def regression_movers(df: pd.DataFrame, reg: Mapping, p: Mapping, half_rows: int) -> list[dict]:
    """Per module series: its level before the regression (median over the regression_min_steps
    before the start), its level around the start (median over the regression_min_steps from the
    start, or until the recovery) and the factor between them. A series moved when that factor is
    beyond 1 + regression_rise either way (the bar the loss itself had to pass); its first step is
    where its smoothed value (the same centred median as the loss's) first crossed that bar, from
    half a span before the start. Sorted: moved series by first step, the larger factor first among
    equals; then the others, larger factor first."""
    span = p["regression_min_steps"]
    start = reg["start_step"]
    end = max(min(start + span, reg["recovery_step"] or math.inf), start + 1)
    bar = math.log1p(p["regression_rise"])
    out = []
    for col, label in module_series(df).items():
        d = _finite(after_warmup(df, p["warmup_steps"]), col)
        d = d[d[col] > 0]  # a factor of a zero level says nothing
        before = d[(d["step"] >= start - span) & (d["step"] < start)][col]
        if len(before) < 2:  # a regression right after warm-up: what there is before it
            before = d[d["step"] < start][col]
        around = d[(d["step"] >= start) & (d["step"] < end)][col]
        if before.empty or around.empty:
            continue
        base = float(before.median())
        factor = float(around.median()) / base
        first = None
        if abs(math.log(factor)) > bar:
            smooth = d.set_index("step")[col].rolling(2 * half_rows + 1, center=True, min_periods=1).median()
            near = smooth[(smooth.index >= start - span / 2) & (smooth.index < end)]
            shift = np.log(near.to_numpy() / base) * (1 if factor > 1 else -1)
            crossed = near.index[shift > bar]
            first = int(crossed[0]) if len(crossed) else int(start)
        out.append({"series": col, "label": label, "factor": factor, "first_step": first})
    return sorted(out, key=lambda m: (m["first_step"] is None, m["first_step"] or 0, -abs(math.log(m["factor"]))))


def _mover_text(m: Mapping) -> str:
    when = f" from step {m['first_step']}" if m["first_step"] is not None else ""
    return f"{m['label']} x{m['factor']:.2g}{when}"


def check_loss_regression(df: pd.DataFrame, p: Mapping) -> dict:
    """The smoothed loss held above its running best (a stretch of training that undid progress),
    which the spike test misses once its trailing window has absorbed the higher level."""
    scan = regression_scan(df, p)
    if isinstance(scan, str):
        return _result(
            "skip",
            f"No loss-regression test: {scan}.",
            {"reason": scan},
            f"Log train/loss for at least warmup_steps + {_MIN_REGRESSION_ROWS} logged steps to enable this check.",
        )
    rise_pct, min_steps = 100 * p["regression_rise"], p["regression_min_steps"]
    window = int(scan["window_rows"].iloc[0])
    i_max = int(np.argmax(scan["rise"].to_numpy()[1:])) + 1 if len(scan) > 1 else 0
    found = find_regressions(scan, p)
    regressions = [r for r in found if r["regression"]]
    # A rise still open at the end of training, shorter than regression_min_steps: too short to
    # call a regression, but the model the run ends with is that much worse than its best.
    pending = [r for r in found if not r["regression"] and not r["recovered"]]
    evidence: dict[str, Any] = {
        "regressions": len(regressions),
        "rows": len(scan),
        "window_rows": window,
        "max_rise": max(0.0, float(scan["rise"].iloc[i_max])),  # a loss that only falls: 0, not -0.2 %
        "max_rise_step": int(scan["step"].iloc[i_max]),
        "limit_rise": p["regression_rise"],
        "min_duration": min_steps,
    }
    rule = f"a regression is > {rise_pct:g} % above the best for > {min_steps} steps"
    fix = (
        "The loss climbed back and stayed there: an LR too high for this stage of training (lower "
        "train.lr, lengthen train.warmup_steps, or decay sooner), a bad stretch of data (look at the "
        "batches from the start step), or a resume that did not restore the optimizer state. "
        "Start with the module whose gradient moved first."
    )
    if not regressions:
        if pending:
            r = pending[-1]
            evidence.update({k: r[k] for k in ("start_step", "peak_step", "peak_loss", "best_loss", "peak_rise")})
            summary = (
                f"The smoothed loss ends {100 * r['peak_rise']:.0f} % above its best ({r['best_loss']:.4g}) "
                f"over the last {r['duration']} steps of training, from step {r['start_step']}: too short to "
                f"call a regression ({rule}), but the run ends worse than its best."
            )
            return _result("warn", summary, evidence, fix)
        summary = (
            f"No loss regression: the smoothed loss (median of {window} logged rows) rose at most "
            f"{100 * evidence['max_rise']:.1f} % above its running best (step {evidence['max_rise_step']}); {rule}."
        )
        return _result("pass", summary, evidence, None)

    unrecovered = [r for r in regressions if not r["recovered"]]
    worst = max(regressions, key=lambda r: r["peak_rise"])
    half = (window - 1) // 2
    movers = regression_movers(df, worst, p, half)
    evidence.update(
        {
            "unrecovered_regressions": len(unrecovered),
            "start_step": worst["start_step"],
            "peak_step": worst["peak_step"],
            "peak_loss": worst["peak_loss"],
            "best_loss": worst["best_loss"],
            "peak_ratio": worst["peak_loss"] / worst["best_loss"],
            "peak_rise": worst["peak_rise"],
            "rise_loss": worst["rise_loss"],
            "duration": worst["duration"],
            "recovered": worst["recovered"],
        }
    )
    if worst["recovered"]:
        evidence["recovery_step"] = worst["recovery_step"]
    if movers:
        first = movers[0]
        if first["first_step"] is not None:
            evidence.update(
                moved_first=first["label"], moved_first_ratio=first["factor"], moved_first_step=first["first_step"]
            )
        else:  # nothing crossed the bar: the largest change, not called a mover
            evidence.update(largest_change=first["label"], largest_change_ratio=first["factor"])
        evidence["movers"] = "; ".join(_mover_text(m) for m in movers)
    if len(regressions) > 1:
        evidence["regression_list"] = "; ".join(
            f"steps {r['start_step']}-{r['recovery_step'] or 'end'} +{100 * r['peak_rise']:.0f} %"
            for r in regressions[:_LIST_MAX]
        )

    def said(r: Mapping) -> str:
        outcome = (
            f"came back within {rise_pct:g} % of it at step {r['recovery_step']}"
            if r["recovered"]
            else "had not recovered by the end of training"
        )
        return (
            f"the smoothed loss rose {100 * r['peak_rise']:.0f} % above its best at step {r['start_step']} "
            f"({r['best_loss']:.4g} -> {r['peak_loss']:.4g} at step {r['peak_step']}, "
            f"{r['peak_loss'] / r['best_loss']:.2f}x, +{r['rise_loss']:.3g}), stayed up {r['duration']} steps and "
            f"{outcome}"
        )

    head = "Loss regression: " if len(regressions) == 1 else f"{len(regressions)} loss regressions; the largest: "
    summary = head + said(worst)
    if movers:
        m = movers[0]
        moved = m["first_step"] is not None
        summary += (
            f". Moved first: {_mover_text(m)}"
            if moved
            else f". No module's gradient or update ratio moved by more than {rise_pct:g} %; the largest "
            f"change: {_mover_text(m)}"
        )
        others = [x for x in movers[1:] if x["first_step"] is not None][:2]
        if others:
            summary += " (then " + ", ".join(_mover_text(x) for x in others) + ")"
    if unrecovered and unrecovered[0] is not worst:
        summary += f". Not recovered by the end of training: the one from step {unrecovered[0]['start_step']}"
    summary += "."
    status = "fail" if unrecovered else "warn"
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- scaler


def scaler_history(df: pd.DataFrame, events: Sequence[Mapping] | None) -> pd.DataFrame:
    """(step, scale, backoff) per logged row and per backoff event, sorted by step. Empty when the
    run had no GradScaler (amp/scale NaN throughout: fp32/bf16)."""
    parts = []
    if "amp/scale" in df.columns:
        d = _finite(df, "amp/scale").rename(columns={"amp/scale": "scale"})
        parts.append(d.assign(backoff=False))
    ev = [
        (int(e["step"]), float(e["scale"]))
        for e in events or ()
        if e.get("kind") in NONFINITE_KINDS and e.get("step") is not None and _finite_number(e.get("scale"))
    ]
    if ev:
        parts.append(pd.DataFrame(ev, columns=["step", "scale"]).assign(backoff=True))
    if not parts:
        return pd.DataFrame(columns=["step", "scale", "backoff"])
    return pd.concat(parts, ignore_index=True).sort_values(["step", "backoff"], kind="stable").reset_index(drop=True)


def check_scaler(df: pd.DataFrame, events: Sequence[Mapping] | None, p: Mapping) -> dict:
    hist = scaler_history(df, events)
    if hist.empty:
        return _result(
            "n/a", "No GradScaler in this run (fp32 or bf16 train in full range: nothing to scale).", {}, None
        )
    scale = hist["scale"].to_numpy(dtype=float)
    backoff_steps = sorted(set(hist.loc[hist["backoff"], "step"].astype(int)))
    rows = hist[~hist["backoff"]]
    growths = int((np.diff(rows["scale"].to_numpy(dtype=float)) > 0).sum()) if len(rows) > 1 else 0
    total = int(max(df["step"].max() if len(df) else 0, max(backoff_steps, default=0)))
    fraction = len(backoff_steps) / total if total else 0.0
    i_min = int(np.argmin(scale))
    evidence: dict[str, Any] = {
        "first_scale": float(scale[0]),
        "min_scale": float(scale[i_min]),
        "min_scale_step": int(hist["step"].iloc[i_min]),
        "final_scale": float(scale[-1]),
        "backoffs": len(backoff_steps),
        "backoff_fraction": fraction,
        "growths": growths,
        "total_steps": total,
    }
    if backoff_steps:
        evidence["first_backoff_step"] = backoff_steps[0]
        evidence["backoff_steps"] = _steps_text(backoff_steps)
    collapsed = scale[i_min] < p["scaler_min_scale"]
    if collapsed or fraction > p["scaler_max_backoff_fraction"]:
        status = "fail"
    elif backoff_steps:
        status = "warn"
    else:
        status = "pass"
    summary = (
        f"Loss scale {scale[0]:g} -> min {scale[i_min]:g} (step {evidence['min_scale_step']}) -> final {scale[-1]:g}; "
        f"{len(backoff_steps)} overflow backoff(s) ({100 * fraction:.1f} % of {total:,} steps, limit "
        f"{100 * p['scaler_max_backoff_fraction']:g} %), {growths} growth(s)"
        + (f"; scale fell below {p['scaler_min_scale']:g}: gradients overflow even unscaled" if collapsed else "")
        + "."
    )
    fix = (
        "Each backoff is a lost update. Start lower and grow slower — train.scaler init_scale=1024, "
        "growth_factor=1.5, growth_interval=200 (the prototype's 65536 / 2.0 / 100 overflows from step 1) — "
        "clip gradients at 1.0 after unscale_, and lower the LR; or use bf16 (train.precision=bf16), "
        "which has fp32's range and needs no scaler."
        + (
            " A scale below 1 means the gradients themselves are inf/NaN: see nonfinite and grad_norm."
            if collapsed
            else ""
        )
    )
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- convergence


def check_convergence(df: pd.DataFrame, p: Mapping) -> dict:
    """Adaptive computation over training: how many flow steps each batch ran, against the
    model's bounds, and the throughput that bought."""
    col = "flow/steps_used"
    if col not in df.columns:
        return _result("skip", f"{col} not logged.", {}, f"Log {col} to enable this check.")
    d = _finite(after_warmup(df, p["warmup_steps"]), col)
    if len(d) < 2:
        d = _finite(df, col)
    if len(d) == 0:
        return _result("skip", f"{col} has no finite values.", {}, f"Log {col} to enable this check.")
    n = len(d)
    early, steady = d.iloc[: max(1, math.ceil(0.2 * n))], d.iloc[n - max(1, math.ceil(0.5 * n)) :]
    early_med, steady_med = float(early[col].median()), float(steady[col].median())
    cap, arrive = p["step_cap"], p["min_steps_to_arrive"]
    evidence: dict[str, Any] = {
        "early_median_steps": early_med,
        "steady_median_steps": steady_med,
        "steps_ratio": steady_med / early_med if early_med > 0 else float("nan"),
        "min_steps": float(d[col].min()),
        "max_steps": float(d[col].max()),
    }
    if cap:
        evidence["step_cap"] = cap
        evidence["frac_at_cap"] = float((steady[col] >= cap - 1e-9).mean())
    if arrive:
        evidence["min_steps_to_arrive"] = arrive
    if "flow/flow_steps" in df.columns:
        fs = df["flow/flow_steps"].to_numpy()
        if np.isfinite(fs).any():
            evidence["median_flow_steps"] = float(np.nanmedian(fs))
    if "perf/samples_per_s" in df.columns:
        sps = _finite(after_warmup(df, p["warmup_steps"]), "perf/samples_per_s")["perf/samples_per_s"]
        if len(sps):
            evidence["median_samples_per_s"] = float(sps.median())
            m = len(sps)
            evidence["early_samples_per_s"] = float(sps.iloc[: max(1, math.ceil(0.2 * m))].median())
            evidence["steady_samples_per_s"] = float(sps.iloc[m - max(1, math.ceil(0.5 * m)) :].median())
    throughput = (
        f"; throughput {evidence['median_samples_per_s']:,.0f} samples/s" if "median_samples_per_s" in evidence else ""
    )
    bounds = (f" (arrival needs >= {arrive}" if arrive else "") + (f", cap {cap})" if cap else (")" if arrive else ""))
    summary = (
        f"Adaptive flow steps per batch: median {early_med:.3g} early -> {steady_med:.3g} steady{bounds}{throughput}"
    )
    if arrive and steady_med < arrive:
        status = "fail"
        summary += "; batches stop before any flow can arrive: energy collapses and every flow dies."
        fix = (
            "Flows die (energy < model.energy_min) before reaching the output surface, so the lattice "
            "contributes nothing: lower model.energy_min, lower the LR, or check the carrier's energy "
            "update for a sign or scale error."
        )
    elif cap and evidence.get("frac_at_cap", 0) >= 0.9:
        status = "warn"
        summary += f"; {100 * evidence['frac_at_cap']:.0f} % of steady rows at the cap: adaptive stopping never fires."
        fix = (
            "Every batch runs the full step cap: lower model.convergence_threshold or model.patience, or "
            "raise model.min_forward so flows arrive sooner."
        )
    elif early_med > 0 and steady_med / early_med > 1.5:
        status = "warn"
        summary += f"; steps per batch grew {steady_med / early_med:.2f}x, and step cost grows with them."
        fix = "Flows slow down as training proceeds: check model.min_forward and the carrier's forward head."
    else:
        status, fix = "pass", None
        summary += "."
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- learning


HEADLINE = "group_top1"  # what "better than a baseline" is judged on (the evaluate stage's headline)
LEARNING_BASELINES = ("identity", "ridge", "nearest")


def loss_drop(df: pd.DataFrame | None) -> tuple[float, float, float] | None:
    """(first, last, drop): the training loss over its first and last 3 logged rows (medians, so
    one noisy row does not decide) and the share it fell by; None without 2 finite rows."""
    if df is None or "train/loss" not in df:
        return None
    loss = df["train/loss"].to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    if len(loss) < 2:
        return None
    k = max(1, min(3, len(loss) // 2))
    first, last = float(np.median(loss[:k])), float(np.median(loss[-k:]))
    return first, last, (first - last) / abs(first) if first else 0.0


def check_learning(eval_metrics: Mapping | None, p: Mapping, df: pd.DataFrame | None = None) -> dict:
    """Did training teach the model anything, and is it better than the evaluate stage's
    baselines (copying the input; the best linear map; the answer of the nearest training
    question)? On the test split (val when there is none), by the headline metric, group top-1:

    - fail: the model's predictions are not finite, or its training loss fell by less than
      learning_min_drop between the first and last logged rows (it learned nothing);
    - warn: it is worse than a baseline on group top-1 (the paired difference's interval lies
      below 0): a stable run, but not a model to use;
    - pass: otherwise.
    Every difference is the evaluate stage's, with its interval, said in words; so is what the
    intervals cover (the test items, and the training seed when the preset's seed-variance
    reference matched: eval/<split>/ci_covers_seeds)."""
    if not eval_metrics:
        return _result(
            "skip", "No evaluate metrics given.", {}, "Run the evaluate stage (metrics/eval.json) to enable this check."
        )
    split = next((s for s in ("test", "val") if f"eval/{s}/model/cosine" in eval_metrics), None)
    if split is None:
        return _result(
            "skip",
            "The evaluate metrics hold no eval/test/model/cosine or eval/val/model/cosine.",
            {},
            "Re-run the evaluate stage.",
        )

    def get(who: str, metric: str = "cosine", part: str = "") -> float:
        v = eval_metrics.get(f"eval/{split}/{who}/{metric}" + (f"/{part}" if part else ""))
        return float(v) if _finite_number(v) else float("nan")

    # The headline metric, or cosine for an evaluation that has no retrieval metrics.
    headline = HEADLINE if math.isfinite(get("model", HEADLINE)) else "cosine"
    covers_seeds = bool(eval_metrics.get(f"eval/{split}/ci_covers_seeds", 0))
    ref_seeds = int(eval_metrics.get(f"eval/{split}/seed_reference_seeds", 0) or 0)
    evidence: dict[str, Any] = {
        "split": split,
        "headline": headline,
        "ci_covers_seeds": covers_seeds,
        "seed_reference_seeds": ref_seeds,
    }
    evidence["model_cosine"] = get("model", "cosine")  # (NaN too: the figure the fail is about)
    for metric in ("group_top1", "group_top5", "mrr", "cosine", "top1", "top5"):
        for name in ("model", *LEARNING_BASELINES):
            if math.isfinite(get(name, metric)):
                evidence[f"{name}_{metric}"] = get(name, metric)
    said, worse_than = [], []
    for b in LEARNING_BASELINES:
        for metric in dict.fromkeys((headline, "cosine")):
            d = [get(f"model_vs_{b}", metric, part) for part in ("", "ci95_low", "ci95_high", "p_value")]
            if not all(math.isfinite(x) for x in d):
                continue
            evidence.update(
                {
                    f"vs_{b}_{metric}": d[0],
                    f"vs_{b}_{metric}_ci95_low": d[1],
                    f"vs_{b}_{metric}_ci95_high": d[2],
                    f"vs_{b}_{metric}_p_value": d[3],
                }
            )
            name = metric.replace("group_top1", "group top-1")
            interval = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
            if d[1] > 0:
                said.append(f"beats {b} on {name} by {interval}")
            elif d[2] < 0:
                said.append(f"trails {b} on {name} by {interval}")
                if metric == headline:
                    worse_than.append((b, interval))
            else:
                said.append(f"no significant difference from {b} on {name} ({interval})")
    drop = loss_drop(df)
    if drop is not None:
        evidence.update(loss_first=drop[0], loss_last=drop[1], loss_drop=drop[2])
    evidence["min_drop"] = p["learning_min_drop"]
    said_name = headline.replace("group_top1", "group top-1")
    model = get("model", headline)
    against = ", ".join(f"{n} {get(n, headline):.3f}" for n in LEARNING_BASELINES if math.isfinite(get(n, headline)))
    summary = f"{split} {said_name} {model:.3f} ({against or 'no baselines'})"
    luck = (
        f"the intervals cover the test items and the training seed (the preset's seed-variance reference, "
        f"{ref_seeds} seeds)"
        if covers_seeds
        else "the intervals cover the test items only, not the training seed's luck (no seed-variance reference "
        "for this preset and data: ./dev seeds measures one)"
    )
    fix = None
    if not math.isfinite(get("model", "cosine")):
        status, fix = "fail", "The trained model's predictions are not finite: see nonfinite and grad_norm."
        summary = f"{split} cosine of the trained model is {get('model', 'cosine')}; baselines: {against}."
    elif drop is not None and drop[2] < p["learning_min_drop"]:
        status = "fail"
        summary += (
            f": it learned nothing: the training loss went from {drop[0]:.4g} to {drop[1]:.4g} "
            f"({-drop[2]:+.1%}; needs a fall of at least {p['learning_min_drop']:.0%})."
        )
        fix = (
            "Training did not lower the loss: check the LR (too high diverges, too low does nothing), the number "
            "of epochs, and that skipped steps (nonfinite) did not eat the run."
        )
    elif worse_than:
        status = "warn"
        summary += ": worse than " + ", ".join(f"{b} ({iv})" for b, iv in worse_than) + f" on {said_name}."
        fix = (
            "The model is worse than a baseline that needs no training: train longer (train.epochs), widen the "
            "model (model.output_hidden, lattice size), or add the linear path (model.residual=linear); the smoke "
            "preset is expected to stop here."
        )
    else:
        status = "pass"
        summary += f": not worse than any baseline on {said_name}."
    if said:
        summary += " The model " + "; ".join(said) + "."
    summary += f" {luck[0].upper()}{luck[1:]}."
    return _result(status, summary, evidence, fix)


# ---------------------------------------------------------------- entry points


def run_checks(
    steps: pd.DataFrame | None,
    events: Sequence[Mapping] | None,
    params: Mapping | None,
    eval_metrics: Mapping | None = None,
    unmeasured: str = "",
) -> dict:
    """All checks. `checks` is ordered fail, warn, skip, pass, n/a (canonical order within a
    status); `failed` lists the failed check names in canonical order. `unmeasured`: why this
    run has no time and memory measurements; the checks of MEASURED_CHECKS are then skipped
    and say so, instead of judging columns that are not there."""
    p = resolve_params(params)
    df = prepare_steps(steps)
    events = list(events) if events is not None else None
    if unmeasured:
        memory = step_time = device = _result(
            "skip", f"No time or memory measurements of this run: {unmeasured}.", {}, REMEASURE
        )
    else:
        memory, step_time = check_memory_growth(df, p), check_step_time(df, p)
        device = check_device_utilisation(df, p)
    checks = {
        "memory_growth": memory,
        "step_time_degradation": step_time,
        "device_utilisation": device,
        "nonfinite": check_nonfinite(df, events, p),
        "grad_norm": check_grad_norm(df, p),
        "loss_spikes": check_loss_spikes(df, events, p),
        "loss_regression": check_loss_regression(df, p),
        "scaler": check_scaler(df, events, p),
        "convergence": check_convergence(df, p),
        "learning": check_learning(eval_metrics, p, df),
    }
    failed = [n for n in CHECK_ORDER if checks[n]["status"] == "fail"]
    ordered = dict(sorted(checks.items(), key=lambda kv: _STATUS_RANK[kv[1]["status"]]))
    return {"verdict": "unstable" if failed else "stable", "checks": ordered, "failed": failed}


WARNED = "stable, with warnings"


def headline_verdict(result: Mapping) -> str:
    """What a reader is told first (the banner, the MLflow tag stability.verdict): "stable" only
    when no check failed or warned; "stable, with warnings" when one warned (a model worse than a
    baseline is not one to show in green); "unstable" when one failed."""
    if result["verdict"] != "stable":
        return "unstable"
    return WARNED if any(c["status"] == "warn" for c in result["checks"].values()) else "stable"


# What to do when a run's time and memory were not measured or belong to another run.
REMEASURE = "To measure this run, train it again: `dvc repro --force --single-item train`, then `dvc repro`."

# The checks that judge the run's time and memory measurements (telemetry/train_perf.*): skipped
# when the run has none of its own (`unmeasured`), and, since those figures differ on every run,
# their evidence stays out of the DVC metrics file (two identical runs must give identical
# hashes); the report and MLflow show it.
MEASURED_CHECKS = frozenset({"memory_growth", "step_time_degradation", "device_utilisation"})
# Of those, the judgements of wall-clock time, which the machine's load can decide: on a shared
# 2-core machine a neighbour busy during half of a smoke run (steps of a few ms) is enough to lift
# the steady/early median above step_time_max_ratio (1.5), in a run whose ratio is 1.05 on an
# idle machine; the GPU's busy share is a share of wall time, which a busy host (or a neighbour
# on the GPU) lowers. Whatever compares two runs' reports (the fault matrix, the kill test) must
# not read a difference here as a diagnosis unless it asked for it. The checks themselves are
# tested on synthetic telemetry (tests/test_report_checks.py, tests/test_device_check.py); real
# step time is measured by bench/trainer.py, against a probe.
WALL_CLOCK_CHECKS = ("step_time_degradation", "device_utilisation")
MEASURED_EVIDENCE = ("_mb", "_ms", "samples_per_s", "seconds")
# Of a measured check's evidence, the counts: the same on every run of the same settings (the
# host reads and ops of a sampled step; the synthetic flag, set by the fault and the device), so
# they stay in the DVC metrics file, where `dvc metrics diff` shows what a change did to them.
# Kernel counts are the profiler's and can change with the libraries' choice of kernels: left out.
COUNTED_EVIDENCE = {"device_utilisation": frozenset({"host_syncs_per_step", "ops_per_step", "synthetic"})}


def _is_measured(check: str, key: str) -> bool:
    """Is this evidence figure a measurement of time or memory (kept out of the DVC metrics)?"""
    if any(part in key for part in MEASURED_EVIDENCE):
        return True
    return check in MEASURED_CHECKS and key not in COUNTED_EVIDENCE.get(check, ())


def stability_metrics(result: Mapping, measured: bool = False) -> dict:
    """Verdict plus, per check, pass/status and its numeric evidence (bools kept; non-finite
    floats become None so the JSON stays strict). Without `measured` (the DVC metrics file) the
    evidence that is a measurement of time or memory (MEASURED_CHECKS but for their counts,
    COUNTED_EVIDENCE; MEASURED_EVIDENCE) is left out; with it (MLflow,
    reports/stability_evidence.json) everything is in."""
    out: dict[str, Any] = {"verdict": result["verdict"]}
    names = [n for n in CHECK_ORDER if n in result["checks"]]
    names += [n for n in result["checks"] if n not in names]
    for name in names:
        check = result["checks"][name]
        m: dict[str, Any] = {"pass": bool(check["pass"]), "status": check["status"]}
        for key, value in check["evidence"].items():
            if not measured and _is_measured(name, key):
                continue
            value = _py(value)
            if isinstance(value, bool) or isinstance(value, int):
                m[key] = value
            elif isinstance(value, float):
                m[key] = value if math.isfinite(value) else None
        out[name] = m
    return out
