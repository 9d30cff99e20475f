"""The train stage's telemetry as the checks read it: one numeric row per logged optimizer step,
sorted by step, and the row selections and number tests more than one check uses."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


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


def finite_rows(df: pd.DataFrame, col: str) -> pd.DataFrame:
    d = df[["step", col]]
    return d[np.isfinite(d[col].to_numpy())]


def finite_number(v: Any) -> bool:
    """A real, finite number (not a bool, not a string): what an event or a metric may hold."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
