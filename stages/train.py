"""train: train the energy-flow model on the embedding shards; write the model, its MLflow run id,
per-window telemetry with gradient health (a DVC plot), skipped / flagged steps and
metrics/train.json. The MLflow run (named after the DVC experiment, else the preset and its
overrides) gets the whole config as params, the shards as its dataset, the curves and system
metrics (CPU, memory, GPU); the evaluate stage adds the model as an MLflow model
(runs:/<run_id>/model). Writes a resumable checkpoint every train.checkpoint_every steps: a
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

import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from pipeline.core import distributed
from pipeline.core.arm import arm_of
from pipeline.core.atomic import atomic_path, write_json
from pipeline.core.config import flatten
from pipeline.core.output_dirs import CHECKPOINTS, MODEL, claim
from pipeline.core.paths import METRICS_DIR, TELEMETRY_DIR, repo_path
from pipeline.data.shards import load_manifest, open_split, sha256_file
from pipeline.model.model_file import model_shapes, save_model
from pipeline.tracking import store as tracking
from pipeline.tracking.metric_buffer import MetricBuffer
from pipeline.train import memory_estimate
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.device import select_device
from pipeline.train.loop import train_model
from pipeline.train.perf_files import PERF_CSV, PERF_JSON, SETTINGS_KEY, is_measured, manifest_digest, settings_digest
from pipeline.train.result import TrainingDiverged
from pipeline.train.resume_state import STATE_FILE, fingerprint, load_state
from pipeline.train.telemetry import step_columns

from ._cli import run_stage

log = logging.getLogger(__name__)

STEPS_CSV = TELEMETRY_DIR / "train_steps.csv"
EVENTS_JSON = TELEMETRY_DIR / "train_events.json"


def write_telemetry(result) -> None:
    """The run's numbers (loss, gradients, flow steps: the same bits on a re-run) go to the DVC
    outputs; time and memory, which differ on every run, to telemetry/train_perf.csv beside them,
    which DVC does not track (else two identical runs could never give identical hashes)."""
    steps = pd.DataFrame(result.rows, columns=step_columns(result.module_names))
    measured = [c for c in steps.columns if is_measured(c)]
    with atomic_path(STEPS_CSV) as tmp:
        steps.drop(columns=measured).to_csv(tmp, index=False)
    with atomic_path(PERF_CSV) as tmp:
        steps[["step", *measured]].to_csv(tmp, index=False)
    write_json(EVENTS_JSON, result.events)


def write_train_metrics(summary: dict, settings: str) -> None:
    """`settings` (perf_files.settings_digest) goes beside the time and memory: it names the run
    they were measured on, for the report to check against its own config."""
    write_json(METRICS_DIR / "train.json", {k: v for k, v in summary.items() if not is_measured(k)})
    write_json(PERF_JSON, {SETTINGS_KEY: settings, **{k: v for k, v in summary.items() if is_measured(k)}})


# Set by record_divergence in the process that recorded a diverged run (rank 0): main() then
# runs the report stage for it.
_DIVERGED: list[int] = []


def record_divergence(cfg, run, result, settings: str) -> None:
    """The run blew up and will not reach evaluate or report: write its telemetry, its partial
    metrics (train/diverged = 1) and its run file, for the report stage that main() starts next."""
    write_telemetry(result)
    metrics = {**result.summary, "train/diverged": 1}
    write_train_metrics(metrics, settings)
    tracking.log_metrics(metrics, step=int(metrics["train/steps"]))
    tracking.write_run_file(
        "train",
        {
            "run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "tracking_uri": tracking.tracking_uri() if tracking.enabled() else "",
            "model_sha256": "",
            "diverged": True,
        },
    )
    _DIVERGED.append(int(metrics["train/steps"]))
    log.error("training diverged at step %d: no model is written; the stability report follows", metrics["train/steps"])


def report_divergence(args: list[str]) -> int:
    """The report stage for the diverged run, in its own process with this stage's overrides: it
    reads the partial telemetry and metrics, skips the learning check (nothing to evaluate) and
    adds the report to the run, which stays FAILED. Tracking is as this process had it."""
    # Not torchrun's rank variables: the report is one process of its own.
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV and not k.startswith("TORCHELASTIC_")}
    code_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (code_root, env.get("PYTHONPATH"))))
    env["ENERGY_FLOW_RUNS_DIR"] = str(tracking.RUNS_DIR)
    overrides = [a for a in args if not a.startswith(("run.tracking=", "train.nproc="))]
    if tracking.enabled():
        env["MLFLOW_TRACKING_URI"] = tracking.tracking_uri()
    else:
        overrides.append("run.tracking=disabled")
    return subprocess.run([sys.executable, "-m", "stages.report", *overrides], env=env).returncode


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


def run(cfg) -> dict | None:
    with distributed.process_group(select_device(cfg.train.device)) as place:
        if place.is_main:
            return train_and_record(cfg, place)
        train_only(cfg, place)
        return None


def prepare(cfg, place, on_memory=None):
    """What every rank reads: the shards (memory-mapped), the fingerprint and a checkpoint. Before
    any of the model, optimizer or checkpoint is built or loaded, the memory check
    (pipeline/train/memory_estimate.py) refuses a config that cannot fit; `on_memory` gets its result."""
    shard_dir = repo_path(cfg.embed.out_dir)
    manifest = load_manifest(shard_dir)
    ckpt_path = repo_path(cfg.train.checkpoint_dir) / STATE_FILE
    memory = memory_estimate.check(cfg, int(manifest["dim"]), place, ckpt_path)
    if on_memory is not None:
        on_memory(memory)
    train, val = open_split(shard_dir, "train", need_rows="to train on"), open_split(shard_dir, "val")
    fp = fingerprint(cfg, manifest_digest(manifest), place.world_size)
    state = None
    if cfg.train.resume and ckpt_path.is_file():
        # Shapes too: a checkpoint of this fingerprint from another version of the code is set aside, not a crash.
        state = load_state(
            ckpt_path, fp, quiet=not place.is_main, model_shapes=model_shapes(cfg.model, int(manifest["dim"]))
        )
    return manifest, train, val, ckpt_path, fp, state


def train_only(cfg, place) -> None:
    """A rank other than 0: train in step with the others, write and log nothing."""
    _, train, val, ckpt_path, fp, state = prepare(cfg, place)
    ckpt = Checkpointing(ckpt_path, fp, 0, resume_from=state)
    try:
        train_model(
            cfg, train.inputs, train.targets, val.inputs, val.targets, checkpointing=ckpt, progress=False, place=place
        )
    except TrainingDiverged:
        pass  # every rank stops at the same step (the skips are agreed); rank 0 reports it


def train_and_record(cfg, place) -> dict:
    checked = []
    manifest, train, val, ckpt_path, fp, state = prepare(cfg, place, on_memory=checked.append)
    memory = checked[0]
    if not memory.fits:  # train.memory_check=false: not refused, but said
        log.warning("%s; going on: train.memory_check=false", memory.describe())
    else:  # a warning when only the expected flow steps fit, not the worst case
        log.log(logging.INFO if memory.worst_fits else logging.WARNING, "%s", memory.describe())
    model_dir = repo_path(cfg.train.out_dir)
    settings = settings_digest(cfg, manifest_digest(manifest))
    resume_run = (state or {}).get("extra", {}).get("run_id")
    if resume_run and not tracking.run_exists(resume_run):
        resume_run = None  # the checkpoint's run is not in this store: the weights resume, the run is new
    embed_run = (
        tracking.read_run_file(
            "embed", repo_path(cfg.embed.out_dir) / "manifest.json", "manifest_sha256", required=False
        )
        if tracking.enabled()
        else {}
    )
    arm = arm_of(cfg, manifest)
    tags = {
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
        **tracking.device_tags(select_device(cfg.train.device)),
    }
    with tracking.mlflow_run(
        tracking.run_name(cfg),
        cfg.run.preset,
        cfg.run.experiment,
        run_id=resume_run,
        tags={**tags, **tracking.overrides_tag(cfg)},
        stage="train",
    ) as run:
        if resume_run is None:
            effective = cfg.train.batch_size * cfg.train.grad_accum * place.world_size
            tracking.log_params(
                {**flatten(cfg), "train.processes": place.world_size, "train.effective_batch": effective}
            )
            # The data it trains on, linked to the embed run that made it (the UI's Dataset column).
            shard_dir = repo_path(cfg.embed.out_dir)
            tracking.log_shards_input(
                tracking.shards_dataset(shard_dir, manifest, sha256_file(shard_dir / "manifest.json")),
                manifest,
                str(embed_run.get("run_id", "")),
            )
        if cfg.train.checkpoint_every:
            claim(ckpt_path.parent, CHECKPOINTS, "train.checkpoint_dir")
        tracking.log_metrics(memory.metrics(), step=0)
        sampling = cfg.train.system_metrics_every_s
        diverged = None
        with MetricBuffer(run.info.run_id, system_metrics_s=sampling) as to_mlflow:
            ckpt = Checkpointing(
                ckpt_path,
                fp,
                cfg.train.checkpoint_every,
                extra={"run_id": run.info.run_id},
                resume_from=state,
                before_save=to_mlflow.sync,
            )
            try:
                result = train_model(
                    cfg,
                    train.inputs,
                    train.targets,
                    val.inputs,
                    val.targets,
                    checkpointing=ckpt,
                    on_log=to_mlflow,
                    place=place,
                )
            except TrainingDiverged as e:
                diverged = e
        if diverged is not None:  # recorded once the buffer has closed (MLflow's own retries are back)
            record_divergence(cfg, run, diverged.result, settings)
            raise diverged
        write_telemetry(result)
        claim(model_dir, MODEL, "train.out_dir")
        # The seed: evaluate records it in the item table (which replicate of its arm this is).
        # No run id in the file: identical runs make identical files (and DVC hashes). The link
        # from model to run is runs/train.json and the run's tag train.model_sha256.
        save_model(model_dir / "model.pt", result.model, cfg.model, extra={"seed": int(cfg.run.seed)})
        model_sha = sha256_file(model_dir / "model.pt")
        tracking.set_tags({"train.model_sha256": model_sha})
        summary = result.summary
        write_train_metrics(summary, settings)
        # At the last step, so MLflow's table shows these run totals (the latest value), not the
        # last telemetry row's (perf/samples_per_s of one window, not of the run), as DVC does.
        tracking.log_metrics(summary, step=int(summary["train/steps"]))
        for path in (METRICS_DIR / "train.json", STEPS_CSV, EVENTS_JSON, PERF_CSV, PERF_JSON):
            tracking.log_artifact_file(path, "train")
        tracking.write_run_file(
            "train",
            {
                "run_id": run.info.run_id,
                "experiment_id": run.info.experiment_id,
                "tracking_uri": tracking.tracking_uri(),
                "model_sha256": model_sha,
            },
        )
    # The model is written: the checkpoint has done its job, and a forced re-run must train anew.
    ckpt_path.unlink(missing_ok=True)
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    _DIVERGED.clear()
    code = run_stage("train", __doc__, "run, embed.out_dir, model, train, fault", run, args, nproc_key="train.nproc")
    if _DIVERGED:
        report_divergence(args)  # its verdict is its own output; the stage fails either way
    return code


if __name__ == "__main__":
    sys.exit(main())
