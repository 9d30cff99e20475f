"""The embed stage's core: read and validate the pairs, split them, embed every distinct text once."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from pipeline.core.atomic import DiskFull, disk_full_error, is_disk_full
from pipeline.core.errors import DatasetError, ShardError
from pipeline.core.paths import REPO_ROOT, repo_path
from pipeline.data.input_limits import InputLimits
from pipeline.data.readers.checks import content_id
from pipeline.data.readers.dataset import drop_duplicate_pairs, read_dataset
from pipeline.data.shard_writer import shard_ranges
from pipeline.data.shards import KINDS
from pipeline.data.split import assign_splits
from pipeline.embed.cache import EmbeddingCache, embed_distinct, text_key

log = logging.getLogger(__name__)
# A test split smaller than this still works, but its metrics are too noisy to compare runs by.
FEW_TEST_ROWS = 30
REQUIRED_SPLITS = ("train", "val", "test")  # train trains, val guides training, evaluate scores test


@dataclass
class PreparedPairs:
    frame: pd.DataFrame  # id, input_text, target_text, split
    stats: dict = field(default_factory=dict)
    files: list = field(default_factory=list)  # the dataset's files, in reading order


def prepare_pairs(embed_cfg, allow_external_paths: bool = False) -> PreparedPairs:
    """Read, validate, de-duplicate, optionally subsample, and split. Raises DatasetError.
    Every file read must lie inside the project (symlinks and `..` followed, each glob match
    judged) unless `allow_external_paths` (run.allow_external_paths)."""
    df = read_dataset(
        dataset_spec(embed_cfg.dataset),
        embed_cfg.input_field,
        embed_cfg.target_field,
        embed_cfg.id_field or None,
        embed_cfg.format,
        skip_empty=embed_cfg.empty_text == "skip",
        delimiter=embed_cfg.delimiter,
        allowed_root=None if allow_external_paths else REPO_ROOT,
        group_field=embed_cfg.group_field or None,
        limits=InputLimits.of(embed_cfg),
    )
    skipped_empty = int(df.attrs.get("rows_skipped_empty", 0))
    files = list(df.attrs.get("files", []))
    skipped = list(df.attrs.get("files_skipped", []))
    if skipped:
        # Read the supported files, and say which others were there: a .txt of pairs renamed by
        # mistake must not vanish silently.
        listing = "; ".join(f"{Path(p).name} ({why})" for p, why in skipped)
        log.warning("read %d file(s) of %s; skipped %d: %s", len(files), embed_cfg.dataset, len(skipped), listing)
    rows_read = len(df) + skipped_empty
    n_dup = int(df.duplicated(subset=["input_text", "target_text"]).sum())
    if embed_cfg.drop_duplicates:
        df, _ = drop_duplicate_pairs(df)
    elif not embed_cfg.id_field and n_dup:  # null or "": no id column
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
    stats = {
        "files": len(files),
        "files_skipped": len(skipped),
        "rows_read": rows_read,
        "rows_skipped_empty": skipped_empty,
        "duplicate_pairs": n_dup,
        "duplicates_dropped": n_dup if embed_cfg.drop_duplicates else 0,
        "rows_used": len(df),
        **{f"rows_{s}": int(counts.get(s, 0)) for s in embed_cfg.splits},
    }
    check_usable(df, stats, embed_cfg, files)
    return PreparedPairs(df, stats, files)


def check_usable(df: pd.DataFrame, stats: dict, embed_cfg, files: list) -> None:
    """Data that parses but cannot train and evaluate a model stops here, before the teacher
    loads: a split with no rows (evaluate would write an empty metrics file), or every input or
    every target the same text (a constant to learn, one candidate to retrieve)."""
    source = str(files[0]) if len(files) == 1 else f"{len(files)} files of embed.dataset = {embed_cfg.dataset!r}"
    used, dropped, skipped = stats["rows_used"], stats["duplicates_dropped"], stats["rows_skipped_empty"]
    how = f"{used} row{'' if used == 1 else 's'} used of {stats['rows_read']} read from {source}"
    how += f", {dropped} repeated (input, target) pairs dropped" if dropped else ""
    how += f", {skipped} with empty text skipped" if skipped else ""
    for split in REQUIRED_SPLITS:
        n, frac = stats.get(f"rows_{split}", 0), float(embed_cfg.splits.get(split, 0))
        if n == 0:
            need = math.ceil(1 / frac) if frac > 0 else 0
            raise DatasetError(
                f"split '{split}' has 0 rows ({how}; embed.splits.{split} = {frac:g}): train and evaluate need rows in "
                f"train, val and test. Add rows (a {frac:g} share needs about {need} or more rows to hold one), "
                f"or raise embed.splits.{split}"
                + (", or set embed.drop_duplicates=false if the repeats are meant" if dropped else "")
            )
    for column, key in (("target_text", "embed.target_field"), ("input_text", "embed.input_field")):
        distinct = df[column].nunique()
        if distinct < 2:
            text = df[column].iloc[0]
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise DatasetError(
                f"every one of the {len(df)} rows has the same {column.split('_')[0]} text ({shown!r}; {how}): a model "
                f"cannot learn or be scored on one text; expected at least 2 distinct texts in the column "
                f"{key} = {embed_cfg[key.split('.')[1]]!r} names (is it the right column?)"
            )
    if stats.get("rows_test", 0) < FEW_TEST_ROWS:
        log.warning(
            "the test split has only %d rows (%s): its metrics will vary a lot between datasets and seeds",
            stats.get("rows_test", 0),
            how,
        )


def dataset_spec(spec: str):
    """embed.dataset as read_dataset takes it: a file or directory resolved from the repository
    root, or a glob pattern kept as given."""
    return spec if any(c in str(spec) for c in "*?[") else repo_path(spec)


def embed_texts_once(
    encode, texts_a: list[str], texts_b: list[str], cache: EmbeddingCache | None = None
) -> tuple[np.ndarray, np.ndarray, int, dict]:
    """Embed the union of both lists once (inputs and targets share texts: a fact's answer is
    repeated across its question phrasings), reusing the cache's vectors where it has them; return
    rows for each list, the distinct count and {"cached": n, "embedded": m}."""
    rows, stats = embed_rows([*texts_a, *texts_b], encode, cache)
    return rows[: len(texts_a)], rows[len(texts_a) :], stats["distinct"], stats


def embed_rows(texts: list[str], encode, cache: EmbeddingCache | None) -> tuple[np.ndarray, dict]:
    """One vector per text, each distinct text embedded (or read from the cache) once; stats
    {"distinct", "cached", "embedded"}."""
    distinct = list(dict.fromkeys(texts))
    index = {t: i for i, t in enumerate(distinct)}
    with _writing_cache(cache):
        vectors, stats = embed_distinct(distinct, encode, cache)
    rows = vectors[np.fromiter((index[t] for t in texts), dtype=np.int64, count=len(texts))]
    return rows, {"distinct": len(distinct), **stats}


@contextlib.contextmanager
def _writing_cache(cache):
    """A full disk while the embedding cache adds a part is named as the cache's: it happens while a
    shard is being made, and may be on another disk than the shards."""
    try:
        yield
    except Exception as e:
        if isinstance(e, DiskFull) or not is_disk_full(e) or not hasattr(cache, "dir"):
            raise
        raise disk_full_error(
            cache.dir,
            e,
            "the cache keeps the parts it had (each is added whole or not at all)",
            'set embed.cache_dir to another disk ("" keeps it in $TMPDIR)',
        ) from e


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


# --------------------------------------------------------------------------- split across ranks
#
# N processes give one process's bits only if they make its encode calls (pipeline/embed/ranks.py):
# every rank plans them (plan_encodes), the ranks share out their chunks (embed_share), and then
# every rank writes its shards from the cache alone.


class _KnownKeys:
    """The cache as the plan sees it: which keys it holds, and zero-width vectors."""

    def __init__(self, keys: Iterable[bytes]):
        self.keys = set(keys)

    def get(self, keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        found = np.fromiter((k in self.keys for k in keys), dtype=bool, count=len(keys))
        return found, np.zeros((len(keys), 0), dtype=np.float32)

    def put(self, keys: Iterable[bytes], vectors: np.ndarray) -> None:
        self.keys.update(keys)


def shard_reads(columns: dict[str, tuple[list[str], list[str]]], rows_per_shard: int) -> Iterator[list[str]]:
    """The texts of each read write_shards makes of a split's (inputs, targets), in its order:
    split by split, shard by shard, inputs then targets (KINDS)."""
    for inputs, targets in columns.values():
        arrays = dict(zip(("inputs", "targets"), (inputs, targets)))
        for start, stop in shard_ranges(len(inputs), rows_per_shard):
            for kind in KINDS:
                yield arrays[kind][start:stop]


def plan_encodes(reads: Iterable[list[str]], cached: Iterable[bytes]) -> tuple[list[list[str]], dict]:
    """The encode() calls, in order, that one process makes for these reads (lists of texts, in
    the order write_shards reads them) with a cache holding the keys `cached`, and its stats
    {"cached", "embedded"}. The reads go through embed_rows itself, so the plan is what
    StreamedEmbeddings would do; vectors are zero-width, so a read costs no memory."""
    calls: list[list[str]] = []
    stats = {"cached": 0, "embedded": 0}

    def record(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.zeros((len(texts), 0), dtype=np.float32)

    known = _KnownKeys(cached)
    for texts in reads:
        _, s = embed_rows(texts, record, known)
        for k in stats:
            stats[k] += s[k]
    return calls, stats


def plan_digest(calls: list[list[str]]) -> int:
    """A 63-bit digest of a plan: ranks compare theirs before encoding."""
    h = hashlib.sha256()
    for texts in calls:
        for t in texts:
            h.update(text_key(t))
        h.update(b"\0")
    return int.from_bytes(h.digest()[:8], "big") >> 1


def share_work(weights: list[int], world: int) -> list[int]:
    """A rank for each unit of work: heaviest first, each to the least loaded rank so far (ties to
    the lower unit index and the lower rank), so every rank computes the same answer."""
    load = [0] * world
    owner = [0] * len(weights)
    for u in sorted(range(len(weights)), key=lambda u: (-weights[u], u)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[u] = r
        load[r] += weights[u]
    return owner


def embed_share(
    calls: list[list[str]],
    chunks,
    encode,
    cache: EmbeddingCache,
    rank: int,
    world: int,
    progress: bool = False,
    flush_rows: int = 65536,
) -> dict:
    """Encode this rank's share of the planned calls into the cache. The unit of work is one chunk
    of one call (`chunks(texts)` -> index arrays, `encode(texts)` -> vectors: the teacher's
    encode_chunks and encode_chunk), weighted by its characters; every text of the plan is
    encoded by exactly one rank, in the chunk one process would encode it in. Vectors go to the
    cache a part per `flush_rows` rows (100 MB at dim 384), so a rank holds no more than that.
    Returns {"chunks", "texts"} done here."""
    from tqdm.auto import tqdm

    units = [(k, idx) for k, texts in enumerate(calls) for idx in chunks(texts)]
    owner = share_work([sum(len(calls[k][i]) for i in idx) for k, idx in units], world)
    mine = [u for u, r in zip(units, owner) if r == rank]
    keys: list[bytes] = []
    vectors: list[np.ndarray] = []
    total = sum(len(idx) for _, idx in mine)
    with tqdm(total=total, unit="text", desc="embed", disable=not progress, mininterval=1.0) as bar:
        for k, idx in mine:
            texts = [calls[k][i] for i in idx]
            vectors.append(encode(texts))
            keys.extend(text_key(t) for t in texts)
            bar.update(len(texts))
            if len(keys) >= flush_rows:
                with _writing_cache(cache):
                    cache.put(keys, np.concatenate(vectors))
                keys, vectors = [], []
        if keys:
            with _writing_cache(cache):
                cache.put(keys, np.concatenate(vectors))
    return {"chunks": len(mine), "texts": total}


def cache_only(texts: list[str]) -> np.ndarray:
    """The encode of a rank writing shards after embed_share: every text is in the cache by then,
    so a call means the plan missed one."""
    raise ShardError(
        f"{len(texts)} texts (e.g. {texts[0][:60]!r}) were not in the embedding cache after the ranks "
        "embedded their share: the ranks' plan differs from the shards read"
    )
