"""Paired bootstrap over test items: 95 % confidence intervals of a mean, and of the difference
between two predictors scored on the same items, with a two-sided p-value. Paired: both means are
taken on the same resample of the items, which share their difficulty, so the difference's interval
is far narrower than two separate intervals would suggest.

Deterministic on every machine: numpy's PCG64 from the caller's seed, and means as sums of per-item
values weighted by integer resample counts in one fixed order (no BLAS). The number of resamples
and the seed have no default here: they are the evaluate config's (evaluate.bootstrap_resamples,
evaluate.bootstrap_seed), so that every caller draws the same resamples as the stage does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
_CELLS = 4_000_000  # resample weights held at once (resamples x items): 32 MB of float64


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    p_value: float | None = None  # only for differences: H0 "the mean difference is 0"

    def as_dict(self) -> dict[str, float]:
        out = {"value": self.value, "ci95_low": self.low, "ci95_high": self.high}
        if self.p_value is not None:
            out["p_value"] = self.p_value
        return out

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def resample_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(resamples, columns) means of `values` (items, columns) over bootstrap resamples of the items.
    The same seed gives the same resamples for any columns of the same item count, which is what
    makes two calls paired."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        values = values[:, None]
    n = len(values)
    if n == 0:
        raise ValueError("no items to resample; expected at least one")
    rng = np.random.Generator(np.random.PCG64(seed))
    out = np.empty((resamples, values.shape[1]))
    chunk = max(1, _CELLS // n)
    for start in range(0, resamples, chunk):
        c = min(chunk, resamples - start)
        idx = rng.integers(0, n, size=(c, n)) + np.arange(c)[:, None] * n  # row r's items offset by r*n
        counts = np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)
        # Row by row with np.dot on float64 1-D vectors would go through BLAS; an elementwise
        # product and a pairwise sum along one axis is the same on every CPU.
        for j in range(values.shape[1]):
            out[start : start + c, j] = (counts * values[:, j]).sum(axis=1) / n
    return out


def resample_bytes(resamples: int, items: int, columns: int) -> int:
    """Peak bytes of `resample_means` then `intervals` over (items, columns) values: the
    (resamples, columns) float64 means, the copy np.percentile partitions, a column's temporaries
    (the seed-luck widening), and one chunk's four arrays (draws and bin counts int64, counts and
    a column's products float64) of at most _CELLS cells (or one resample's items, if more)."""
    means = 8 * int(resamples) * int(columns)
    chunk_cells = max(1, _CELLS // max(1, items)) * max(1, items)
    return 2 * means + 2 * 8 * int(resamples) + 4 * 8 * min(chunk_cells, max(1, int(resamples) * items))


def intervals(means: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Percentile 95 % interval of each column of resampled means (resamples, columns): (lows, highs)."""
    tail = (1 - CONFIDENCE) / 2 * 100
    lows, highs = np.percentile(means, [tail, 100 - tail], axis=0)
    return lows, highs


def p_value(diff: np.ndarray | None, resampled_means: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "the mean difference is 0": twice the share of resampled
    means on the far side of 0, with the usual +1 so that it is never 0. Identical outcomes on
    every item give 1 (no evidence either way); diff None: the draws alone say (when they hold
    luck other than the items')."""
    if diff is not None and not np.any(diff):
        return 1.0
    below, above = int((resampled_means <= 0).sum()), int((resampled_means >= 0).sum())
    return min(1.0, 2 * (min(below, above) + 1) / (len(resampled_means) + 1))


def verdict(
    diff: Estimate, name_a: str, name_b: str, metric: str, higher_is_better: bool = True, fmt: str = "{:+.3f}"
) -> str:
    """One line a reader can act on: "model beats ridge on group top-1 by +0.031 [0.012, 0.049]
    (p=0.002)", or "no significant difference ..." when the interval holds 0."""
    ci = f"{fmt.format(diff.value)} [{fmt.format(diff.low)}, {fmt.format(diff.high)}] (p={diff.p_value:.3g})"
    if not diff.excludes_zero():
        return f"no significant difference between {name_a} and {name_b} on {metric}: {ci}"
    word = "beats" if (diff.value > 0) == higher_is_better else "trails"
    return f"{name_a} {word} {name_b} on {metric} by {ci}"
