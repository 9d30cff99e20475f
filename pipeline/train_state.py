"""Resumable training state: everything a killed run needs to end with the same weights as an
uninterrupted one (bitwise on CPU with the same seed).

The state holds the model, optimizer, LR schedule, GradScaler, RNG states, the spike window, the
data position (epoch and optimizer step within it) and the telemetry so far. It is written with
torch.save to a temp file and renamed (a kill mid-write leaves the previous checkpoint), and read
with weights_only=True: tensors, numbers, strings and containers only, never arbitrary objects.

A checkpoint carries a fingerprint of everything that shapes the weights (run seed, model, train
settings that change the maths, fault, and the data's digest). A run resumes only from a
checkpoint with its own fingerprint; any other one is set aside with a message, never loaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from .atomic import atomic_path

log = logging.getLogger(__name__)

STATE_FILE = "last.pt"
# Settings that change what is logged or where, never the weights: a run resumed with a new
# value of these is still the same run.
_NEUTRAL_TRAIN_KEYS = ("log_every", "checkpoint_every", "checkpoint_dir", "resume", "threads", "out_dir",
                       "detect_anomaly_steps", "system_metrics_every_s", "nproc")


def fingerprint(cfg, data_digest: str, processes: int = 1) -> str:
    """`processes` is the job's actual world size (train.nproc asks for one, a user's own torchrun
    may give another): it sets the effective batch. One process leaves the digest as it was."""
    train = {k: v for k, v in OmegaConf.to_container(cfg.train, resolve=True).items()
             if k not in _NEUTRAL_TRAIN_KEYS}
    doc = {"seed": cfg.run.seed, "model": OmegaConf.to_container(cfg.model, resolve=True), "train": train,
           "fault": OmegaConf.to_container(cfg.fault, resolve=True), "data": data_digest}
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
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_state(path: Path, expected_fingerprint: str, quiet: bool = False) -> Optional[dict[str, Any]]:
    """The checkpoint at `path` if it exists and belongs to this config and data, else None.
    `quiet`: say nothing of one set aside (distributed ranks other than 0: rank 0 says it)."""
    warn = (lambda *a: None) if quiet else log.warning
    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint must not stop a fresh start
        warn("checkpoint %s is unreadable (%s): starting from step 0", path, str(e).splitlines()[0])
        return None
    found = state.get("fingerprint") if isinstance(state, dict) else None
    if found != expected_fingerprint:
        warn("checkpoint %s is from another config or dataset (fingerprint %s, this run %s): "
             "starting from step 0", path, found, expected_fingerprint)
        return None
    return state

