"""Synthetic data the tests train and judge on, built in one place: a learnable task for the
trainer (`linear_task`) and a healthy run's telemetry for the report's checks (`clean_run`).
Shards on disk come from tests/helpers/shards.py (`fake_shards`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

CLEAN_RUN_STEPS = 500


def linear_task(n: int = 192, dim: int = 16, seed: int = 0, squash: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Inputs x (n x dim, standard normal) and targets x @ W (W normal / sqrt(dim)); squash:
    tanh(x @ W), a smooth nonlinear target. The same arrays for the same arguments, in every
    process (the distributed tests give each rank the same task)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    w = rng.normal(size=(dim, dim)).astype(np.float32) / np.sqrt(dim)
    y = x @ w
    return x, (np.tanh(y) if squash else y).astype(np.float32)


def clean_run(n: int = CLEAN_RUN_STEPS, seed: int = 0) -> pd.DataFrame:
    """A healthy GPU run's telemetry, one row per step: decaying loss with noise, flat step time,
    memory jittering +-5 MB, gradient norms 0.5-3, and a sampled step's device figures: a GPU
    busy 80-90 % of the step, one host read, 900 kernels of 40 us, 1 % of the step waiting for data.
    No perf/flow_step_ms: step time is judged per training step, as in telemetry from before it."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1)
    ms = 20 + rng.normal(0, 1, n)
    norm = rng.uniform(0.5, 3, n)
    df = pd.DataFrame(
        {
            "step": step,
            "epoch": (step - 1) // 100,
            "train/loss": 2 + 3 * np.exp(-step / 80) + rng.normal(0, 0.05, n),
            "train/skipped": 0,
            "grad/global_norm": norm,
            "grad/clipped_norm": np.minimum(norm, 1.0),
            "train/lr": 1e-3,
            "perf/step_ms": ms,
            "perf/samples_per_s": 32 / (ms / 1000),
            "flow/steps_used": rng.integers(5, 9, n),
            "mem/rss_mb": 1500 + rng.uniform(-5, 5, n),
            "mem/device_allocated_mb": 800 + rng.uniform(-5, 5, n),
            "mem/device_peak_mb": 1200 + rng.uniform(-5, 5, n),
        }
    )
    # Drawn after the columns above, so those are the same numbers they were before these existed.
    df["perf/data_ms"] = 0.01 * ms
    df["perf/host_syncs"] = 1.0
    df["perf/ops"] = 800.0
    df["perf/kernels"] = 900.0
    df["perf/kernel_us"] = 40.0
    df["perf/gpu_busy"] = rng.uniform(0.8, 0.9, n)
    df["perf/busy_synthetic"] = 0.0
    return df
