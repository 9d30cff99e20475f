"""The run's skipped and flagged steps: the events file's entries, the counts a checkpoint keeps,
the warnings printed and the message a run that keeps skipping stops with.

What a step does when something goes wrong, and why (the trainers we trust differ here):
- A non-finite loss or gradient skips the step, as Megatron and DeepSpeed do for fp16 overflow:
  no optimizer step, no LR-schedule step, gradients zeroed; the GradScaler backs off. The event
  names the step, the kind (nan/inf, loss/grad) and the first module whose gradient was
  non-finite. After `max_consecutive_skips` in a row the run stops with an error instead of
  spinning (transformers raises after 100 GradScaler overflows in a row; torchtitan stops at once).
- A loss spike (above mean + k std of the trailing window) is flagged, and skipped if
  `skip_spikes` is set (OLMo-core's choice).
- An overrun (the masked flow loop was shorter than a batch needed) is not a fault: the update is
  not applied and the loop is lengthened (pipeline/train/flow_length.py); it never counts towards
  the consecutive skips.
"""

from __future__ import annotations

import logging
from typing import Optional

from pipeline.train.parts import Step, TrainPart
from pipeline.train.result import TrainingDiverged
from pipeline.train.step_health import NONFINITE, OVERRUN, SPIKE, decode_kind

log = logging.getLogger(__name__)

EVENT_LOG_MAX = 10  # events printed one by one; the rest are counted (all are in the events file)
COUNTERS = ("consecutive_skips", "skipped_total", "spikes_total", "overruns_total")  # into a checkpoint


def skips(code: int, skip_spikes: bool) -> bool:
    """Whether a step with this health code leaves its update unapplied."""
    return bool(code & NONFINITE) or bool(code & SPIKE and skip_spikes) or bool(code & OVERRUN)


class StepEvents(TrainPart):
    """The event list and the run's counts of skipped, flagged and overrun steps; the part of the
    loop that ends a run after `limit` skipped steps in a row (TrainingDiverged)."""

    def __init__(self, report: bool, limit: int = 0, events: Optional[list[dict]] = None):
        self.report = report  # this process prints the warnings (rank 0: the ranks decide together)
        self.limit = limit  # train.max_consecutive_skips
        self.events: list[dict] = [] if events is None else events  # the result's list: filled in place
        self.consecutive_skips = self.skipped_total = self.spikes_total = self.overruns_total = 0

    def after_step(self, tr, s: Step) -> None:
        self.count(s.code, s.skip)
        if s.code & (NONFINITE | SPIKE):
            # get_scale() reads the device: only for a non-finite step, which is rare
            scale = tr.scaler.get_scale() if tr.scaler and s.code & NONFINITE else None
            self.record(s.step, s.code, s.values[1], s.values[2], s.skip, tr.health.nonfinite_modules(s.code), scale)
        if s.code & OVERRUN:
            self.overrun(s.step, tr.model.fixed_steps)
        if self.consecutive_skips >= self.limit:
            raise TrainingDiverged(self.divergence(s.step, self.limit), tr.result)

    def count(self, code: int, skipped: bool) -> None:
        """The step's decision, as soon as it is known."""
        if code & OVERRUN:
            self.overruns_total += 1
        if not skipped:
            self.consecutive_skips = 0
        elif not code & OVERRUN:  # an overrun is the loop's length, not the run's health
            self.consecutive_skips += 1
            self.skipped_total += 1

    def record(
        self,
        step: int,
        code: int,
        loss: float,
        threshold: float,
        skipped: bool,
        modules: list[str],
        scale: Optional[float],
    ) -> None:
        """A non-finite or spiking step. `modules`: those with a non-finite gradient, nearest the
        loss first; `scale`: the loss scale after the scaler's back-off (None without one)."""
        kind = decode_kind(code)
        if kind:
            event = {
                "step": step,
                "kind": kind,
                "module": modules[0] if modules else None,
                "modules": modules,
                "action": "skipped",
            }
            if scale is not None:
                event["scale"] = scale
                event["action"] = "skipped; scaler backed off"
        else:
            event = {
                "step": step,
                "kind": "loss_spike",
                "loss": loss,
                "threshold": threshold,
                "action": "skipped" if skipped else "flagged",
            }
        self.events.append(event)
        if kind is None:
            self.spikes_total += 1
        if not self.report:
            return
        if len(self.events) <= EVENT_LOG_MAX:
            where = f" (first non-finite gradient: {event['module']})" if event.get("module") else ""
            detail = f" loss {loss:.4g} > {threshold:.4g}" if kind is None else ""
            log.warning("step %d: %s%s%s -> %s", step, event["kind"], detail, where, event["action"])
        elif len(self.events) == EVENT_LOG_MAX + 1:
            log.warning("more events follow; all are in the events file and the stability report")

    def overrun(self, step: int, flow_steps: int) -> None:
        """Not a fault: the masked loop was shorter than this batch needed. Its update was not
        applied (it would differ from the compacting loop's), and the loop is now longer."""
        self.events.append({"step": step, "kind": "flow_overrun", "action": f"skipped; flow steps now {flow_steps}"})

    def divergence(self, step: int, limit: int) -> str:
        """Why the run stops after `limit` skipped steps in a row, and what to change."""
        event = self.events[-1]
        cause = (
            f"{event['kind']} in {event.get('module') or 'the loss'}"
            if event["kind"] != "loss_spike"
            else "loss spikes"
        )
        return (
            f"{self.consecutive_skips} consecutive skipped steps (last at step {step}, {cause}): stopping "
            f"instead of spinning (train.max_consecutive_skips={limit}). Lower "
            f"train.lr, set train.grad_clip (e.g. 1.0), use train.precision=bf16 or a smaller "
            f"train.scaler.init_scale, or check the input embeddings for NaN/Inf."
        )

    def state_dict(self) -> dict:
        """The checkpoint's counters (the events themselves go in beside them)."""
        return {k: getattr(self, k) for k in COUNTERS}

    def load_state_dict(self, counters: dict) -> None:
        """The counts; the events themselves are the result's, restored with it."""
        self.consecutive_skips, self.skipped_total = counters["consecutive_skips"], counters["skipped_total"]
        self.spikes_total = counters["spikes_total"]
        self.overruns_total = counters.get("overruns_total", 0)  # 0 in a checkpoint from before it was counted
