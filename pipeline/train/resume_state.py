"""Resumable training state: everything a killed run needs to end with the same weights as an
uninterrupted one (bitwise on CPU with the same seed).

The state holds the model, optimizer, LR schedule, GradScaler, RNG states, the spike window, the
data position (epoch and optimizer step within it) and the telemetry so far. It is written with
torch.save to a temp file and renamed (a kill mid-write leaves the previous checkpoint), and read
with weights_only=True: tensors, numbers, strings and containers only, never arbitrary objects.

A checkpoint carries a fingerprint of everything that shapes the weights (run seed, model, train
settings that change the maths, fault, and the data's digest). A run resumes only from a
checkpoint with its own fingerprint; any other one is set aside with a message, never loaded. So
is one whose model tensors do not fit the model this config builds (same fingerprint, but written
by another version of the code): the message names the tensors, and the run starts afresh rather
than stopping on every attempt until someone deletes the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from pipeline.core.atomic import atomic_path
from pipeline.core.config import Config
from pipeline.core.config.param import Role, keys_with
from pipeline.core.errors import PipelineError
from pipeline.core.output_dirs import CHECKPOINTS
from pipeline.core.paths import check_readable_inside
from pipeline.model.model_file import first_nonfinite_tensor, read_tensor_file, tensor_mismatch

log = logging.getLogger(__name__)

STATE_FILE = CHECKPOINTS.files[0]  # last.pt, in train.checkpoint_dir
# Settings that change what is logged or where, never the weights (declared in the schema): a run
# resumed with a new value of these is still the same run.
_NEUTRAL_TRAIN_KEYS = {k.removeprefix("train.") for k in keys_with(Role.RESUME_NEUTRAL, Config)}


def fingerprint(cfg, data_digest: str, processes: int = 1) -> str:
    """`processes` is the job's actual world size (train.nproc asks for one, a user's own torchrun
    may give another): it sets the effective batch. One process leaves the digest as it was."""
    train = {k: v for k, v in OmegaConf.to_container(cfg.train, resolve=True).items() if k not in _NEUTRAL_TRAIN_KEYS}
    doc = {
        "seed": cfg.run.seed,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "train": train,
        "fault": OmegaConf.to_container(cfg.fault, resolve=True),
        "data": data_digest,
    }
    if processes > 1:
        doc["processes"] = processes
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(path: Path, state: dict[str, Any]) -> None:
    # A file object, not a path: a full disk is then reported as one (see checkpoint.save_model).
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)


def load_state(
    path: Path,
    expected_fingerprint: str,
    quiet: bool = False,
    model_shapes: Optional[dict[str, tuple[int, ...]]] = None,
) -> Optional[dict[str, Any]]:
    """The checkpoint at `path` if it exists and belongs to this config and data, else None.
    `quiet`: say nothing of one set aside (distributed ranks other than 0: rank 0 says it).
    `model_shapes` (checkpoint.model_shapes of this run's model): also set aside a checkpoint
    whose model tensors differ from these."""
    warn = (lambda *a: None) if quiet else log.warning
    path = check_readable_inside(path, "the checkpoint (train.checkpoint_dir)")
    if not path.is_file():
        return None
    try:
        state = read_tensor_file(path, "cpu", "the checkpoint the train stage writes", "it is set aside")
    except PipelineError as e:  # a damaged checkpoint must not stop a fresh start
        warn("checkpoint is unreadable: %s: starting from step 0", e)
        return None
    found = state.get("fingerprint") if isinstance(state, dict) else None
    if found != expected_fingerprint:
        warn(
            "checkpoint %s is from another config or dataset (fingerprint %s, this run %s): starting from step 0",
            path,
            found,
            expected_fingerprint,
        )
        return None
    if model_shapes is not None:
        model = state.get("model")
        mismatch = tensor_mismatch(model, model_shapes) if isinstance(model, dict) else "it holds no model tensors"
        if mismatch:
            warn(
                "checkpoint %s has this run's fingerprint but its model does not fit the one this config builds "
                "(written by another version of the code?): %s; starting from step 0",
                path,
                mismatch,
            )
            return None
    bad = first_nonfinite_tensor({k: state.get(k) for k in ("model", "optimizer")})
    if bad:
        warn("checkpoint %s holds a value that is not finite (%s): starting from step 0", path, bad)
        return None
    return state
