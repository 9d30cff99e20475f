"""The files the train stage writes once training has ended: the model, its telemetry and
metrics; or, for a run that diverged, the evidence its stability report is built from. Every file
is written aside, into the stage's output transaction (pipeline/core/output_transaction.py), and
put in place with the others only when the stage succeeds: a run that fails keeps the previous
run's model, telemetry and metrics. What goes to MLflow is the stage's (stages/train.py): this
package knows nothing of tracking."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.core.atomic import atomic_path, write_json
from pipeline.core.output_transaction import OutputTransaction
from pipeline.core.paths import METRICS_DIR, TELEMETRY_DIR
from pipeline.data.shards import sha256_file
from pipeline.model.model_file import save_model
from pipeline.train.perf_files import PERF_CSV, PERF_JSON, SETTINGS_KEY, is_measured
from pipeline.train.result import TrainResult
from pipeline.train.telemetry import step_columns

STEPS_CSV = TELEMETRY_DIR / "train_steps.csv"
EVENTS_JSON = TELEMETRY_DIR / "train_events.json"
TRAIN_JSON = METRICS_DIR / "train.json"
# The files logged as the run's artifacts (the names are the outputs' own), in its folder
# PERF_ARTIFACT_DIR (perf_files.py).
ARTIFACTS = (TRAIN_JSON, STEPS_CSV, EVENTS_JSON, PERF_CSV, PERF_JSON)


def destinations(model_dir: Path) -> list[Path]:
    """The files above that the train stage puts in place at its end, with its run file (their
    directories are checked when the stage starts: one that cannot be written to fails then)."""
    return [model_dir / "model.pt", *ARTIFACTS]


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


def write_model(result: TrainResult, cfg, model_dir: Path, tx: OutputTransaction) -> str:
    """The model file, staged in `tx`; returns its sha256. The seed: evaluate records it in the
    item table (which replicate of its arm this is). No run id in the file: identical runs make
    identical files (and DVC hashes); the link from model to run is the run file and the run's tag
    train.model_sha256."""
    save_model(tx.path(model_dir / "model.pt"), result.model, cfg.model, extra={"seed": int(cfg.run.seed)})
    return sha256_file(tx.path(model_dir / "model.pt"))
