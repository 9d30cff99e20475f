"""Shards with random vectors, written by the real write_shards: what a stage finds in
embed.out_dir, for tests that need shards but not a teacher."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.data.shard_writer import write_shards


def fake_shards(out: Path, dim: int = 16, rows: tuple[int, int, int] = (40, 8, 8)) -> dict:
    """train / val / test with `rows` rows of `dim`-d vectors (seeded by dim); the manifest."""
    rng = np.random.default_rng(dim)
    splits = {}
    for name, n in zip(("train", "val", "test"), rows):
        frame = pd.DataFrame(
            {
                "id": [f"{name}{i}" for i in range(n)],
                "input_text": [f"q {name} {i}" for i in range(n)],
                "target_text": [f"a {name} {i}" for i in range(n)],
            }
        )
        splits[name] = (
            frame,
            rng.standard_normal((n, dim)).astype(np.float32),
            rng.standard_normal((n, dim)).astype(np.float32),
        )
    return write_shards(out, splits, {"name": "tiny-teacher", "dim": dim})
