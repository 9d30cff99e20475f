"""embed: read the text-pair dataset, validate and split it, embed inputs and targets with the
sentence-transformers teacher, and write Parquet + memory-mappable .npy shards and manifest.json.

With embed.nproc=N (or under torchrun) N processes share the work and write what one process
writes, byte for byte (pipeline/embed/ranks.py says how). A vector does not depend on how many
processes share the work: every rank runs the portable numerics' fixed thread count
(pipeline/core/numerics.py; natively, MKL's strict mode makes the products independent of the
thread count). Only rank 0 logs to MLflow and prints; a failed rank leaves no shard directory.
Every rank must see the same filesystem (one machine, or a shared one)."""

from __future__ import annotations

if __name__ == "__main__":  # run as a stage: before the imports below (stages/startup.py says why)
    from stages import startup

    startup.begin()

import contextlib
import logging
import os
import sys
import time

import torch

from pipeline.core import distributed, numerics, resources
from pipeline.core.config import flatten
from pipeline.core.paths import repo_path
from pipeline.core.preflight import check_memory
from pipeline.data.shards import dataset_digest, sha256_file
from pipeline.embed.embedding import prepare_pairs
from pipeline.embed.memory import teacher_need
from pipeline.embed.ranks import STRICT_GEMM, embed_splits, pin_rank_threads
from pipeline.embed.teacher import load_teacher, teacher_identity, truncated
from pipeline.tracking import store as tracking
from pipeline.tracking.datasets import log_dataset
from pipeline.tracking.provenance import device_tags

from ._cli import run_stage

log = logging.getLogger(__name__)


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
            pin_rank_threads(place, device)
        return _embed(cfg, prepared, teacher, place)


def _embed(cfg, prepared, teacher, place: distributed.Dist) -> dict:
    e, df, main = cfg.embed, prepared.frame, place.is_main
    ident = teacher_identity(e.teacher, teacher)
    tracked = contextlib.nullcontext()
    if main:
        source_sha = dataset_digest(prepared.files)
        distinct = list(dict.fromkeys([*df.input_text, *df.target_text]))
        n_distinct = len(distinct)
        n_truncated = int(truncated(teacher, distinct).sum())
        if n_truncated:
            log.warning(
                "%d distinct texts are longer than the teacher's window of %d tokens: each is embedded "
                "from its first %d tokens only (data/texts_truncated)",
                n_truncated,
                teacher.max_seq_length,
                teacher.max_seq_length,
            )
        tags = {
            "stage": "embed",
            "dataset.sha256": source_sha[:16],
            **tracking.overrides_tag(cfg),
            **device_tags(teacher.device),
        }
        experiment = tracking.embed_experiment(cfg.run.experiment)  # not among the model runs (store.py)
        tracked = tracking.mlflow_run(tracking.run_name(cfg), cfg.run.preset, experiment, tags=tags, stage="embed")
    with tracked as run:
        extra = None
        if main:
            tracking.log_params({k: v for k, v in flatten(cfg).items() if k.startswith(("embed.", "run."))})
            log_dataset(
                df,
                source=str(e.dataset),
                digest=source_sha[:16],
                context="embed",
                tags={"files": str(len(prepared.files)), "rows": str(len(df))},
            )
            # No run id in the manifest: identical runs write identical shards and manifest (and
            # DVC hashes); runs/embed.json and the run's tag link them.
            extra = {
                "source": {"path": e.dataset, "sha256": source_sha},
                "stats": {**prepared.stats, "distinct_texts": n_distinct, "texts_truncated": n_truncated},
            }
        t0 = time.perf_counter()
        cols = ["id", "input_text", "target_text", "group"]
        splits = {name: df.loc[(df.split == name).to_numpy(), cols].reset_index(drop=True) for name in e.splits}
        manifest, cache_stats = embed_splits(e, splits, teacher, ident, extra, place)
        seconds = time.perf_counter() - t0  # embedding and writing the shards: they interleave
        if main:
            # Each distinct text is embedded at most once (then it is in the cache); the reads from the
            # cache count a text once per shard it is in, so "from the cache" is the distinct rest.
            embedded = cache_stats.get("embedded", 0)
            cached = max(n_distinct - embedded, 0)
            tracking.log_metrics(
                {
                    **{f"data/{k}": v for k, v in prepared.stats.items()},
                    "data/distinct_texts": n_distinct,
                    "data/texts_truncated": n_truncated,
                    "data/texts_cached": cached,
                    "data/texts_embedded": embedded,
                    "perf/embed_seconds": seconds,
                    "perf/texts_per_s": n_distinct / seconds if seconds else 0.0,
                }
            )
            manifest_path = repo_path(e.out_dir) / "manifest.json"
            tracking.log_artifact_file(manifest_path)
            manifest_sha = sha256_file(manifest_path)
            tracking.set_tags({"embed.manifest_sha256": manifest_sha})
            tracking.write_run_file(
                "embed",
                {
                    "run_id": run.info.run_id,
                    "experiment_id": run.info.experiment_id,
                    "tracking_uri": tracking.tracking_uri(),
                    "manifest_sha256": manifest_sha,
                },
            )
    if main:
        log.info(
            "%d distinct texts: %d read from the cache, %d embedded, in %.1f s (%.0f texts/s) -> %s",
            n_distinct,
            cached,
            embedded,
            seconds,
            n_distinct / max(seconds, 1e-9),
            e.out_dir,
        )
    return manifest


def costs(cfg, processes: int) -> None:
    """Before any work and before the ranks start: processes x one process's need (the teacher
    and a batch, pipeline/embed/memory.py) must fit this node's memory."""
    held = resources.rss_mb()
    need = teacher_need(cfg.embed, held)
    if need is not None:
        # One process: this one, already holding its baseline. Several: each rank is a new process
        # with its own baseline, and the launcher keeps what it holds.
        check_memory(need, processes, held_mb=held if processes == 1 else 0.0)


def main(argv: list[str] | None = None) -> int:
    return run_stage("embed", __doc__, "embed, run", run, argv, nproc_key="embed.nproc", costs=costs)


if __name__ == "__main__":
    # Before the first matrix product, which is when MKL reads it (setting it later has no effect).
    if not numerics.pinned():
        os.environ.setdefault(*STRICT_GEMM)
    sys.exit(main())
