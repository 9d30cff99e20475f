"""train: train the energy-flow model on the embedding shards; write the model, its MLflow run id,
per-window telemetry with gradient health (a DVC plot), skipped / flagged steps and
metrics/train.json. The MLflow run (named after the DVC experiment, else the preset and its
overrides) gets the whole config as params, the shards as its dataset, the curves and system
metrics (CPU, memory, GPU); the evaluate stage adds the model as an MLflow model
(models:/<model_id>, named after the run). Writes a resumable checkpoint every train.checkpoint_every steps: a
killed train stage started again (dvc repro) resumes from it, in the same MLflow run, and ends
with the same weights as an uninterrupted run. A run that diverges (train.max_consecutive_skips
skipped steps in a row) still gets its stability report (reports/stability.html): the stage writes
the partial telemetry and metrics, then runs the report stage (`python -m stages.report`, a
separate process: the train stage imports nothing of the report, so a change to the report's
checks or HTML never re-trains the model), then fails.

With train.nproc=N (or under torchrun) it trains with DistributedDataParallel on N processes: gloo
on CPU, nccl on CUDA (one GPU per process); each process reads its own batches of the shards,
and the effective batch is train.batch_size * train.grad_accum * N. Rank 0 alone logs to MLflow,
writes the checkpoints, model, metrics, telemetry and report, and prints; the other ranks print
only their warnings, prefixed with their rank. Multi-node: every node needs the shards and
train.checkpoint_dir on a shared path (every rank resumes from rank 0's checkpoint)."""

from __future__ import annotations

if __name__ == "__main__":  # run as a stage: before the imports below (stages/startup.py says why)
    from stages import startup

    startup.begin()

import contextlib
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.core import distributed, lifetime
from pipeline.core.arm import arm_of
from pipeline.core.config import flatten
from pipeline.core.output_dirs import CHECKPOINTS, MODEL, claim
from pipeline.core.output_transaction import outputs
from pipeline.core.paths import repo_path
from pipeline.data.shards import sha256_file
from pipeline.tracking import store as tracking
from pipeline.tracking.datasets import log_shards_input, shards_dataset
from pipeline.tracking.metric_buffer import MetricBuffer
from pipeline.tracking.provenance import device_tags
from pipeline.tracking.run_note import update_note
from pipeline.train import plan
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.device import select_device
from pipeline.train.inputs import prepare
from pipeline.train.loop import train_model
from pipeline.train.outputs import ARTIFACTS, destinations, write_model, write_telemetry, write_train_metrics
from pipeline.train.perf_files import PERF_ARTIFACT_DIR, manifest_digest, settings_digest
from pipeline.train.result import TrainingDiverged

from ._cli import run_stage

log = logging.getLogger(__name__)

SECTIONS = "run, embed.out_dir, model, train, fault"
MEMORY_ESTIMATE_ARTIFACT = "train/memory_estimate.json"
# torchrun's rank variables: the report of a diverged run is one process of its own.
_LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class TrainOutcome:
    """What run() ended with on this process."""

    summary: Optional[dict] = None  # rank 0's metrics of a finished run
    diverged: Optional[TrainingDiverged] = None  # rank 0 recorded a diverged run: its report follows


def run(cfg) -> TrainOutcome:
    with distributed.process_group(select_device(cfg.train.device)) as place:
        if not place.is_main:
            train_only(cfg, place)
            return TrainOutcome()
        try:
            return TrainOutcome(summary=train_and_record(cfg, place))
        except TrainingDiverged as e:  # recorded by train_and_record, its MLflow run ended FAILED
            return TrainOutcome(diverged=e)


def train_only(cfg, place) -> None:
    """A rank other than 0: train in step with the others, write and log nothing."""
    inputs = prepare(cfg, place, tracked=False)  # only rank 0 tracks
    ckpt = Checkpointing(inputs.ckpt_path, inputs.fingerprint, 0, resume_from=inputs.state)
    # Every rank stops at the same step (the skips are agreed); rank 0 reports a divergence.
    with contextlib.suppress(TrainingDiverged):
        train_model(cfg, *inputs.arrays(), checkpointing=ckpt, progress=False, place=place)


