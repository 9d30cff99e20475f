"""How many flow steps the masked flow loop runs (pipeline/model/energy_flow.py): a fixed count,
so a step needs no host read to know when every flow has arrived.

It starts at the model's masked_step_cap, a count no batch can exceed (every flow has arrived by
then, or the compacting loop stops there too), and after the first FLOW_STEPS_OBSERVED steps runs
one more than any batch has needed. A batch that needs more is an overrun: the trainer does not
apply its update, and the count goes up. The compacting loop has no fixed count (None). A part of
the loop (pipeline/train/parts.py): it fits the count once a step's read is in.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from pipeline.model import EnergyFlowModel, FlowOutput
from pipeline.train.parts import Step, TrainPart
from pipeline.train.step_health import OVERRUN

log = logging.getLogger(__name__)

FLOW_STEPS_OBSERVED = 10  # steps the masked loop runs at its cap before fitting its length


class FlowLength(TrainPart):
    """Owns the model's `fixed_steps` while training with the masked loop."""

    def __init__(self, model: EnergyFlowModel, masked: bool):
        self.model, self.masked = model, masked
        self.cap = model.masked_step_cap
        model.fixed_steps = self.cap if masked else None
        self.seen = 0  # the most flow steps a batch has needed so far

    def after_step(self, tr, s: Step) -> None:
        if s.used_max is not None:  # the masked loop's step
            self.fit(s.step, int(s.used_max), bool(s.code & OVERRUN))

    def state_dict(self) -> dict:
        return {"flow_steps_seen": self.seen, "fixed_steps": self.model.fixed_steps}

    def load_state_dict(self, counters: dict) -> None:
        """A checkpoint's counts: a resumed run goes on with the length it had reached."""
        self.seen = counters.get("flow_steps_seen", 0)
        if self.masked and counters.get("fixed_steps"):
            self.model.fixed_steps = counters["fixed_steps"]

    def fit(self, step: int, used: int, overrun: bool) -> None:
        """After a masked step that needed `used` flow steps: flow_cap while the first batches show
        what they need, then one more than the most any batch has needed; after an overrun two
        more (a CUDA graph is captured anew for each count, so it moves rarely and only up)."""
        self.seen = max(self.seen, used)
        fixed = self.model.fixed_steps
        if overrun:
            # (At the cap no flow can still be travelling; should float rounding leave one, the
            # loop runs to max_steps, where it ends as the compacting loop does.)
            fixed = min(self.cap, fixed + 2) if fixed < self.cap else self.model.max_steps
        elif step == FLOW_STEPS_OBSERVED:
            fixed = min(self.cap, self.seen + 1)
        if fixed != self.model.fixed_steps:
            log.info(
                "step %d: the masked flow loop now runs %d flow steps (batches so far needed up to %d)",
                step,
                fixed,
                self.seen,
            )
            self.model.fixed_steps = fixed


def add_masked_counters(total: Optional[torch.Tensor], out: FlowOutput) -> torch.Tensor:
    """A micro-batch's masked-loop counters added to the step's, on the device: [flow steps used
    (summed), flow steps used (most), flow steps run, unfinished (any)]."""
    used = torch.stack([out.steps_used, out.steps_used, out.flow_steps, out.unfinished.long()])
    if total is None:
        return used
    return torch.stack([total[0] + used[0], torch.maximum(total[1], used[1]), total[2] + used[2], total[3] | used[3]])
