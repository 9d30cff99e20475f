"""embed: read the text-pair dataset, validate and split it, embed inputs and targets with the
sentence-transformers teacher, and write Parquet + memory-mappable .npy shards and manifest.json.

With embed.nproc=N (or under torchrun) N processes share the work and write what one process
writes, byte for byte. A text's vector depends on the texts encoded
with it, so every rank first plans the encode calls one process would make (shard by shard,
inputs then targets, the texts not cached yet), then encodes its share of their chunks into the
embedding cache (a temporary one with embed.cache_dir=""); after a barrier each rank writes its
share of the shard files from the cache, and rank 0 writes the texts and the manifest and swaps
the directory in. A vector does not depend on how many processes share the work: every rank
runs the portable numerics' fixed thread count (pipeline/numerics.py; natively, MKL's strict
mode makes the products independent of the thread count). Only rank 0 logs to MLflow and
prints; a failed rank leaves no shard directory. Every rank must see the same filesystem (one
machine, or a shared one)."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from pipeline import distributed, numerics, tracking
from pipeline.config import flatten
from pipeline.data.shards import dataset_digest, sha256_file, write_shards
from pipeline.embed_cache import EmbeddingCache
from pipeline.embedding import (StreamedEmbeddings, cache_only, embed_share, plan_digest, plan_encodes,
                                prepare_pairs, shard_reads)
from pipeline.errors import PipelineError
from pipeline.output_dirs import EMBEDDING_CACHE, claim
from pipeline.paths import repo_path
from pipeline.teacher import count_truncated, encode_chunk, encode_chunks, encode_texts, load_teacher, teacher_identity

from ._cli import run_stage

log = logging.getLogger(__name__)

# A text's vector must not depend on the threads encoding it (2 ranks of 1 thread must write what 1
# process of 2 writes). Under the portable numerics (pipeline/numerics.py, the default) that holds
# because the thread count is fixed (OMP_NUM_THREADS, 1 unless set; every rank too): MKL's
# COMPATIBLE branch, the one that gives the same bits on Intel and AMD, has no strict mode, and
# its products do depend on the thread count. Natively (ENERGY_FLOW_NUMERICS=native) it is MKL's
# strict CNR mode instead: every product gives the same bits whatever the number of threads.
# Without either, 15 of the smoke preset's 1,135 texts (a batch of 15 in a call of 79) came out
# ~1.4e-7 apart with 1 and 2 threads (the first difference: a BERT layer's output Linear, where
# MKL splits the 1536-long sums by thread). Strict mode's cost was not measurable (2 threads: 1.50
# vs 1.49 s for those texts; 1 thread: 2.64 vs 2.62 s). Set only for `python -m stages.embed`
# (DVC, torchrun's ranks), as MKL reads it at its first product (set later, it has no effect); a
# value set by the user is kept.
STRICT_GEMM = ("MKL_CBWR", "AUTO,STRICT")


def run(cfg) -> dict:
    e = cfg.embed
    wanted = distributed.available_device("embed.device", e.device)  # before any work
    # Validation first: a bad dataset fails before any heavy work.
    prepared = prepare_pairs(e, cfg.run.allow_external_paths)
    log.info("%d pairs read from %s (%s)", len(prepared.frame), e.dataset, prepared.stats)
    place = distributed.from_env()
    if not place.is_main:
        import transformers

        transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar: rank 0's is enough
    device = distributed.device_for(wanted, place)  # cuda: one GPU per rank
    teacher = load_teacher(e.teacher, device)  # a teacher that cannot load fails before the ranks meet
    with distributed.process_group(torch.device(device)) as place:
        if place.enabled:
            # Each rank gets the portable numerics' fixed count, or natively its share of the cores:
            # the vectors do not depend on it (see STRICT_GEMM).
            torch.set_num_threads(distributed.threads_per_process(0, place))
            if (place.is_main and torch.device(device).type == "cpu" and not torch.backends.mkl.is_available()
                    and not numerics.pinned()):
                log.warning("this torch has no MKL (whose strict mode makes products independent of the thread "
                            "count): a few vectors may differ from one process's by ~1e-7")
        return _embed(cfg, prepared, teacher, place)


def _embed(cfg, prepared, teacher, place: distributed.Dist) -> dict:
    e, df, main = cfg.embed, prepared.frame, place.is_main
    ident = teacher_identity(e.teacher, teacher)
    if main:
        source_sha = dataset_digest(prepared.files)
        distinct = list(dict.fromkeys([*df.input_text, *df.target_text]))
        n_distinct = len(distinct)
        n_truncated = count_truncated(teacher, distinct)
        if n_truncated:
            log.warning("%d distinct texts are longer than the teacher's window of %d tokens: each is embedded "
                        "from its first %d tokens only (data/texts_truncated)", n_truncated,
                        teacher.max_seq_length, teacher.max_seq_length)
    tracked = tracking.mlflow_run(tracking.run_name("embed"), cfg.run.preset, cfg.run.experiment,
                                  tags={"stage": "embed", "dataset.sha256": source_sha[:16],
                                        **tracking.device_tags(teacher.device)}) if main else contextlib.nullcontext()
    with tracked as run:
        extra = None
        if main:
            tracking.log_params({k: v for k, v in flatten(cfg).items() if k.startswith(("embed.", "run."))})
            tracking.log_dataset(df, source=str(e.dataset), digest=source_sha[:16], context="embed",
                                 tags={"files": str(len(prepared.files)), "rows": str(len(df))})
            # No run id in the manifest: identical runs write identical shards and manifest (and
            # DVC hashes); runs/embed.json and the run's tag link them.
            extra = {"source": {"path": e.dataset, "sha256": source_sha},
                     "stats": {**prepared.stats, "distinct_texts": n_distinct, "texts_truncated": n_truncated}}
        t0 = time.perf_counter()
        splits = {name: df.loc[(df.split == name).to_numpy(), ["id", "input_text", "target_text", "group"]]
                  .reset_index(drop=True) for name in e.splits}
        with _cache(e.cache_dir, ident, place) as cache:
            if place.enabled:
                manifest, cache_stats = _embed_across_ranks(e, splits, teacher, cache, ident, extra, place)
            else:
                manifest, cache_stats = _embed_streamed(e, splits, teacher, cache, ident, extra)
        seconds = time.perf_counter() - t0  # embedding and writing the shards: they interleave
        if main:
            cached, embedded = cache_stats.get("cached", 0), cache_stats.get("embedded", 0)
            tracking.log_metrics({**{f"data/{k}": v for k, v in prepared.stats.items()},
                                  "data/distinct_texts": n_distinct, "data/texts_truncated": n_truncated,
                                  "data/texts_cached": cached, "data/texts_embedded": embedded,
                                  "perf/embed_seconds": seconds,
                                  "perf/texts_per_s": n_distinct / seconds if seconds else 0.0})
            manifest_path = repo_path(e.out_dir) / "manifest.json"
            tracking.log_artifact_file(manifest_path)
            manifest_sha = sha256_file(manifest_path)
            tracking.set_tags({"embed.manifest_sha256": manifest_sha})
            tracking.write_run_file("embed", {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                                              "tracking_uri": tracking.tracking_uri(),
                                              "manifest_sha256": manifest_sha})
    if main:
        log.info("%d distinct texts: %d read from the cache, %d embedded, in %.1f s (%.0f texts/s) -> %s",
                 n_distinct, cached, embedded, seconds, n_distinct / max(seconds, 1e-9), e.out_dir)
    return manifest


@contextlib.contextmanager
def _cache(cache_dir: str, ident: dict, place: distributed.Dist) -> Iterator[EmbeddingCache]:
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
            raise PipelineError(f"{root}: rank 0's temporary embedding cache is not visible to rank {place.rank}; "
                                "set embed.cache_dir to a directory every rank shares")
        yield EmbeddingCache(root, ident)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _embed_streamed(e, splits: dict, teacher, cache: EmbeddingCache, ident: dict, extra: dict) -> tuple[dict, dict]:
    """One process: vectors are made shard by shard as write_shards reads them (StreamedEmbeddings);
    the cache dedups texts across shards and runs."""
    encode = lambda texts: encode_texts(teacher, texts, e.batch_size)  # noqa: E731
    stats: dict = {}
    arrays = {name: (part, *(StreamedEmbeddings(part[col].tolist(), encode, cache, ident["dim"], stats)
                             for col in ("input_text", "target_text")))
              for name, part in splits.items()}
    manifest = write_shards(repo_path(e.out_dir), arrays, ident, rows_per_shard=e.rows_per_shard, dtype=e.dtype,
                            extra=extra)
    return manifest, stats


def _embed_across_ranks(e, splits: dict, teacher, cache: EmbeddingCache, ident: dict, extra: dict | None,
                        place: distributed.Dist) -> tuple[dict, dict]:
    """One rank of several: plan one process's encode calls, encode this rank's share of them into
    the cache, then write this rank's share of the shards from the cache (see the module doc)."""
    columns = {name: (part.input_text.tolist(), part.target_text.tolist()) for name, part in splits.items()}
    calls, stats = plan_encodes(shard_reads(columns, e.rows_per_shard), cache.keys())
    # Every rank must plan the same calls: compare digests (max == min). This collective is also
    # the barrier that keeps a rank from adding to the cache before every rank has read it.
    digest = plan_digest(calls)
    spread = place.all_reduce(torch.tensor([digest, -digest], dtype=torch.int64, device=teacher.device), "max")
    if int(spread[0]) != -int(spread[1]):
        raise PipelineError("the ranks planned different encode calls: they read different data or embedding "
                            f"caches (embed.dataset={e.dataset}, embed.cache_dir={e.cache_dir!r})")
    done = embed_share(calls, lambda texts: encode_chunks(texts, e.batch_size),
                       lambda texts: encode_chunk(teacher, texts, e.batch_size), cache, place.rank, place.world_size,
                       progress=place.is_main)
    log.info("%d encode calls shared by %d processes: this one embedded %d texts in %d chunks",
             len(calls), place.world_size, done["texts"], done["chunks"])
    place.barrier()  # every vector is in the cache
    cache.reload()  # the parts the other ranks added
    arrays = {name: (part, *(StreamedEmbeddings(texts, cache_only, cache, ident["dim"], {}) for texts in columns[name]))
              for name, part in splits.items()}
    manifest = write_shards(repo_path(e.out_dir), arrays, ident, rows_per_shard=e.rows_per_shard, dtype=e.dtype,
                            extra=extra, place=place)
    return manifest, stats


def main(argv: list[str] | None = None) -> int:
    return run_stage("embed", __doc__, "embed, run", run, argv, nproc_key="embed.nproc")


if __name__ == "__main__":
    # Before the first matrix product, which is when MKL reads it (setting it later has no effect).
    if not numerics.pinned():
        os.environ.setdefault(*STRICT_GEMM)
    sys.exit(main())
