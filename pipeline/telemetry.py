"""Per-window training telemetry: what each logged row holds, and the memory readings."""
from __future__ import annotations

import math
import os

import psutil
import torch

_PROC = psutil.Process(os.getpid())

# Columns of the per-log-row telemetry table (telemetry/train_steps.csv, a DVC plot). The report
# stage reads the same names; `split/name` everywhere, as in MLflow.
STEP_COLUMNS = [
    "step", "epoch", "train/loss", "train/skipped", "grad/global_norm", "grad/clipped_norm", "train/lr",
    "perf/step_ms", "perf/data_ms", "perf/samples_per_s", "flow/steps_used", "flow/flow_steps",
    "mem/rss_mb", "mem/device_allocated_mb", "mem/device_peak_mb",
]


def rss_mb() -> float:
    return _PROC.memory_info().rss / 2**20


def device_memory_mb(device: torch.device) -> tuple[float, float]:
    """(allocated, peak since the last reset) in MB; zeros off CUDA. Peak is reset by the caller
    only at log boundaries, so the peak covers the whole window."""
    if device.type != "cuda":
        return 0.0, 0.0
    return torch.cuda.memory_allocated(device) / 2**20, torch.cuda.max_memory_allocated(device) / 2**20


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
