"""Datasets as MLflow inputs of a run: the dataset embed read, and the shards train and evaluate
read, linked to the embed run that made them."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from pipeline.tracking.store import enabled

log = logging.getLogger(__name__)


def log_dataset(df, source: str, digest: str, context: str, tags: dict | None = None) -> None:
    """The dataset as an MLflow input of the active run: its schema, row count, source and
    content digest (the UI's Datasets column; runs on the same data share the digest)."""
    if not enabled():
        return
    import mlflow
    import mlflow.data

    name = source.rstrip("/").rsplit("/", 1)[-1] or source
    with warnings.catch_warnings():
        # MLflow 3.17 registers its local-file source class twice and warns that a path "can be
        # interpreted in multiple ways: LocalArtifactDatasetSource, LocalArtifactDatasetSource".
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        dataset = mlflow.data.from_pandas(df, source=source, name=name, digest=digest)
    _log_input(dataset, context, tags)


def dataset_name(manifest: dict, preset: str, shard_dir: Path | str = "") -> str:
    """`qa_pairs.csv · 600 pairs · smoke`: the source file, the pairs the shards hold, and the
    preset of the run that used them, so a smoke run's data and a default run's differ in the
    runs table's Dataset column at a glance (the digest beside it is 16 hex digits)."""
    source = str((manifest.get("source") or {}).get("path") or shard_dir)
    parts = [source.rstrip("/").rsplit("/", 1)[-1]]
    rows = (manifest.get("stats") or {}).get("rows_used")
    if isinstance(rows, int):
        parts.append(f"{rows} pairs")
    if preset:
        parts.append(str(preset))
    return " · ".join(parts)


def shards_dataset(shard_dir: Path, manifest: dict, manifest_sha256: str, preset: str = ""):
    """The embedding shards as an MLflow dataset (no data loaded): named by dataset_name, digest =
    the first 16 hex digits of manifest.json's sha256 (the manifest holds every shard's digest, so
    equal digests mean equal shards; the UI's Dataset column shows it), source = the shard
    directory. None with tracking off."""
    if not enabled():
        return None
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource

    name = dataset_name(manifest, preset, shard_dir)
    return MetaDataset(
        LocalArtifactDatasetSource(str(Path(shard_dir).resolve())), name=name, digest=manifest_sha256[:16]
    )


def log_shards_input(dataset, manifest: dict, embed_run_id: str, context: str = "training") -> None:
    """The shards as an input of the active run, linked to the embed run that made them (input
    tags: embed.run_id, the source file and its digest, the teacher, rows per split)."""
    if not enabled() or dataset is None:
        return

    src = manifest.get("source") or {}
    tags = {
        "embed.run_id": embed_run_id or "unknown",
        "source.path": str(src.get("path", "")),
        "source.sha256": str(src.get("sha256", ""))[:16],
        "teacher": str((manifest.get("teacher") or {}).get("name", "")),
    }
    for split, info in (manifest.get("splits") or {}).items():
        if isinstance(info, dict) and "count" in info:
            tags[f"rows.{split}"] = str(info["count"])
    _log_input(dataset, context, tags)


def _dataset_race(e: Exception) -> bool:
    """Whether the store refused a dataset (experiment, name, digest) inserted twice. A local
    store raises MLflow's error from SQLAlchemy's IntegrityError. A server sends only MLflow's
    error code, BAD_REQUEST as for any bad request, and the database's message: there the name
    of PostgreSQL's primary key in the text is the only sign of this race."""
    from sqlalchemy.exc import IntegrityError

    return isinstance(e.__cause__, IntegrityError) or "dataset_pk" in str(e)


def _log_input(dataset, context: str, tags: dict | None) -> None:
    """mlflow.log_input, tried once more when another run created the same dataset first. The
    store looks the dataset up, then inserts it: two runs logging the same data at the same moment
    (two `dvc exp run` against one server) both find none, and the later insert breaks the key.
    The second try finds the dataset and only links it to this run."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        mlflow.log_input(dataset, context=context, tags=tags)
    except MlflowException as e:
        if not _dataset_race(e):
            raise
        log.info("another run logged the dataset %r at the same moment; linking it to this run", dataset.name)
        mlflow.log_input(dataset, context=context, tags=tags)
