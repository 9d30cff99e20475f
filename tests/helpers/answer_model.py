"""A real trained model to serve: the project copied into a temporary directory (what `git clone`
gives), the smoke preset's embed and train stages run there, and the answer model logged into the
copy's own MLflow store (its mlflow.db) with pipeline.serve.log.log_answer_model, in a model run
named `train` whose id runs/train.json records, as the train stage records its run (and
runs/evaluate.json where the model is, as the evaluate stage records it). About 40 s on
2 cores, once per test session (make_answer_project caches it)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.fault_matrix import clean_env, project_copy

SMOKE = ["preset=smoke", "run.tracking=disabled"]
# The confidence rule it is logged with, in place of the evaluate stage's calibration: a margin
# is never negative and a cosine never under -1, so every answer is confident.
RULE = (-1.0, 0.0, 0.9)
# Logged the way the train stage will: inside the run, right after the model file is saved.
_LOG = """
import json, sys
import mlflow
from omegaconf import OmegaConf
from pipeline.data.shards import sha256_file
from pipeline.answer.confidence import ConfidenceRule
from pipeline.serve.log import log_answer_model, logged_model_record, model_name
from pipeline.tracking import store as tracking

RULE = %r
cfg = OmegaConf.load("params.yaml")
uri = tracking.use_store()
mlflow.set_experiment("energy-flow")
with mlflow.start_run(run_name="train") as run:
    name = model_name("smoke", "train", run.info.run_id)  # named as the evaluate stage names it
    info = log_answer_model(
        "models/model.pt",
        cfg.embed.out_dir,
        int(cfg.train.batch_size),
        int(cfg.embed.batch_size),
        ConfidenceRule(*RULE),
        {"calibrated_on": "none: a fixed rule for the tests"},
        name=name,
    )
model_sha = sha256_file("models/model.pt")
tracking.write_run_file("train", {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
    "tracking_uri": uri, "model_sha256": model_sha, "model_id": info.model_id})
tracking.write_run_file("evaluate", logged_model_record(info))  # as the evaluate stage records it
print(json.dumps({"run_id": run.info.run_id, "tracking_uri": uri, "model_uri": info.model_uri, "name": name}))
"""


@dataclass(frozen=True)
class AnswerProject:
    root: Path  # the project copy: models/model.pt, data/shards, mlflow.db, runs/train.json
    env: dict  # the environment its commands ran with (offline, this venv first on PATH)
    tracking_uri: str
    run_id: str
    batch_size: int  # train.batch_size
    embed_batch_size: int
    model_uri: str  # models:/<model_id>, what runs/evaluate.json records
    model_name: str  # the logged model's name (pipeline.serve.log.model_name)

    @property
    def model_path(self) -> Path:
        return self.root / "models" / "model.pt"

    @property
    def shard_dir(self) -> Path:
        return self.root / "data" / "shards"

    @property
    def run_uri(self) -> str:
        """runs:/<run_id>/<name>: MLflow finds the run's logged model by its name."""
        return f"runs:/{self.run_id}/{self.model_name}"


def _run(cmd: list[str], root: Path, env: dict) -> str:
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
    return proc.stdout


_MADE: dict[str, AnswerProject] = {}


def make_answer_project(dest: Path) -> AnswerProject:
    """The project copy in `dest` with its smoke model trained and logged (once per process: a
    second call returns the first project, wherever it was asked for)."""
    if "project" in _MADE:
        return _MADE["project"]
    root = project_copy(dest)
    env = {**clean_env(), "ENERGY_FLOW_RUNS_DIR": str(root / "runs")}
    _run([sys.executable, "-m", "stages.embed", *SMOKE], root, env)
    _run([sys.executable, "-m", "stages.train", *SMOKE], root, env)
    logged = json.loads(_run([sys.executable, "-c", _LOG % (RULE,)], root, env).strip().splitlines()[-1])
    from omegaconf import OmegaConf

    params = OmegaConf.load(root / "params.yaml")
    _MADE["project"] = AnswerProject(
        root,
        env,
        logged["tracking_uri"],
        logged["run_id"],
        int(params.train.batch_size),
        int(params.embed.batch_size),
        logged["model_uri"],
        logged["name"],
    )
    return _MADE["project"]
