"""The headline metrics: their names, which way is better, and the per-item value whose mean over
the test items is the metric (the evaluate stage reports them, comparisons pool them)."""

from __future__ import annotations

import numpy as np

METRICS = ("cosine", "mse", "top1", "top5", "group_top1", "group_top5", "mrr")
LOWER_IS_BETTER = frozenset({"mse"})  # all the others are better when higher
SCORE_COLUMNS = ("rank", "group_rank", "cosine", "mse")  # an item's scores, per predictor


def item_metrics(scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-item values whose means are the headline metrics."""
    rank, group_rank = scores["rank"], scores["group_rank"]
    return {
        "cosine": scores["cosine"],
        "mse": scores["mse"],
        "top1": (rank <= 1).astype(np.float64),
        "top5": (rank <= 5).astype(np.float64),
        "group_top1": (group_rank <= 1).astype(np.float64),
        "group_top5": (group_rank <= 5).astype(np.float64),
        "mrr": 1.0 / group_rank,
    }


def format_metric(x: float, metric: str, sign: bool = False) -> str:
    """A metric's value as tables and pages show it: 6 decimals for mse, 3 for the others."""
    digits = 6 if metric == "mse" else 3
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def round6(x: float) -> float:
    """A value as the JSON files hold it."""
    return round(float(x), 6)


def format_interval(low: float, high: float, metric: str, sign: bool = False) -> str:
    return f"[{format_metric(low, metric, sign)}, {format_metric(high, metric, sign)}]"
