"""The parts of the training loop and the one interface they share.

The loop (pipeline/train/loop.py) calls each hook on every part of `Trainer.parts`, in the list's
order, at one point of the run; a part overrides the hooks it needs and inherits the rest, which
do nothing. A new part is a new module with a TrainPart and a place in that list; a part that is
not configured is not in the list (no fault: no FaultInjector), so it costs a step nothing. `tr`
is the Trainer (its model, optimizer, scaler, health, step, result, the other parts). The hooks,
in the order a run calls them, and which parts use them: docs/architecture.md ("Training: a loop
and its parts"). state_dict / load_state_dict: the part's counters in a checkpoint's "counters".
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Optional


@dataclass
class Step:
    """One optimizer step as the parts see it once its decision is known."""

    step: int
    log_step: bool  # its row is logged
    code: int = 0  # step_health's code: what went wrong, bit by bit
    values: Optional[list[float]] = None  # the step's one read (step_health.step_readout)
    skip: bool = False  # the update was not applied
    samples: int = 0  # rows trained on, every rank's
    flow_steps: float = 0  # flow steps run and used, summed over the micro-batches
    steps_used: float = 0
    used_max: Optional[float] = None  # the masked loop: the most flow steps a batch needed
    lr: Optional[float] = None  # the LR the update applied (None: skipped)
    untimed_s: Optional[float] = None  # a sampled step's time (counted or profiled: not timed)


class TrainPart:
    """A part of the loop: every hook does nothing until a part overrides it."""

    def running(self, tr) -> ContextManager:
        return contextlib.nullcontext()

    def on_start(self, tr) -> None: ...

    def before_backward(self, tr, loss):
        return loss

    def after_backward(self, tr) -> None: ...

    def before_update(self, tr) -> None: ...

    def after_update(self, tr) -> None: ...

    def after_step(self, tr, s: Step) -> None: ...

    def on_log(self, tr, row: dict) -> None: ...

    def on_step_end(self, tr, s: Step) -> None: ...

    def on_epoch_end(self, tr) -> None: ...

    def on_end(self, tr, reason: str) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, counters: dict[str, Any]) -> None: ...
