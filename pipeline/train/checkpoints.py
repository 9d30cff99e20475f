"""When the trainer writes its resumable state (pipeline/train/resume_state.py holds what it is
and how it is written): every `every` steps at a log boundary, and once more when a stop signal
ends the run mid-window. Only rank 0 writes; every rank resumes from rank 0's file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from pipeline.train.resume_state import save_state


@dataclass
class Checkpointing:
    """Where and how often to write resumable state, and (optionally) a state to resume from."""

    path: Path
    fingerprint: str
    every: int
    extra: dict = field(default_factory=dict)  # stored with each checkpoint (the MLflow run id)
    resume_from: Optional[dict] = None  # a state from train_state.load_state
    before_save: Optional[Callable[[], None]] = None  # e.g. flush buffered metrics: a resumed run keeps them

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def save(self, state: Callable[[], dict[str, Any]]) -> None:
        """Write `state()`, taken after before_save has run."""
        if self.before_save:
            self.before_save()
        save_state(self.path, state())
