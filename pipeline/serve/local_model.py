"""A logged answer model loaded straight from its local directory, without MLflow.

Going through MLflow costs seconds before the first answer (its import, the store's schema check,
resolving runs:/, copying the model out). When the model is a local directory and its code is this
checkout's, the same Answerer (pipeline/serve/answering.py) is built from its MLmodel and
artifacts here, with the same checks on load (docs/serving.md, "Loading without MLflow").
open_local says why not, instead, when the directory is not such a model; the caller then goes
through MLflow, which runs the model's own code and gives its own messages."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.answer.confidence import ARTIFACT

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # pipeline/, what the model logs as its code
ANSWER_LOADER = "mlflow.pyfunc.loaders.code_model"
CONFIG_KEYS = ("train_batch_size", "embed_batch_size", "embed_dtype", "teacher", "dim", "bank_sha256")
# An MLmodel is a few kilobytes; a larger one is not the pipeline's and is left to MLflow.
MLMODEL_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class LocalModel:
    path: Path
    config: dict  # model_config
    artifacts: dict[str, str]  # name -> local file
    metadata: dict
    run_id: str | None
    model_id: str | None


def code_digest(package_dir: Path) -> str:
    """sha256 over the relative paths and bytes of the package's .py files: the code a model
    logged from this checkout carries, byte for byte, in its code/pipeline."""
    h = hashlib.sha256()
    for f in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        h.update(f.relative_to(package_dir).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _inputs(signature: dict) -> list[str]:
    try:
        return [c.get("name") for c in json.loads((signature or {}).get("inputs") or "[]") if isinstance(c, dict)]
    except (TypeError, ValueError, AttributeError):
        return []


def _artifact(path: Path, pyfunc: dict, name: str) -> Path | None:
    entry = (pyfunc.get("artifacts") or {}).get(name)
    rel = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(rel, str):
        return None
    file = (path / rel).resolve()
    return file if file.is_relative_to(path.resolve()) and file.is_file() else None


def open_local(path: Path) -> tuple[LocalModel | None, str]:
    """(the answer model in the local directory `path`, "") or (None, why it cannot be loaded
    here without MLflow)."""
    mlmodel = path / "MLmodel"
    try:
        if mlmodel.stat().st_size > MLMODEL_MAX_BYTES:
            return None, f"{mlmodel} is over {MLMODEL_MAX_BYTES} bytes"
        info = yaml.safe_load(mlmodel.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return None, f"{mlmodel} cannot be read ({type(e).__name__})"
    if not isinstance(info, dict):
        return None, f"{mlmodel} is not a mapping"
    pyfunc = (info.get("flavors") or {}).get("python_function") or {}
    if pyfunc.get("loader_module") != ANSWER_LOADER or "question" not in _inputs(info.get("signature")):
        return None, "it is not an answer model"
    config = pyfunc.get("config")
    if not isinstance(config, dict) or any(k not in config for k in CONFIG_KEYS):
        return None, "its MLmodel records no answer model config"
    artifacts = {name: _artifact(path, pyfunc, name) for name in ("model", "bank")}
    if None in artifacts.values():
        return None, "its model or bank file is missing"
    rule = _artifact(path, pyfunc, ARTIFACT)  # none in a model logged before answers had a confidence
    if rule is not None:
        artifacts[ARTIFACT] = rule
    code = path / "code" / PACKAGE_DIR.name
    if not code.is_dir() or code_digest(code) != code_digest(PACKAGE_DIR):
        return None, "its code is not this checkout's"
    return (
        LocalModel(
            path,
            config,
            {k: str(v) for k, v in artifacts.items()},
            info.get("metadata") or {},
            info.get("run_id"),
            info.get("model_id"),
        ),
        "",
    )


def load_local(model: LocalModel, digest_cache: Path | None = None):
    """The Answerer of `model`, loaded (bank and teacher checked as under MLflow)."""
    from pipeline.serve.answering import Answerer

    answerer = Answerer()
    answerer.load(model.config, model.artifacts, digest_cache)
    return answerer
