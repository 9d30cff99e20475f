"""The embed stage's core: read and validate the pairs, split them, embed every distinct text once."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .data.readers import content_id, drop_duplicate_pairs, read_dataset
from .data.split import assign_splits
from .embed_cache import EmbeddingCache, embed_distinct
from .paths import repo_path


@dataclass
class PreparedPairs:
    frame: pd.DataFrame  # id, input_text, target_text, split
    stats: dict = field(default_factory=dict)
    files: list = field(default_factory=list)  # the dataset's files, in reading order


def prepare_pairs(embed_cfg) -> PreparedPairs:
    """Read, validate, de-duplicate, optionally subsample, and split. Raises DatasetError."""
    df = read_dataset(dataset_spec(embed_cfg.dataset), embed_cfg.input_field, embed_cfg.target_field, embed_cfg.id_field, embed_cfg.format,
                      skip_empty=embed_cfg.empty_text == "skip")
    skipped_empty = int(df.attrs.get("rows_skipped_empty", 0))
    files = list(df.attrs.get("files", []))
    n_files = len(files)
    rows_read = len(df) + skipped_empty
    n_dup = int(df.duplicated(subset=["input_text", "target_text"]).sum())
    if embed_cfg.drop_duplicates:
        df, _ = drop_duplicate_pairs(df)
    elif embed_cfg.id_field is None and n_dup:
        # Content-hash ids of equal pairs collide: number the repeats (id, id-1, id-2, ...).
        repeat = df.groupby("id").cumcount()
        df = df.assign(id=[i if r == 0 else f"{i}-{r}" for i, r in zip(df["id"], repeat)])
    if embed_cfg.max_rows and len(df) > embed_cfg.max_rows:
        # A content-hashed subset: deterministic, and mixed across the file's topics (the first
        # rows of a file are often one topic).
        key = [content_id(a, b) for a, b in zip(df.input_text, df.target_text)]
        keep = np.sort(np.argsort(np.asarray(key))[: embed_cfg.max_rows])
        df = df.iloc[keep].reset_index(drop=True)
    df = df.assign(split=assign_splits(df, dict(embed_cfg.splits), salt=embed_cfg.split_salt, key=embed_cfg.split_key))
    counts = df.split.value_counts().to_dict()
    stats = {"files": n_files, "rows_read": rows_read, "rows_skipped_empty": skipped_empty,
             "duplicate_pairs": n_dup, "duplicates_dropped": n_dup if embed_cfg.drop_duplicates else 0,
             "rows_used": len(df),
             **{f"rows_{s}": int(counts.get(s, 0)) for s in embed_cfg.splits}}
    return PreparedPairs(df, stats, files)


def dataset_spec(spec: str):
    """embed.dataset as read_dataset takes it: a file or directory resolved from the repository
    root, or a glob pattern kept as given."""
    return spec if any(c in str(spec) for c in "*?[") else repo_path(spec)


def embed_texts_once(encode, texts_a: list[str], texts_b: list[str],
                     cache: EmbeddingCache | None = None) -> tuple[np.ndarray, np.ndarray, int, dict]:
    """Embed the union of both lists once (inputs and targets share texts: a fact's answer is
    repeated across its question phrasings), reusing the cache's vectors where it has them; return
    rows for each list, the distinct count and {"cached": n, "embedded": m}."""
    rows, stats = embed_rows([*texts_a, *texts_b], encode, cache)
    return rows[:len(texts_a)], rows[len(texts_a):], stats["distinct"], stats


def embed_rows(texts: list[str], encode, cache: EmbeddingCache | None) -> tuple[np.ndarray, dict]:
    """One vector per text, each distinct text embedded (or read from the cache) once; stats
    {"distinct", "cached", "embedded"}."""
    distinct = list(dict.fromkeys(texts))
    index = {t: i for i, t in enumerate(distinct)}
    vectors, stats = embed_distinct(distinct, encode, cache)
    rows = vectors[np.fromiter((index[t] for t in texts), dtype=np.int64, count=len(texts))]
    return rows, {"distinct": len(distinct), **stats}


class StreamedEmbeddings:
    """A (len(texts), dim) float32 array whose rows are embedded when a slice of them is read.

    write_shards reads one shard's rows at a time, so the embed stage holds one shard of vectors,
    never the dataset's (1M pairs would be 3 GB). Texts seen before, in any slice or any earlier
    run, come from the cache; `stats` counts both kinds."""

    dtype = np.dtype(np.float32)

    def __init__(self, texts: list[str], encode, cache: EmbeddingCache, dim: int, stats: dict):
        self.texts, self.encode, self.cache, self.stats = texts, encode, cache, stats
        self.shape = (len(texts), int(dim))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError(f"StreamedEmbeddings reads row slices, got {type(key).__name__}")
        rows, stats = embed_rows(self.texts[key], self.encode, self.cache)
        for k in ("cached", "embedded"):
            self.stats[k] = self.stats.get(k, 0) + stats[k]
        return rows
