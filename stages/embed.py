"""embed: read the text-pair dataset, validate and split it, embed inputs and targets with the
sentence-transformers teacher, and write Parquet + memory-mappable .npy shards and manifest.json."""
from __future__ import annotations

import logging
import sys
import tempfile
import time

from pipeline import tracking
from pipeline.config import flatten
from pipeline.data.shards import dataset_digest, write_shards
from pipeline.embed_cache import EmbeddingCache
from pipeline.embedding import StreamedEmbeddings, prepare_pairs
from pipeline.paths import repo_path
from pipeline.teacher import count_truncated, encode_texts, load_teacher, teacher_identity

from ._cli import run_stage

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    e = cfg.embed
    prepared = prepare_pairs(e)  # validation first: a bad dataset fails before any heavy work
    log.info("%d pairs read from %s (%s)", len(prepared.frame), e.dataset, prepared.stats)
    teacher = load_teacher(e.teacher, e.device)
    ident = teacher_identity(e.teacher, teacher)
    source_sha = dataset_digest(prepared.files)
    df = prepared.frame
    distinct = list(dict.fromkeys([*df.input_text, *df.target_text]))
    n_distinct = len(distinct)
    n_truncated = count_truncated(teacher, distinct)
    if n_truncated:
        log.warning("%d distinct texts are longer than the teacher's window of %d tokens: each is embedded from "
                    "its first %d tokens only (data/texts_truncated)", n_truncated, teacher.max_seq_length,
                    teacher.max_seq_length)
    with tracking.mlflow_run(tracking.run_name("embed"), cfg.run.preset, cfg.run.experiment,
                             tags={"stage": "embed", "dataset.sha256": source_sha[:16],
                                   **tracking.device_tags(teacher.device)}) as run:
        tracking.log_params({k: v for k, v in flatten(cfg).items() if k.startswith(("embed.", "run."))})
        tracking.log_dataset(df, source=str(e.dataset), digest=source_sha[:16], context="embed",
                             tags={"files": str(len(prepared.files)), "rows": str(len(df))})
        t0 = time.perf_counter()
        encode = lambda texts: encode_texts(teacher, texts, e.batch_size)  # noqa: E731
        # Vectors are made shard by shard as write_shards reads them (StreamedEmbeddings); the
        # cache dedups texts across shards and runs. With embed.cache_dir="" a cache in a
        # temporary directory still dedups within the run.
        scratch = None if e.cache_dir else tempfile.TemporaryDirectory(prefix="embed-cache-")
        cache = EmbeddingCache(repo_path(e.cache_dir) if e.cache_dir else scratch.name, ident)
        cache_stats: dict = {}
        splits = {}
        for name in e.splits:
            part = df.loc[(df.split == name).to_numpy(), ["id", "input_text", "target_text"]].reset_index(drop=True)
            splits[name] = (part, *(StreamedEmbeddings(part[col].tolist(), encode, cache, ident["dim"], cache_stats)
                                    for col in ("input_text", "target_text")))
        try:
            manifest = write_shards(repo_path(e.out_dir), splits, ident, rows_per_shard=e.rows_per_shard,
                                    dtype=e.dtype, extra={
                                        "source": {"path": e.dataset, "sha256": source_sha},
                                        "stats": {**prepared.stats, "distinct_texts": n_distinct,
                                                  "texts_truncated": n_truncated},
                                        "embed_run_id": run.info.run_id})
        finally:
            if scratch is not None:
                scratch.cleanup()
        seconds = time.perf_counter() - t0  # embedding and writing the shards: they interleave
        cached, embedded = cache_stats.get("cached", 0), cache_stats.get("embedded", 0)
        tracking.log_metrics({**{f"data/{k}": v for k, v in prepared.stats.items()},
                              "data/distinct_texts": n_distinct, "data/texts_truncated": n_truncated,
                              "data/texts_cached": cached, "data/texts_embedded": embedded,
                              "perf/embed_seconds": seconds,
                              "perf/texts_per_s": n_distinct / seconds if seconds else 0.0})
        tracking.log_artifact_file(repo_path(e.out_dir) / "manifest.json")
    log.info("%d distinct texts: %d read from the cache, %d embedded, in %.1f s (%.0f texts/s) -> %s", n_distinct,
             cached, embedded, seconds, n_distinct / max(seconds, 1e-9), e.out_dir)
    return manifest


def main(argv: list[str] | None = None) -> int:
    return run_stage("embed", __doc__, "embed, run", run, argv)


if __name__ == "__main__":
    sys.exit(main())
