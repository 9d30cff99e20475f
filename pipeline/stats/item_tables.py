"""The evaluate stage's item table on disk: one row per test item (pipeline/evaluate/retrieval.py:
item_table), and in the parquet file's own metadata what the table came from, so that a table
compared on its own (a file, a git revision, a DVC experiment) knows as much as an MLflow run:

    preset  the preset the run was composed from (run.preset)
    arm     the run's arm (pipeline/core/arm.py): digest and readable name; runs of one arm are
            replicates, differing only in their seed
    seed    the training seed (run.seed) the model was trained with
    data    the shards' content digest (arm.data_digest): which test items, which teacher
    baselines  the trained baselines whose replicates the table holds (mlp: its arm, a name, its
            seeds; columns mlp.<seed>_rank, ...)

Nothing run-specific (no run id, no time): identical runs write identical files.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

META_KEY = b"energy_flow"
META_FORMAT = 1


@dataclass(frozen=True)
class TableMeta:
    preset: str
    arm_digest: str
    arm_name: str
    seed: int
    data: str
    baselines: dict = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "format": META_FORMAT,
            "preset": self.preset,
            "arm": {"digest": self.arm_digest, "name": self.arm_name},
            "seed": self.seed,
            "data": self.data,
        }
        return {**out, "baselines": self.baselines} if self.baselines else out

    @classmethod
    def from_dict(cls, d: dict) -> TableMeta:
        baselines = {
            str(name): {"arm": str(b["arm"]), "name": str(b.get("name", name)), "seeds": [int(s) for s in b["seeds"]]}
            for name, b in (d.get("baselines") or {}).items()
        }
        return cls(
            str(d["preset"]), str(d["arm"]["digest"]), str(d["arm"]["name"]), int(d["seed"]), str(d["data"]), baselines
        )


def replicate_predictor(name: str, seed: int) -> str:
    """The item table's predictor name of a trained baseline's replicate: `mlp.3` for seed 3 (its
    columns mlp.3_rank, mlp.3_group_rank, ...)."""
    return f"{name}.{int(seed)}"


def write_items(table: pd.DataFrame, path: str | Path, meta: TableMeta) -> None:
    """`table` as parquet at `path` (the caller makes it atomic), with `meta` in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pa.Table.from_pandas(table, preserve_index=False)
    old = arrow.schema.metadata or {}
    arrow = arrow.replace_schema_metadata({**old, META_KEY: json.dumps(meta.as_dict(), sort_keys=True).encode()})
    pq.write_table(arrow, path)


def read_items(source: str | Path | bytes) -> tuple[pd.DataFrame, TableMeta | None]:
    """(table, metadata) of an item-table file or its bytes; metadata None for a table written
    before it was recorded, or by something else. Raises what pyarrow raises for a bad file."""
    import pyarrow.parquet as pq

    arrow = pq.read_table(io.BytesIO(source) if isinstance(source, bytes) else source)
    raw = (arrow.schema.metadata or {}).get(META_KEY)
    meta = None
    if raw is not None:
        try:
            meta = TableMeta.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            meta = None  # written by another version: the table is still usable, its origin unknown
    return arrow.to_pandas(), meta
