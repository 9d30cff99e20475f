"""Deterministic train/validation/test assignment by content hash.

A row's split depends only on its own content and the salt, never on row order or on the other
rows: adding, removing or reordering rows moves no existing row between splits, so evaluation
numbers stay comparable across dataset versions.
"""

from __future__ import annotations

import hashlib
import math
from typing import Mapping

import numpy as np
import pandas as pd

KEYS = ("pair", "input", "target")
SEP = "\x1f"  # same separator as content ids: "a b"+"c" and "a"+"b c" must hash differently
_TOLERANCE = 1e-6


def _validate(fractions: Mapping[str, float]) -> list[tuple[str, float]]:
    items = [(str(k), v) for k, v in fractions.items()]
    if not items:
        raise ValueError("split fractions are empty; expected e.g. {'train': 0.8, 'val': 0.1, 'test': 0.1}")
    for name, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(
                f"split fraction {name}={v!r} is invalid; expected a finite number >= 0 (fractions: {dict(fractions)})"
            )
    total = sum(float(v) for _, v in items)
    if abs(total - 1.0) > _TOLERANCE:
        raise ValueError(f"split fractions {dict(fractions)} sum to {total:.9g}; expected 1")
    return [(name, float(v)) for name, v in items]


def _content(df: pd.DataFrame, key: str) -> list[str]:
    if key == "pair":
        return [a + SEP + b for a, b in zip(df["input_text"], df["target_text"])]
    return list(df["input_text" if key == "input" else "target_text"])


def hash_unit(salt: str, content: str) -> float:
    """Map (salt, content) to a uniform number in [0, 1) via sha256 (first 8 bytes, big-endian)."""
    digest = hashlib.sha256((salt + SEP + content).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_splits(df: pd.DataFrame, fractions: Mapping[str, float], salt: str = "", key: str = "pair") -> np.ndarray:
    """Return one split name per row (object array), in the order of `df`'s rows.

    key="pair" hashes input and target together; "input" or "target" hashes only that text, so
    every row sharing it lands in the same split (no fact leaks from train into test through a
    rephrased question)."""
    items = _validate(fractions)
    if key not in KEYS:
        raise ValueError(f"split key {key!r} is unknown; expected one of {', '.join(KEYS)}")
    needed = ["input_text", "target_text"] if key == "pair" else [f"{key}_text"]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"cannot split: frame lacks column(s) {missing}; found {list(df.columns)}")

    names = np.array([n for n, _ in items], dtype=object)
    upper = np.cumsum([v for _, v in items])
    u = np.fromiter((hash_unit(salt, c) for c in _content(df, key)), dtype=np.float64, count=len(df))
    # The split whose interval [lower, upper) holds u; zero-width intervals never match.
    idx = np.searchsorted(upper, u, side="right")
    # Fractions may sum to 1 - 1e-6: the sliver above their sum goes to the last non-empty split.
    last = max(i for i, (_, v) in enumerate(items) if v > 0)
    idx = np.minimum(idx, last)
    return names[idx]