def train_and_record(cfg, place) -> dict:
    inputs = prepare(cfg, place, tracking.enabled())
    memory, manifest, _, _, ckpt_path, fp, state = inputs
    memory.log()
    model_dir = repo_path(cfg.train.out_dir)
    settings = settings_digest(cfg, manifest_digest(manifest))
    resume_run = (state or {}).get("extra", {}).get("run_id")
    if resume_run and not tracking.run_exists(resume_run):
        resume_run = None  # the checkpoint's run is not in this store: the weights resume, the run is new
    embed_run = embed_run_of(cfg)
    claim(model_dir, MODEL, "train.out_dir")  # checked before any work; made and marked now
    tags = {**run_tags(cfg, manifest, embed_run, fp, place), **tracking.overrides_tag(cfg)}
    # Written aside and put in place together when the run ends well (pipeline/core/output_transaction.py):
    # a failure anywhere keeps the previous run's model, checkpoint, telemetry and metrics. Within
    # the MLflow run, so that a failed commit ends the run FAILED.
    with (
        tracking.mlflow_run(
            tracking.run_name(cfg), cfg.run.preset, cfg.run.experiment, run_id=resume_run, tags=tags, stage="train"
        ) as run,
        outputs("train", [*destinations(model_dir), tracking.run_file("train")]) as tx,
    ):
        if resume_run is None:
            log_run_inputs(cfg, manifest, embed_run, place.world_size)
        if cfg.train.checkpoint_every:
            claim(ckpt_path.parent, CHECKPOINTS, "train.checkpoint_dir")
        # Its figures are constants of the run: the peak and what was available as tags
        # (metric_names.TAGS), every part in the artifact.
        tracking.log_metrics(memory.metrics(), step=0)
        tracking.log_dict(memory.metrics(), MEMORY_ESTIMATE_ARTIFACT)
        diverged = None
        with MetricBuffer(run.info.run_id, system_metrics_s=cfg.train.system_metrics_every_s) as to_mlflow:
            ckpt = Checkpointing(
                ckpt_path,
                fp,
                cfg.train.checkpoint_every,
                extra={"run_id": run.info.run_id},
                resume_from=state,
                before_save=to_mlflow.sync,
            )
            try:
                result = train_model(cfg, *inputs.arrays(), checkpointing=ckpt, on_log=to_mlflow, place=place)
            except TrainingDiverged as e:
                diverged = e
        if diverged is not None:  # recorded once the buffer has closed (MLflow's own retries are back)
            record(run, diverged.result, cfg, model_dir, settings, tx, diverged=True)
            tx.commit()  # the evidence the report reads; the previous model stays (none was made)
            raise diverged  # inside the run: it ends FAILED
        record(run, result, cfg, model_dir, settings, tx)
        # With the model in place the checkpoint has done its job (a forced re-run must train
        # anew); until then it is what a re-run resumes from.
        tx.remove(ckpt_path)
    summary = result.summary
    log.info(
        "trained %d steps in %.1f s: loss %.4f, val/cosine %.4f, %d skipped, %d spikes; run %s",
        summary["train/steps"],
        summary["train/seconds"],
        summary["train/loss"],
        summary.get("val/cosine", float("nan")),
        summary["train/skipped_steps"],
        summary["train/spikes"],
        run.info.run_id,
    )
    return summary


def embed_run_of(cfg) -> dict:
    """The run file of the embed run that made the shards ({} when tracking is off or it has none)."""
    if not tracking.enabled():
        return {}
    return tracking.read_run_file(
        "embed", repo_path(cfg.embed.out_dir) / "manifest.json", "manifest_sha256", required=False
    )


