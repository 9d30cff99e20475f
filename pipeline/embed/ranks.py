"""Embedding with several processes (embed.nproc=N, or under torchrun) that write what one process
writes, byte for byte.

A text's vector depends on the texts encoded with it (~1.5e-7, pipeline/embed/cache.py), so every
rank first plans the encode calls one process would make (shard by shard, inputs then targets, the
texts not cached yet), then encodes its share of their chunks into the embedding cache (a
temporary one with embed.cache_dir=""); after a barrier each rank writes its share of the shard
files from the cache, and rank 0 writes the texts and the manifest and swaps the directory in.
With one process the vectors are made shard by shard as the shards are written. Every rank must
see the same filesystem (one machine, or a shared one)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from pipeline.core import distributed, numerics
from pipeline.core.errors import PipelineError
from pipeline.core.output_dirs import EMBEDDING_CACHE, claim
from pipeline.core.paths import repo_path
from pipeline.data.shard_writer import write_shards
from pipeline.embed.cache import EmbeddingCache
from pipeline.embed.embedding import StreamedEmbeddings, cache_only, embed_share, plan_digest, plan_encodes, shard_reads
from pipeline.embed.teacher import encode_chunk, encode_chunks, encode_texts

log = logging.getLogger(__name__)

# A text's vector must not depend on the threads encoding it (2 ranks of 1 thread must write what 1
# process of 2 writes). Under the portable numerics (the default) the thread count is fixed, as
# MKL's COMPATIBLE branch has no strict mode; natively it is MKL's strict CNR mode, whose products
# give the same bits whatever the number of threads (without either, some smoke texts differed
# in the last bits with 1 and 2 threads, first in a BERT layer's output Linear; strict mode's cost
# was lost in timing noise). Set only for `python -m stages.embed` (DVC, torchrun's ranks), as MKL
# reads it at its first product; a value set by the user is kept.
STRICT_GEMM = ("MKL_CBWR", "AUTO,STRICT")


def pin_rank_threads(place: distributed.Dist, device: str) -> None:
    """Each rank gets the portable numerics' fixed thread count, or natively its share of the
    cores: the vectors do not depend on it (see STRICT_GEMM)."""
    torch.set_num_threads(distributed.threads_per_process(0, place))
    if (
        place.is_main
        and torch.device(device).type == "cpu"
        and not torch.backends.mkl.is_available()
        and not numerics.pinned()
    ):
        log.warning(
            "this torch has no MKL (whose strict mode makes products independent of the thread "
            "count): a few vectors may differ from one process's by ~1e-7"
        )


def embed_splits(
    e, splits: dict, teacher, ident: dict, extra: dict | None, place: distributed.Dist
) -> tuple[dict, dict]:
    """Embed every split's inputs and targets and write the shards under e.out_dir (rank 0's
    manifest and the cache's counts: cached, embedded), in one process or shared by the ranks."""
    with shared_cache(e.cache_dir, ident, place) as cache:
        if place.enabled:
            return embed_across_ranks(e, splits, teacher, cache, ident, extra, place)
        return embed_streamed(e, splits, teacher, cache, ident, extra)


@contextlib.contextmanager
def shared_cache(cache_dir: str, ident: dict, place: distributed.Dist) -> Iterator[EmbeddingCache]:
    """The embedding cache; with embed.cache_dir="" one in a temporary directory, which still dedups
    within the run (and, with several ranks, carries the vectors from the rank that made them to
    the one writing their shard: rank 0 makes it and removes it, after every rank is done).
    Its vectors are keyed by the teacher and by the numerics this process runs under."""
    ident = {**ident, "numerics": numerics.vectors_tag()}
    if cache_dir:
        root = repo_path(cache_dir)
        if place.is_main:
            claim(root, EMBEDDING_CACHE, "embed.cache_dir")  # checked before any work; made and marked now
        yield EmbeddingCache(root, ident)
        return
    scratch = tempfile.mkdtemp(prefix="embed-cache-") if place.is_main else ""
    try:
        root = place.broadcast_text(scratch)
        if not Path(root).is_dir():
            raise PipelineError(
                f"{root}: rank 0's temporary embedding cache is not visible to rank {place.rank}; "
                "set embed.cache_dir to a directory every rank shares"
            )
        yield EmbeddingCache(root, ident)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def embed_streamed(e, splits: dict, teacher, cache: EmbeddingCache, ident: dict, extra: dict) -> tuple[dict, dict]:
    """One process: vectors are made shard by shard as write_shards reads them (StreamedEmbeddings);
    the cache dedups texts across shards and runs."""
    encode = lambda texts: encode_texts(teacher, texts, e.batch_size)  # noqa: E731
    stats: dict = {}
    arrays = {}
    for name, part in splits.items():
        texts = (part.input_text.tolist(), part.target_text.tolist())
        arrays[name] = (part, *(StreamedEmbeddings(t, encode, cache, ident["dim"], stats) for t in texts))
    manifest = write_shards(
        repo_path(e.out_dir), arrays, ident, rows_per_shard=e.rows_per_shard, dtype=e.dtype, extra=extra
    )
    return manifest, stats


def embed_across_ranks(
    e, splits: dict, teacher, cache: EmbeddingCache, ident: dict, extra: dict | None, place: distributed.Dist
) -> tuple[dict, dict]:
    """One rank of several: plan one process's encode calls, encode this rank's share of them into
    the cache, then write this rank's share of the shards from the cache (see the module doc)."""
    columns = {name: (part.input_text.tolist(), part.target_text.tolist()) for name, part in splits.items()}
    calls, stats = plan_encodes(shard_reads(columns, e.rows_per_shard), cache.keys())
    # Every rank must plan the same calls: compare digests (max == min). This collective is also
    # the barrier that keeps a rank from adding to the cache before every rank has read it.
    digest = plan_digest(calls)
    spread = place.all_reduce(torch.tensor([digest, -digest], dtype=torch.int64, device=teacher.device), "max")
    if int(spread[0]) != -int(spread[1]):
        raise PipelineError(
            "the ranks planned different encode calls: they read different data or embedding "
            f"caches (embed.dataset={e.dataset}, embed.cache_dir={e.cache_dir!r})"
        )
    done = embed_share(
        calls,
        lambda texts: encode_chunks(texts, e.batch_size),
        lambda texts: encode_chunk(teacher, texts, e.batch_size),
        cache,
        place.rank,
        place.world_size,
        progress=place.is_main,
    )
    log.info(
        "%d encode calls shared by %d processes: this one embedded %d texts in %d chunks",
        len(calls),
        place.world_size,
        done["texts"],
        done["chunks"],
    )
    place.barrier()  # every vector is in the cache
    cache.reload()  # the parts the other ranks added
    arrays = {
        name: (part, *(StreamedEmbeddings(texts, cache_only, cache, ident["dim"], {}) for texts in columns[name]))
        for name, part in splits.items()
    }
    manifest = write_shards(
        repo_path(e.out_dir), arrays, ident, rows_per_shard=e.rows_per_shard, dtype=e.dtype, extra=extra, place=place
    )
    return manifest, stats
