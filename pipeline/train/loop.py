"""The training loop: AdamW, clipping, mixed precision, skip-and-recover, as a short loop plus parts.

`Trainer._run` runs the epochs, `_train_step` one optimizer step: forward and backward of its
micro-batches (device.py autocast, loss_scaler.py), the health read-out (step_health.py: norms,
clipping, the spike test, the step's one host read; on a log step the window's device-side sums
ride along), then the update or its skip. Everything around that is a part (parts.py: hooks the
loop calls on each part of `self.parts`, in order), so a new part is a new module and a place in
that list, not an edit of the loop. Nothing of a step survives it: the loss kept for logging is
detached, and `torch.cuda.empty_cache()` is never called (the prototype measured it as a slowdown).

Distributed (torchrun; pipeline/core/distributed.py): each rank trains on its own batches through
DistributedDataParallel, which averages the gradients once per optimizer step (the micro-batches
before the last run under no_sync); the loss is averaged over ranks with one all-reduce and the
skip flags are max-reduced, so every rank takes the same decision. Only rank 0 writes checkpoints.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional

import torch

from pipeline.core.distributed import Dist
from pipeline.model import energy_flow_loss
from pipeline.train.checkpoints import Checkpointing, restore
from pipeline.train.device import autocast, build_model, choose_precision, device_and_precision
from pipeline.train.events import StepEvents, skips
from pipeline.train.faults import injector_for
from pipeline.train.flow_length import FLOW_STEPS_OBSERVED, FlowLength, add_masked_counters
from pipeline.train.loss_scaler import build_scaler
from pipeline.train.optimizer import build_optimizer, loss_weights
from pipeline.train.parts import Step
from pipeline.train.plan import DurationWatch, batch_loader
from pipeline.train.progress import Progress
from pipeline.train.result import TrainingDiverged, TrainResult, summarise
from pipeline.train.run_settings import anomaly_detection, run_settings
from pipeline.train.step_counters import StepSample, sampled_step
from pipeline.train.step_health import NONFINITE, StepHealth
from pipeline.train.stop_signals import DeferredStop
from pipeline.train.telemetry import PhaseTimer, sample_due
from pipeline.train.validation import Validation
from pipeline.train.window import TelemetryWindow

# FLOW_STEPS_OBSERVED (flow_length's) too: the benchmarks plan their steps around the trainer's.
__all__ = ["FLOW_STEPS_OBSERVED", "Trainer", "train_model"]


class Trainer:
    def __init__(
        self,
        cfg,
        train_inputs,
        train_targets,
        val_inputs=None,
        val_targets=None,
        *,
        on_log: Optional[Callable[[dict, int], None]] = None,
        progress: bool = True,
        checkpointing: Optional[Checkpointing] = None,
        place: Dist = Dist(),
    ):
        t = self.t = cfg.train
        self.place, self.on_log, self.ckpt = place, on_log, checkpointing
        torch.manual_seed(cfg.run.seed)
        self.device, self.amp_dtype = device_and_precision(t, place, report=place.is_main)
        self.model, self.forward, self.runner = build_model(cfg, int(train_inputs.shape[1]), self.device, place)
        self.masked = self.model.uses_masked_loop(self.device)
        self.flow_length = FlowLength(self.model, self.masked)
        self.loader, self.steps_per_epoch = batch_loader(cfg, train_inputs, train_targets, self.device, place)
        self.total_steps = t.epochs * self.steps_per_epoch
        self.opt, self.sched = build_optimizer(self.model, t, self.total_steps)
        self.loss_weights = loss_weights(t)
        self.scaler = build_scaler(t.scaler, self.device, self.amp_dtype, place.all_reduce if place.enabled else None)
        agree = (lambda flags: place.all_reduce(flags, "max")) if place.enabled else None
        self.health = StepHealth.from_config(self.model, t, self.device, agree)
        self.faults = injector_for(cfg.fault, self.model, rank=place.rank)  # None: no fault configured
        self.timer = PhaseTimer(self.device)
        # The latest sampled step's counts (in every row until the next); what precision=auto timed.
        self.sample, self.precision_ms = StepSample(), {}
        self.val = (val_inputs, val_targets) if val_inputs is not None and len(val_inputs) else None
        self.result = TrainResult(self.model, module_names=list(self.health.module_names))
        self.events = StepEvents(place.is_main, t.max_consecutive_skips, self.result.events)  # rank 0 reports
        self.window = TelemetryWindow(self.device, t.grad_accum)
        # The parts, in the order each hook is called (parts.py): the loop length is fitted before events
        # name an overrun's; a checkpoint is written before the next window opens; stop signals come last.
        self.parts = [
            self.flow_length,
            self.faults,
            Validation(*self.val) if self.val else None,
            Progress(progress),
            checkpointing,
            self.window,
            self.events,
            DurationWatch(self.total_steps, 0, place.is_main),
            DeferredStop(),
        ]
        self.parts = [p for p in self.parts if p is not None]
        # Position and counters: into a checkpoint with the rest (checkpoints.trainer_state).
        self.step = self.epoch = self.epoch_step = self.samples_total = self.resumed_from = 0
        self.elapsed_before = 0.0  # seconds trained by earlier (killed) processes of this run
        if checkpointing and checkpointing.resume_from:
            restore(self, checkpointing.resume_from)

    def call(self, hook: str, *args) -> None:
        for part in self.parts:
            getattr(part, hook)(self, *args)

    # ------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        with run_settings(self.t, self.place, self.device, self.amp_dtype), contextlib.ExitStack() as around:
            for part in self.parts:
                around.enter_context(part.running(self))
            try:
                return self._run()
            except TrainingDiverged:  # events.py: too many skipped steps in a row
                self.end("diverged")
                raise

    def start(self) -> None:
        """What a run (or a resumed one) does before its first step."""
        self.t_start = time.perf_counter()
        choose_precision(self)
        self.call("on_start")

    def _run(self) -> TrainResult:
        t = self.t
        self.start()
        while self.epoch < t.epochs:
            self.loader.set_epoch(self.epoch)
            batches = self.loader.batches(self.epoch_step * t.grad_accum)
            while self.epoch_step < self.steps_per_epoch:
                self._train_step(batches)
            self.call("on_epoch_end")
            self.epoch += 1
            self.epoch_step = 0
        self.end("done")
        return self.result

    def _train_step(self, batches) -> None:
        self.step += 1
        self.epoch_step += 1
        s = Step(self.step, log_step=self.step % self.t.log_every == 0 or self.step == self.total_steps)
        # Now and then a step is counted (host reads, ops) or, on CUDA, profiled (kernels, busy):
        # never both in one step, and neither step's time enters the row's step time.
        kind = sample_due(s.step, self.device.type)
        t0 = time.perf_counter()
        with sampled_step(kind, self.sample, self.opt, self.device):
            self._step_work(batches, s)
        if kind:
            s.untimed_s = time.perf_counter() - t0
        self.samples_total += s.samples
        self.call("after_step", s)
        if s.log_step:
            self.window.log_row(self, s.values)
        self.call("on_step_end", s)

    def _step_work(self, batches, s: Step) -> None:
        """One optimizer step: forward and backward of each micro-batch, the health read-out (the
        step's one host read) and the update (or its skip); what it found goes into `s`."""
        loss_sum, ranges, flow = self._forward_backward(batches, s)
        if self.place.enabled:  # the global batch's loss, as one process would compute it
            # In place: loss_sum is this step's own detached sum, nothing else holds it.
            loss_sum = self.place.all_reduce(loss_sum) / self.place.world_size
        self.call("after_backward")
        if self.scaler:
            self.scaler.unscale_(self.opt)  # clipping and norms see true gradients
        code_t, threshold_t = self.health.measure(loss_sum, flow[3].bool() if flow is not None else None)
        scale_t = self.scaler.scale_tensor() if self.scaler else None
        values = self.health.step_readout(code_t, loss_sum, threshold_t, scale_t, s.log_step, ranges, flow)  # the sync
        if flow is not None:
            values, (used_sum, s.used_max, flow_steps, _) = values[:-4], values[-4:]
            s.steps_used += used_sum
            s.flow_steps += flow_steps
        s.values, s.code = values, int(values[0])
        s.skip = skips(s.code, self.t.skip_spikes)
        if not s.skip:
            self._update(s)
        if self.scaler:
            self.scaler.end_step(overflowed=bool(s.code & NONFINITE))
        self.opt.zero_grad(set_to_none=True)
        self.timer.lap("optimizer")

    def _forward_backward(self, batches, s: Step):
        """Forward and backward of the micro-batches: the step's detached loss (their mean), a log
        step's value ranges and the masked loop's device counters (None: compacting loop)."""
        t, timer = self.t, self.timer
        ranges = loss_sum = flow = None
        for micro in range(t.grad_accum):
            t_data = time.perf_counter()
            x, y = (b.to(self.device, non_blocking=True) for b in next(batches))
            timer.add_host("data", time.perf_counter() - t_data)
            timer.start()
            # DDP all-reduces the gradients in the backward of the step's last micro-batch only.
            last = micro == t.grad_accum - 1
            self.model.record_ranges = s.log_step and last
            no_sync = self.forward.no_sync() if self.place.enabled and not last else contextlib.nullcontext()
            with anomaly_detection(s.step, t), no_sync:
                with autocast(self):
                    out = self.runner(x, self.amp_dtype)
                loss = energy_flow_loss(out.pred.float(), y, **self.loss_weights)
                for part in self.parts:
                    loss = part.before_backward(self, loss)
                timer.lap("forward")
                scaled = loss / t.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            timer.lap("backward")
            part = loss.detach() / t.grad_accum
            loss_sum = part if loss_sum is None else loss_sum + part
            ranges = out.ranges if last else None
            if self.masked:  # device counters: read with the step's one read
                flow = add_masked_counters(flow, out)
            else:  # python ints: known on the host already
                s.flow_steps += out.flow_steps
                s.steps_used += out.steps_used
            s.samples += len(x) * self.place.world_size  # every rank's batch is this size
            del out, loss, scaled  # nothing of this micro-batch's graph outlives it
        self.model.record_ranges = False  # validation and evaluation forwards record nothing
        return loss_sum, ranges, flow

    def _update(self, s: Step) -> None:
        """The optimizer and LR-schedule step of a step that is not skipped."""
        before = self.health.snapshot() if self.window.steps == 0 else None  # once a window
        self.call("before_update")
        s.lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.call("after_update")
        if before is not None:
            self.health.record_update(before)  # the window's sampled update/weight ratio
        self.sched.step()

    def end(self, reason: str) -> None:
        """The run ends: "done", "diverged" (the evidence goes into the result) or "stop" (a
        signal: the parts write a checkpoint of this step)."""
        if reason != "done" and self.window.steps:
            self.window.log_row(self, None)
        self.call("on_end", reason)
        if reason != "stop":
            summarise(self)


def train_model(cfg, train_inputs, train_targets, val_inputs=None, val_targets=None, **kwargs) -> TrainResult:
    """Train the energy-flow model on (memory-mapped) embedding arrays; return model and telemetry.
    The keywords are Trainer's: with `place` from distributed.process_group this process is one
    rank of a DDP job (the arrays are the whole splits: each rank reads its own batches of them);
    `on_log(metrics, step)` receives each telemetry row and each epoch's validation metrics."""
    return Trainer(cfg, train_inputs, train_targets, val_inputs, val_targets, **kwargs).run()
