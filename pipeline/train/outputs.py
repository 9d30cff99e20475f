"""What the train stage writes and sends to MLflow once training has ended: the model, its
telemetry and metrics, the run file; or, for a run that diverged, the evidence its stability
report is built from. Every file is written aside, into the stage's output transaction
(pipeline/core/output_transaction.py), and put in place with the others only when the stage
succeeds: a run that fails keeps the previous run's model, telemetry and metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from pipeline.core.atomic import atomic_path, write_json
from pipeline.core.config import flatten
from pipeline.core.output_transaction import OutputTransaction
from pipeline.core.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.data.shards import sha256_file
from pipeline.model.model_file import save_model
from pipeline.tracking import store as tracking
from pipeline.tracking.datasets import log_shards_input, shards_dataset
from pipeline.tracking.run_note import update_note
from pipeline.train.perf_files import PERF_CSV, PERF_JSON, SETTINGS_KEY, is_measured
from pipeline.train.result import TrainResult
from pipeline.train.telemetry import step_columns

log = logging.getLogger(__name__)

STEPS_CSV = TELEMETRY_DIR / "train_steps.csv"
EVENTS_JSON = TELEMETRY_DIR / "train_events.json"
TRAIN_JSON = METRICS_DIR / "train.json"


def log_run_inputs(cfg, manifest: dict, embed_run: dict, processes: int) -> None:
    """A new MLflow run's params (the whole config, the processes and the effective batch) and the
    data it trains on, linked to the embed run that made it (the UI's Dataset column)."""
    effective = cfg.train.batch_size * cfg.train.grad_accum * processes
    tracking.log_params({**flatten(cfg), "train.processes": processes, "train.effective_batch": effective})
    shard_dir = repo_path(cfg.embed.out_dir)
    log_shards_input(
        shards_dataset(shard_dir, manifest, sha256_file(shard_dir / "manifest.json"), str(cfg.run.preset)),
        manifest,
        str(embed_run.get("run_id", "")),
    )


def destinations(model_dir: Path) -> list[Path]:
    """Every file the train stage puts in place at its end (their directories are checked when
    the stage starts: one that cannot be written to fails then, not after training)."""
    return [model_dir / "model.pt", TRAIN_JSON, STEPS_CSV, EVENTS_JSON, PERF_CSV, PERF_JSON, tracking.run_file("train")]


def write_telemetry(result: TrainResult, tx: OutputTransaction) -> None:
    """The run's numbers (loss, gradients, flow steps: the same bits on a re-run) go to the DVC
    outputs; time and memory, which differ on every run, to telemetry/train_perf.csv beside them,
    which DVC does not track (else two identical runs could never give identical hashes)."""
    steps = pd.DataFrame(result.rows, columns=step_columns(result.module_names))
    measured = [c for c in steps.columns if is_measured(c)]
    with atomic_path(tx.path(STEPS_CSV)) as tmp:
        steps.drop(columns=measured).to_csv(tmp, index=False)
    with atomic_path(tx.path(PERF_CSV)) as tmp:
        steps[["step", *measured]].to_csv(tmp, index=False)
    write_json(tx.path(EVENTS_JSON), result.events)


def write_train_metrics(summary: dict, settings: str, tx: OutputTransaction) -> None:
    """`settings` (perf_files.settings_digest) goes beside the time and memory: it names the run
    they were measured on, for the report to check against its own config."""
    write_json(tx.path(TRAIN_JSON), {k: v for k, v in summary.items() if not is_measured(k)})
    write_json(tx.path(PERF_JSON), {SETTINGS_KEY: settings, **{k: v for k, v in summary.items() if is_measured(k)}})


def _log_artifacts(tx: OutputTransaction) -> None:
    """The staged files (the names are the outputs' own)."""
    for path in (TRAIN_JSON, STEPS_CSV, EVENTS_JSON, PERF_CSV, PERF_JSON):
        tracking.log_artifact_file(tx.path(path), "train")


def record_trained(run, result: TrainResult, cfg, model_dir: Path, settings: str, tx: OutputTransaction) -> str:
    """A finished run: its telemetry, the model file, metrics, artifacts and run file, staged in
    `tx` (model_dir was claimed when the stage started). Returns the model file's sha256."""
    write_telemetry(result, tx)
    # The seed: evaluate records it in the item table (which replicate of its arm this is).
    # No run id in the file: identical runs make identical files (and DVC hashes). The link
    # from model to run is runs/train.json and the run's tag train.model_sha256.
    save_model(tx.path(model_dir / "model.pt"), result.model, cfg.model, extra={"seed": int(cfg.run.seed)})
    model_sha = sha256_file(tx.path(model_dir / "model.pt"))
    tracking.set_tags({"train.model_sha256": model_sha})
    summary = result.summary
    write_train_metrics(summary, settings, tx)
    # At the last step, so MLflow's table shows these run totals (the latest value), not the
    # last telemetry row's (perf/samples_per_s of one window, not of the run), as DVC does.
    tracking.log_metrics(summary, step=int(summary["train/steps"]))
    _log_artifacts(tx)
    update_note()
    tracking.write_run_file(
        "train",
        {
            "run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "tracking_uri": tracking.tracking_uri(),
            "model_sha256": model_sha,
        },
        tx,
    )
    return model_sha


def record_divergence(run, result: TrainResult, settings: str, tx: OutputTransaction) -> None:
    """The run blew up and will not reach evaluate or report: write its telemetry, its partial
    metrics (train/diverged = 1) and its run file, for the report stage that runs next."""
    write_telemetry(result, tx)
    metrics = {**result.summary, "train/diverged": 1}
    write_train_metrics(metrics, settings, tx)
    tracking.log_metrics(metrics, step=int(metrics["train/steps"]))
    update_note()
    tracking.write_run_file(
        "train",
        {
            "run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "tracking_uri": tracking.tracking_uri() if tracking.enabled() else "",
            "model_sha256": "",
            "diverged": True,
        },
        tx,
    )
    log.error("training diverged at step %d: no model is written; the stability report follows", metrics["train/steps"])
