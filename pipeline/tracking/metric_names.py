"""How the project's metric keys (metrics/*.json, the telemetry CSVs, the report, DVC's plots)
appear on an MLflow run: one table, applied where values cross into MLflow (tracking.log_metrics,
the train stage's metric buffer, the system-metrics sampler, the replay of pending values).

Why a table, and its sections: docs/mlflow.md ("Metrics"). Every MLflow key has exactly one `/`,
and `curves` sorts before every other section so the training curves come first. Constants
become tags (`TAGS`), the headline 95 % intervals tags like `eval.test.group_top1 = "0.883 [0.857,
0.907]"` (`INTERVAL_TAGS`). A key of the project's own families that is not in the table is not
logged (a new telemetry column cannot add a chart section by accident: add it here); any other
key (a notebook's, a test's) passes through as it is.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

# Key families the project writes: a key of these not in the table is not logged.
PROJECT_PREFIXES = (
    "train/",
    "val/",
    "grad/",
    "amp/",
    "perf/",
    "flow/",
    "range/",
    "mem/",
    "eval/",
    "stability/",
    "baseline/",
)
PROJECT_KEYS = ("step", "epoch")
SYSTEM_PREFIX = "system/"  # MLflow's system-metrics collectors

CURVES = {
    "train/loss": "curves/loss",
    "val/loss": "curves/val_loss",
    "val/cosine": "curves/val_cosine",
    "grad/global_norm": "curves/grad_norm",
    "grad/update_ratio": "curves/update_ratio",
    "perf/step_ms": "curves/step_ms",
    "train/lr": "curves/lr",
}
HEADLINE = ("group_top1", "group_top5", "top1", "mrr", "cosine", "mse")  # the model's test metrics
EVAL = {
    **{f"eval/test/model/{m}": f"eval/test_{m}" for m in HEADLINE},
    "eval/val/model/group_top1": "eval/val_group_top1",
    "eval/val/model/cosine": "eval/val_cosine",
}
# The rivals that could win, charted: the MLP (trained, so it moves with the training config) and
# ridge. Identity and nearest are floors, constants of the data: their scores and the model's
# difference from them are interval tags (INTERVAL_TAGS), which keeps a run under 60 metrics.
RIVALS = ("mlp", "ridge")
EVAL_BASELINES = {
    **{f"eval/test/{b}/group_top1": f"eval_baselines/{b}_group_top1" for b in RIVALS},
    **{f"eval/test/model_vs_{b}/group_top1": f"eval_baselines/model_vs_{b}_group_top1" for b in RIVALS},
    "eval/test/mlp/cosine": "eval_baselines/mlp_cosine",
    "eval/test/model_vs_mlp/cosine": "eval_baselines/model_vs_mlp_cosine",
    "eval/test/model_vs_ridge/cosine": "eval_baselines/model_vs_ridge_cosine",
}
# The answer model's abstention figures (written by evaluate where it calibrates a threshold).
EVAL_ANSWERS = {
    f"eval/answer/{k}": f"eval_answers/{k}"
    for k in (
        "threshold",
        "val_answered_share",
        "val_answered_precision",
        "test_answered_share",
        "test_answered_precision",
        "out_of_bank_refused_share",
    )
}
DIAGNOSTICS = {
    "grad/clip_fraction": "gradients/clip_fraction",
    "grad/zone": "gradients/zone",
    "train/skipped_steps": "gradients/skipped_steps",
    "train/spikes": "gradients/spikes",
    "amp/scale": "gradients/loss_scale",
    "perf/samples_per_s": "speed/samples_per_s",
    **{f"perf/{p}_ms": f"speed/{p}_ms" for p in ("data", "forward", "backward", "optimizer", "flow_step")},
    "perf/gpu_busy": "speed/gpu_busy",
    "train/seconds": "speed/train_seconds",
    "flow/steps_used": "flow/steps_used",
    "flow/flow_steps": "flow/flow_steps",
    "flow/overruns": "flow/overruns",
    **{f"range/{k}_rms": f"range/{k}_rms" for k in ("energy", "hidden", "surface")},
    "mem/rss_mb": "memory/rss_mb",
    "mem/rss_peak_mb": "memory/rss_peak_mb",
    "mem/device_peak_mb": "memory/device_peak_mb",
    "stability/verdict_code": "stability/verdict_code",
    "stability/failed_checks": "stability/failed_checks",
    "stability/warned_checks": "stability/warned_checks",
    "train/diverged": "stability/diverged",
    # The embed run's two figures.
    "perf/embed_seconds": "perf/embed_seconds",
    "perf/texts_per_s": "perf/texts_per_s",
}
METRICS: Mapping[str, str] = {**CURVES, **EVAL, **EVAL_ANSWERS, **EVAL_BASELINES, **DIAGNOSTICS}
# Per module: grad/<module>/norm.
_MODULE_NORM = re.compile(r"^grad/([A-Za-z0-9_]+)/norm$")
# MLflow's samplers: CPU and memory use, and per GPU its use and memory (disk and network stay out).
SYSTEM = {
    "system/cpu_utilization_percentage": "machine/cpu_percent",
    "system/system_memory_usage_percentage": "machine/memory_percent",
}
_GPU = re.compile(r"^system/gpu_(\d+)_(utilization_percentage|memory_usage_megabytes)$")
_GPU_NAMES = {"utilization_percentage": "percent", "memory_usage_megabytes": "memory_mb"}

# Constants of a run: tags, which the run page lists apart from the charts (and a resumed run
# may change, unlike a param).
TAGS = {
    "eval/bank_size": "eval.bank_size",
    "eval/val/items": "eval.val.items",
    "eval/test/items": "eval.test.items",
    "eval/test/seed_reference_seeds": "eval.seed_reference_seeds",
    "train/steps": "train.steps",
    "train/planned_steps": "train.planned_steps",
    "train/resumed_from_step": "train.resumed_from_step",
    "flow/step_cap": "flow.step_cap",
    "flow/min_steps_to_arrive": "flow.min_steps_to_arrive",
    "perf/host_syncs_per_step": "perf.host_syncs_per_step",
    "mem/estimate_peak_mb": "memory.estimate_peak_mb",
    "mem/estimate_peak_worst_mb": "memory.estimate_peak_worst_mb",
    "mem/available_host_mb": "memory.available_host_mb",
    "mem/available_device_mb": "memory.available_device_mb",
    "stability/checks_run": "stability.checks_run",
    "eval/test/mlp/replicates": "eval.test.mlp.replicates",
    "eval/test/model_vs_mlp/ci_covers_seeds": "eval.test.vs_mlp.covers_seeds",
    **{f"baseline/mlp/{k}": f"baseline.mlp.{k}" for k in ("params", "model_params", "hidden", "skip", "seeds")},
}
# The headline intervals: the value and its 95 % interval in one tag (three metrics before).
INTERVAL_TAGS = {
    **{f"eval/test/model/{m}": f"eval.test.{m}" for m in HEADLINE},
    "eval/test/mlp/group_top1": "eval.test.mlp.group_top1",
    "eval/test/model_vs_mlp/group_top1": "eval.test.vs_mlp.group_top1",
    "eval/test/model_vs_mlp/cosine": "eval.test.vs_mlp.cosine",
    "eval/test/model_vs_ridge/group_top1": "eval.test.vs_ridge.group_top1",
    "eval/test/model_vs_ridge/cosine": "eval.test.vs_ridge.cosine",
    **{f"eval/test/{b}/group_top1": f"eval.test.{b}.group_top1" for b in ("nearest", "identity")},
    **{f"eval/test/model_vs_{b}/group_top1": f"eval.test.vs_{b}.group_top1" for b in ("nearest", "identity")},
}
HEADLINE_METRIC = "eval/test_group_top1"  # what runs are ranked by (the saved view's sort)


def mlflow_key(key: str) -> str | None:
    """The MLflow metric key of a file key (None: not logged as a metric)."""
    if key in METRICS:
        return METRICS[key]
    if match := _MODULE_NORM.match(key):
        return f"gradients/norm_{match.group(1)}"
    if key in SYSTEM:
        return SYSTEM[key]
    if match := _GPU.match(key):
        return f"machine/gpu{match.group(1)}_{_GPU_NAMES[match.group(2)]}"
    if key.startswith((*PROJECT_PREFIXES, SYSTEM_PREFIX)) or key in PROJECT_KEYS:
        return None
    return key


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _tag_value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else format(value, ".6g")


def interval_text(value: float, low: float, high: float, signed: bool = False, p_value: float | None = None) -> str:
    """`0.883 [0.857, 0.907]`; a difference carries its sign (and p-value): `+0.027 [+0.010, +0.045] p=0.008`."""
    if not signed:
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    text = f"{value:+.3f} [{low:+.3f}, {high:+.3f}]"
    return text if p_value is None else f"{text} p={p_value:.3f}"


def route(metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """(MLflow metrics, MLflow tags) of a dict of file keys: values renamed or left out, constants
    as tags, headline intervals as tags. Values that are not finite numbers are left out (MLflow
    refuses them)."""
    out: dict[str, float] = {}
    tags: dict[str, str] = {}
    for key, raw in metrics.items():
        value = _number(raw)
        if value is None:
            continue
        if key in TAGS:
            tags[TAGS[key]] = _tag_value(value)
        elif (name := mlflow_key(key)) is not None:
            out[name] = value
    for key, tag in INTERVAL_TAGS.items():
        value, low, high = (_number(metrics.get(k)) for k in (key, f"{key}/ci95_low", f"{key}/ci95_high"))
        if value is not None and low is not None and high is not None:
            signed = "/model_vs_" in key
            tags[tag] = interval_text(value, low, high, signed, _number(metrics.get(f"{key}/p_value")))
    return out, tags
