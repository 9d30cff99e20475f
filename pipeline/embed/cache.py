"""Content-addressed embedding cache: each distinct text is embedded once per teacher (docs/data.md).

Layout: <root>/<teacher key>/part-<n>.parquet, columns `key` (16-byte binary: the first 128 bits
of the text's UTF-8 sha256) and `embedding` (fixed-size list of float32, the teacher's dim).
Parts are only ever added (written to a temp name, then renamed), so a killed run leaves at most
a stray temp file and never a half-written part. The teacher key hashes what determines the
vectors (_KEY_FIELDS, the numerics included: pipeline/core/numerics.vectors_tag), not the path,
so a cache moves between machines with its model, and a portable run never reuses a native vector.

A cached vector can differ from a fresh encode of the same text by ~1.5e-7, because a text's
batch neighbours change BLAS blocking (bench.data: embed_max_abs_diff, the bundled teacher at two
batch sizes); with the cache, every later run reuses the first vector exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from pipeline.core.errors import ShardError
from pipeline.core.paths import check_readable_inside

KEY_BYTES = 16
# Rows per Parquet row group: a lookup decodes only the groups holding its hits, so reading one
# shard's vectors from a large cache does not decode the whole part (8192 x 384 x 4 B = 12 MiB).
ROW_GROUP = 8192
_KEY_FIELDS = ("name", "dim", "max_seq_length", "config_sha256", "weights_sha256", "numerics")


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()[:KEY_BYTES]


def teacher_key(identity: Mapping) -> str:
    """A short stable id for the teacher's vectors (see the module docstring)."""
    blob = json.dumps({k: identity.get(k) for k in _KEY_FIELDS}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


class EmbeddingCache:
    def __init__(self, root: str | os.PathLike, identity: Mapping):
        self.dim = int(identity["dim"])
        self.dir = Path(root) / teacher_key(identity)
        self._index: dict[bytes, tuple[int, int]] | None = None  # key -> (part number, row)
        self._parts: list[Path] = []

    # ------------------------------------------------------------------ reading
    def _load_index(self) -> dict[bytes, tuple[int, int]]:
        import pyarrow.parquet as pq

        if self._index is not None:
            return self._index
        index: dict[bytes, tuple[int, int]] = {}
        self._parts = sorted(self.dir.glob("part-*.parquet")) if self.dir.is_dir() else []
        for p, path in enumerate(self._parts):
            check_readable_inside(path, "the embedding cache's part (embed.cache_dir)")
            try:
                keys = pq.read_table(path, columns=["key"]).column("key").to_pylist()
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
                raise ShardError(
                    f"embedding cache part {path} is unreadable ({e}): delete it (or the whole "
                    f"{self.dir}) and re-run; it will be rebuilt"
                ) from None
            for row, k in enumerate(keys):
                index.setdefault(k, (p, row))
        self._index = index
        return index

    def __len__(self) -> int:
        return len(self._load_index())

    def keys(self) -> Iterable[bytes]:
        """The keys of the parts read so far (and of those this object added since)."""
        return self._load_index().keys()

    def reload(self) -> None:
        """Re-read the parts at the next lookup: other processes may have added some."""
        self._index, self._parts = None, []

    def get(self, keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, (len(keys), dim) float32 array; rows of missing keys are zero)."""
        import pyarrow.parquet as pq

        index = self._load_index()
        out = np.zeros((len(keys), self.dim), dtype=np.float32)
        found = np.zeros(len(keys), dtype=bool)
        wanted: dict[int, list[tuple[int, int]]] = {}
        for i, k in enumerate(keys):
            hit = index.get(k)
            if hit is not None:
                wanted.setdefault(hit[0], []).append((i, hit[1]))
        for p, pairs in wanted.items():
            dest, rows = (np.asarray(v) for v in zip(*pairs))
            groups = np.unique(rows // ROW_GROUP)
            col = (
                pq.ParquetFile(self._parts[p])
                .read_row_groups(groups.tolist(), columns=["embedding"])
                .column("embedding")
                .combine_chunks()
            )
            vectors = col.values.to_numpy(zero_copy_only=False).reshape(-1, self.dim)
            if vectors.shape[0] != len(col):
                raise ShardError(
                    f"embedding cache part {self._parts[p]} holds vectors of another size than "
                    f"the teacher's {self.dim}: delete it and re-run"
                )
            # Row r of the part is row (position of its group among those read) * ROW_GROUP + r % ROW_GROUP.
            local = np.searchsorted(groups, rows // ROW_GROUP) * ROW_GROUP + rows % ROW_GROUP
            out[dest] = vectors[local]
            found[dest] = True
        return found, out

    # ------------------------------------------------------------------ writing
    def put(self, keys: Iterable[bytes], vectors: np.ndarray) -> Path | None:
        """Add one part with these vectors; None when there is nothing to add."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = list(keys)
        if not keys:
            return None
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(keys), self.dim):
            raise ValueError(f"expected {len(keys)} vectors of dim {self.dim}, got shape {vectors.shape}")
        self.dir.mkdir(parents=True, exist_ok=True)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), self.dim)
        table = pa.table({"key": pa.array(keys, type=pa.binary(KEY_BYTES)), "embedding": emb})
        index = self._load_index()
        dest = self.dir / f"part-{len(self._parts):06d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = dest.with_name(f".{dest.name}.tmp")
        pq.write_table(table, tmp, row_group_size=ROW_GROUP)
        os.replace(tmp, dest)
        # Extend the index in place: the embed stage adds a part per shard, and re-reading every
        # part's keys after each would grow quadratically with the shards.
        p = len(self._parts)
        self._parts.append(dest)
        for row, k in enumerate(keys):
            index.setdefault(k, (p, row))
        return dest


def embed_distinct(texts: list[str], encode, cache: EmbeddingCache | None) -> tuple[np.ndarray, dict]:
    """Vectors for distinct texts: from the cache where present, `encode` for the rest (which are
    then added to the cache). Returns (vectors, {"cached": n, "embedded": m})."""
    if cache is None:
        return encode(texts), {"cached": 0, "embedded": len(texts)}
    keys = [text_key(t) for t in texts]
    found, out = cache.get(keys)
    missing = np.flatnonzero(~found)
    if missing.size:
        fresh = encode([texts[i] for i in missing])
        out[missing] = fresh
        cache.put([keys[i] for i in missing], fresh)
    return out, {"cached": int(found.sum()), "embedded": int(missing.size)}
