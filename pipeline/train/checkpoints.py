"""When the trainer writes its resumable state (pipeline/train/resume_state.py holds how it is
written): every `every` steps at a log boundary, and once more when a stop signal ends the run
mid-window. Only rank 0 writes; every rank resumes from rank 0's file. `Checkpointing` is that part
of the loop (pipeline/train/parts.py); `trainer_state` and `restore` are what a checkpoint holds."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from pipeline.train.parts import Step, TrainPart
from pipeline.train.resume_state import rng_state, save_state, set_rng_state

log = logging.getLogger(__name__)


@dataclass
class Checkpointing(TrainPart):
    """Where and how often to write resumable state, and (optionally) a state to resume from."""

    path: Path
    fingerprint: str
    every: int
    extra: dict = field(default_factory=dict)  # stored with each checkpoint (the MLflow run id)
    resume_from: Optional[dict] = None  # a state from train_state.load_state
    before_save: Optional[Callable[[], None]] = None  # e.g. flush buffered metrics: a resumed run keeps them

    def save(self, state: Callable[[], dict[str, Any]]) -> None:
        """Write `state()`, taken after before_save has run."""
        if self.before_save:
            self.before_save()
        save_state(self.path, state())

    def on_step_end(self, tr, s: Step) -> None:
        if s.log_step and self.every and s.step % self.every == 0 and tr.place.is_main:
            self.save(lambda: trainer_state(tr))

    def on_end(self, tr, reason: str) -> None:
        if reason == "stop" and self.every and tr.place.is_main:
            self.save(lambda: trainer_state(tr))
            log.warning(
                "stopping at step %d: checkpoint written to %s (the stage resumes from it when run again)",
                tr.step,
                self.path,
            )


def trainer_state(tr) -> dict[str, Any]:
    """Everything a resumed run needs to end with an uninterrupted run's weights; the parts'
    counters go under "counters"."""
    ckpt = tr.ckpt
    return {
        "fingerprint": ckpt.fingerprint if ckpt else "",
        "step": tr.step,
        "epoch": tr.epoch,
        "epoch_step": tr.epoch_step,
        "model": tr.model.state_dict(),
        "optimizer": tr.opt.state_dict(),
        "scheduler": tr.sched.state_dict(),
        "scaler": tr.scaler.state_dict() if tr.scaler else {},
        "rng": rng_state(),
        "spikes": tr.health.spikes.state_dict(),
        "counters": {
            **{k: v for p in tr.parts for k, v in p.state_dict().items()},
            "samples_total": tr.samples_total,
            "amp_dtype": str(tr.amp_dtype),  # what precision=auto chose: a resumed run keeps it
            "elapsed": tr.elapsed_before + time.perf_counter() - tr.t_start,
        },
        "rows": tr.result.rows,
        "events": tr.result.events,
        "summary": tr.result.summary,
        "extra": dict(ckpt.extra) if ckpt else {},
    }


def restore(tr, state: dict[str, Any]) -> None:
    """A checkpoint's state into a new trainer, before its first step."""
    tr.model.load_state_dict(state["model"])
    tr.opt.load_state_dict(state["optimizer"])
    tr.sched.load_state_dict(state["scheduler"])
    if tr.scaler and state["scaler"]:
        tr.scaler.load_state_dict(state["scaler"])
    tr.health.spikes.load_state_dict(state["spikes"])
    set_rng_state(state["rng"])
    tr.step, tr.epoch, tr.epoch_step = state["step"], state["epoch"], state["epoch_step"]
    c = state["counters"]
    for part in tr.parts:
        part.load_state_dict(c)
    tr.samples_total, tr.elapsed_before = c["samples_total"], c["elapsed"]
    if c.get("amp_dtype") == str(torch.bfloat16) and tr.t.precision == "auto":
        tr.amp_dtype = torch.bfloat16
    tr.result.events[:] = state["events"]
    tr.result.rows = list(state["rows"])
    tr.result.summary = dict(state["summary"])
    tr.resumed_from = tr.step
    log.info("resumed from the checkpoint at step %d (epoch %d)", tr.step, tr.epoch + 1)