def run_tags(cfg, manifest: dict, embed_run: dict, fp: str, place) -> dict[str, str]:
    """The train run's MLflow tags: what it trained on, how, and where."""
    arm = arm_of(cfg, manifest)
    return {
        "stage": "train",
        # Runs of one arm differ only in run.seed: the runs table groups replicates by this tag.
        "arm": arm.tag,
        "arm.digest": arm.digest,
        "embed.run_id": str(embed_run.get("run_id", "")),
        "dataset.sha256": str(manifest.get("source", {}).get("sha256", ""))[:16],
        "teacher": str(manifest["teacher"]["name"]),
        "train.fingerprint": fp,
        "train.processes": str(place.world_size),
        "distributed.backend": place.backend or "none",
        **device_tags(select_device(cfg.train.device)),
    }


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


def record(run, result, cfg, model_dir: Path, settings: str, tx, diverged: bool = False) -> None:
    """A finished run: its telemetry, the model file, metrics, artifacts and run file, staged in
    `tx` (model_dir was claimed when the stage started). A `diverged` run will not reach evaluate
    or report: its telemetry, its partial metrics (train/diverged = 1) and its run file, no model,
    for the report stage that runs next."""
    write_telemetry(result, tx)
    # The model's digest tags the run: it is how ./dev ask finds the run of a model file.
    model_sha = "" if diverged else write_model(result, cfg, model_dir, tx)
    if model_sha:
        tracking.set_tags({"train.model_sha256": model_sha})
    metrics = {**result.summary, "train/diverged": 1} if diverged else result.summary
    write_train_metrics(metrics, settings, tx)
    # At the last step, so MLflow's table shows these run totals (the latest value), not the
    # last telemetry row's (perf/samples_per_s of one window, not of the run), as DVC does.
    tracking.log_metrics(metrics, step=int(metrics["train/steps"]))
    for path in () if diverged else ARTIFACTS:
        tracking.log_artifact_file(tx.path(path), PERF_ARTIFACT_DIR)
    update_note()
    uri = tracking.tracking_uri() if tracking.enabled() or not diverged else ""
    info = {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "tracking_uri": uri}
    tracking.write_run_file(
        "train", {**info, "model_sha256": model_sha, **({"diverged": True} if diverged else {})}, tx
    )
    if diverged:
        log.error(
            "training diverged at step %d: no model is written; the stability report follows", metrics["train/steps"]
        )


def report_divergence(args: list[str]) -> int:
    """The report stage for the diverged run, in its own process with this stage's overrides
    (`python -m stages.report`: this stage imports nothing of the report, so a change to the
    report never re-trains the model). It reads the partial telemetry and metrics, skips the
    learning check (nothing to evaluate) and adds the report to the run, which stays FAILED.
    Tracking is as this process had it; it dies with this process (pipeline/core/lifetime.py)."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV and not k.startswith("TORCHELASTIC_")}
    code_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (code_root, env.get("PYTHONPATH"))))
    env["ENERGY_FLOW_RUNS_DIR"] = str(tracking.RUNS_DIR)
    overrides = [a for a in args if not a.startswith(("run.tracking=", "train.nproc="))]
    if tracking.enabled():
        env["MLFLOW_TRACKING_URI"] = tracking.tracking_uri()
    else:
        overrides.append("run.tracking=disabled")
    return subprocess.run([sys.executable, "-m", "stages.report", *overrides], env=lifetime.child_env(env)).returncode


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    outcome = TrainOutcome()

    def run_keeping_outcome(cfg) -> None:  # run_stage keeps only the exit code
        nonlocal outcome
        outcome = run(cfg)
        if outcome.diverged is not None:
            raise outcome.diverged  # the stage fails with its message

    def costs(cfg, processes: int) -> None:  # tracking is configured by now: rank 0's MLflow client counts
        plan.costs(cfg, processes, tracked=tracking.enabled())

    code = run_stage("train", __doc__, SECTIONS, run_keeping_outcome, args, nproc_key="train.nproc", costs=costs)
    if outcome.diverged is not None:
        report_divergence(args)  # its verdict is its own output; the stage fails either way
    return code


if __name__ == "__main__":
    sys.exit(main())
