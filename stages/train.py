"""train: train the energy-flow model on the embedding shards; write the model, its MLflow run id,
per-window telemetry (a DVC plot), non-finite events and metrics/train.json."""
from __future__ import annotations

import logging
import sys

import pandas as pd

from pipeline import tracking
from pipeline.atomic import atomic_path, write_json
from pipeline.checkpoint import save_model
from pipeline.config import flatten
from pipeline.data.shards import load_manifest, open_split
from pipeline.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.telemetry import STEP_COLUMNS
from pipeline.training import TrainingDiverged, train_model

from ._cli import run_stage

log = logging.getLogger(__name__)

STEPS_CSV = TELEMETRY_DIR / "train_steps.csv"
EVENTS_JSON = TELEMETRY_DIR / "train_events.json"


def write_telemetry(rows: list[dict], events: list[dict]) -> None:
    with atomic_path(STEPS_CSV) as tmp:
        pd.DataFrame(rows, columns=STEP_COLUMNS).to_csv(tmp, index=False)
    write_json(EVENTS_JSON, events)


def run(cfg) -> dict:
    shard_dir = repo_path(cfg.embed.out_dir)
    manifest = load_manifest(shard_dir)
    train, val = open_split(shard_dir, "train"), open_split(shard_dir, "val")
    model_dir = repo_path(cfg.train.out_dir)
    tags = {"stage": "train", "embed.run_id": str(manifest.get("embed_run_id")),
            "dataset.sha256": str(manifest.get("source", {}).get("sha256", ""))[:16],
            "teacher": str(manifest["teacher"]["name"])}
    with tracking.mlflow_run("train", cfg.run.preset, cfg.run.experiment, tags=tags) as run:
        tracking.log_params(flatten(cfg))
        try:
            result = train_model(cfg, train.inputs, train.targets, val.inputs, val.targets,
                                 on_log=lambda m, step: tracking.log_metrics(m, step=step))
        except TrainingDiverged as e:
            write_telemetry(e.result.rows, e.result.events)  # the evidence of what went wrong
            raise
        write_telemetry(result.rows, result.events)
        save_model(model_dir / "model.pt", result.model, cfg.model, extra={"run_id": run.info.run_id})
        summary = result.summary
        write_json(METRICS_DIR / "train.json", summary)
        tracking.log_metrics(summary)
        for path in (METRICS_DIR / "train.json", STEPS_CSV, EVENTS_JSON):
            tracking.log_artifact_file(path, "train")
        tracking.write_run_file(model_dir, {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                                            "tracking_uri": tracking.tracking_uri()})
    log.info("trained %d steps in %.1f s: loss %.4f, val/cosine %.4f, %d skipped; run %s",
             summary["train/steps"], summary["train/seconds"], summary["train/loss"],
             summary.get("val/cosine", float("nan")), summary["train/skipped_steps"], run.info.run_id)
    return summary


def main(argv: list[str] | None = None) -> int:
    return run_stage("train", __doc__, "run, embed.out_dir, model, train", run, argv)


if __name__ == "__main__":
    sys.exit(main())
