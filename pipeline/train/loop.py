"""The training loop: AdamW, clipping, mixed precision, skip-and-recover, as a short loop plus parts.

`Trainer._run` runs the epochs, `_train_step` one optimizer step: forward and backward of its
micro-batches (device.py autocast, loss_scaler.py), the health read-out (step_health.py: norms,
clipping, the spike test, the step's one host read), the update or its skip. Everything around
that is a part (parts.py: one interface, hooks the loop calls on each part of `self.parts` in
order): the masked loop's length (flow_length.py), faults (faults.py, only when configured),
validation (validation.py), the bar (progress.py), checkpoints (checkpoints.py), the telemetry
window (window.py, with telemetry.py and step_counters.py), events and giving up (events.py), the
duration warning (plan.py) and stop signals (stop_signals.py). A new part is a new module and a
place in that list, not an edit of the loop.

Host syncs are rationed (each costs a pipeline stall on a GPU): one small read per step carries
the skip decision, and on a log step the window's device-side accumulators in the same read
(pipeline/train/step_health.py). The model's flow loop reads one integer per flow step on its own.
Nothing of a step survives it: the loss kept for logging is detached, and
`torch.cuda.empty_cache()` is never called (the prototype measured it as a slowdown).

Distributed (torchrun; pipeline/core/distributed.py): the model is wrapped in DistributedDataParallel
and each rank trains on its own batches (BatchLoader's rank slice). DDP averages the gradients in
backward (once per optimizer step: the micro-batches before the last run under no_sync), the loss
is averaged over ranks with one all-reduce, and the skip flags are max-reduced, so every rank
measures the same reduced gradients and takes the same decision. Only rank 0 writes checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Callable, Optional

import torch

from pipeline.core.distributed import Dist, device_for
from pipeline.core.errors import PipelineError
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.checkpoints import Checkpointing, restore
from pipeline.train.cuda_graph import FlowRunner, why_eager
from pipeline.train.device import (
    fastest_precision,
    precision_candidates,
    select_device,
    select_precision,
    slow_precision_warning,
)
from pipeline.train.events import StepEvents, skips
from pipeline.train.faults import injector_for
from pipeline.train.flow_length import FLOW_STEPS_OBSERVED, FlowLength, add_masked_counters
from pipeline.train.loss_scaler import build_scaler
from pipeline.train.parts import Step
from pipeline.train.plan import DurationWatch
from pipeline.train.progress import Progress
from pipeline.train.result import TrainingDiverged, TrainResult, summarise
from pipeline.train.run_settings import run_settings
from pipeline.train.step_counters import StepSample, sampled_step
from pipeline.train.step_health import NONFINITE, StepHealth
from pipeline.train.stop_signals import StopSignals
from pipeline.train.telemetry import PhaseTimer, reset_peak, sample_due
from pipeline.train.validation import Validation
from pipeline.train.window import TelemetryWindow

log = logging.getLogger(__name__)

# The trainer's API; FLOW_STEPS_OBSERVED is flow_length's, named here too for the benchmarks that
# plan their steps around the trainer's.
__all__ = ["FLOW_STEPS_OBSERVED", "Trainer", "loss_weights", "lr_lambda", "train_model"]


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to 10 % of the peak LR."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def loss_weights(t) -> dict[str, float]:
    """The loss's terms from train.*: energy_flow_loss's keyword arguments."""
    return {"cosine_weight": t.cosine_weight, "nce_weight": t.nce_weight, "nce_temperature": t.nce_temperature}


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
        self.device = device = select_device(device_for(t.device, place))  # a CUDA rank: cuda:LOCAL_RANK
        self.amp_dtype = select_precision(t.precision, device)
        if (slow := slow_precision_warning(t.precision, device)) and place.is_main:
            log.warning(slow)
        self.model = EnergyFlowModel.from_config(cfg.model, int(train_inputs.shape[1])).to(device)
        self.model.train()
        self.model.flow_loop = str(t.flow_loop)
        self.masked = self.model.uses_masked_loop(device)
        self.flow_length = FlowLength(self.model, self.masked)
        # The forward pass (and backward's gradient all-reduce) go through DDP; everything else
        # (health, checkpoints, evaluation) uses the model itself. All parameters take part in
        # every forward (checked: no gradient is None at batch 1, 4 or 16), so no unused-parameter
        # search; the model has no buffers, so DDP has none to broadcast.
        self.forward = self.model
        if place.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.forward = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        anomaly = t.detect_anomaly_steps > 0
        eager = why_eager(self.model, device, processes=place.world_size, grad_accum=t.grad_accum, anomaly=anomaly)
        self.runner = FlowRunner(self.model, self.forward, device, str(t.cuda_graph), eager)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
        self.loader = BatchLoader(
            train_inputs,
            train_targets,
            t.batch_size,
            shuffle=True,
            seed=cfg.run.seed,
            drop_last=len(train_inputs) > t.batch_size,
            pin_memory=device.type == "cuda",
            prefetch=t.prefetch,
            rank=place.rank,
            world_size=place.world_size,
        )
        self.steps_per_epoch = len(self.loader) // t.grad_accum
        if self.steps_per_epoch == 0:
            procs = f" * {place.world_size} processes" if place.enabled else ""
            raise PipelineError(
                f"the train split has {len(train_inputs)} rows: fewer than train.batch_size * train.grad_accum"
                f"{procs} = {t.batch_size * t.grad_accum * place.world_size}, so not one optimizer step fits; "
                "lower one of them"
            )
        self.total_steps = t.epochs * self.steps_per_epoch
        self.loss_weights = loss_weights(t)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t.warmup_steps, self.total_steps))
        self.scaler = build_scaler(t.scaler, device, self.amp_dtype, place.all_reduce if place.enabled else None)
        agree = (lambda flags: place.all_reduce(flags, "max")) if place.enabled else None
        self.health = StepHealth.from_config(self.model, t, device, agree)
        self.faults = injector_for(cfg.fault, self.model, rank=place.rank)  # None: no fault configured
        self.timer = PhaseTimer(device)
        # The latest sampled step's counts (pipeline/train/step_counters.py), in every row until
        # the next sample; `precision_ms` what train.precision=auto timed and chose.
        self.sample, self.precision_ms = StepSample(), {}
        self.val = (val_inputs, val_targets) if val_inputs is not None and len(val_inputs) else None
        self.result = TrainResult(self.model, module_names=list(self.health.module_names))
        # The ranks take the decision together: rank 0 reports it.
        self.events = StepEvents(place.is_main, t.max_consecutive_skips, self.result.events)
        self.window = TelemetryWindow(device, t.grad_accum)
        # The parts, in the order each hook is called (parts.py): the loop length is fitted before
        # events name an overrun's new length; the bar counts before a run that keeps skipping
        # gives up; a checkpoint is written before the next window opens; stop signals come last.
        self.parts = [
            self.flow_length,
            self.faults,
            Validation(*self.val) if self.val else None,
            Progress(progress),
            checkpointing,
            self.window,
            self.events,
            DurationWatch(self.total_steps, 0, place.is_main),
            StopSignals(),
        ]
        self.parts = [p for p in self.parts if p is not None]
        # Position and counters: all of it goes into a checkpoint (checkpoints.trainer_state).
        self.step = self.epoch = self.epoch_step = self.samples_total = self.resumed_from = 0
        self.elapsed_before = 0.0  # seconds trained by earlier (killed) processes of this run
        if checkpointing and checkpointing.resume_from:
            restore(self, checkpointing.resume_from)

    def _call(self, hook: str, *args) -> None:
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
        candidates = precision_candidates(self.t.precision, self.device)
        if len(candidates) > 1 and self.step == 0:
            self.amp_dtype = fastest_precision(self, candidates)
        self._call("on_start")

    def _run(self) -> TrainResult:
        t = self.t
        self.start()
        while self.epoch < t.epochs:
            self.loader.set_epoch(self.epoch)
            batches = self.loader.batches(self.epoch_step * t.grad_accum)
            while self.epoch_step < self.steps_per_epoch:
                self._train_step(batches)
            self._call("on_epoch_end")
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
        self._call("after_step", s)
        if s.log_step:
            self.log_row(s.values)
        self._call("on_step_end", s)

    def _step_work(self, batches, s: Step) -> None:
        """One optimizer step: forward and backward of each micro-batch, the health read-out (the
        step's one host read) and the update (or its skip); what it found goes into `s`."""
        loss_sum, ranges, flow = self._forward_backward(batches, s)
        if self.place.enabled:  # the global batch's loss, as one process would compute it
            # In place: loss_sum is this step's own detached sum, nothing else holds it.
            loss_sum = self.place.all_reduce(loss_sum) / self.place.world_size
        self._call("after_backward")
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
        """Forward and backward of the step's micro-batches. Returns the step's detached loss (the
        micro-batches' mean), the value ranges of a log step's last micro-batch (read with the
        step's one read) and the masked loop's device counters (None with the compacting loop)."""
        t, timer = self.t, self.timer
        anomaly = s.step <= t.detect_anomaly_steps
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
            with torch.autograd.set_detect_anomaly(anomaly, check_nan=True), no_sync:
                try:
                    with self.autocast():
                        out = self.runner(x, self.amp_dtype)
                    loss = energy_flow_loss(out.pred.float(), y, **self.loss_weights)
                    for part in self.parts:
                        loss = part.before_backward(self, loss)
                    timer.lap("forward")
                    scaled = loss / t.grad_accum
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                except RuntimeError as e:
                    if not anomaly:
                        raise
                    raise PipelineError(
                        f"step {s.step}: anomaly detection (train.detect_anomaly_steps="
                        f"{t.detect_anomaly_steps}) stopped the run: {e}. The traceback printed "
                        "above it shows the forward operation that produced the value."
                    ) from None
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
        self._call("before_update")
        s.lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self._call("after_update")
        if before is not None:
            self.health.record_update(before)  # the window's sampled update/weight ratio
        self.sched.step()

    def autocast(self, dtype="run"):
        dtype = self.amp_dtype if dtype == "run" else dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype, cache_enabled=self.runner.autocast_cache())

    def log_row(self, values: Optional[list[float]]) -> None:
        """Close the window into a telemetry row; `values` is this step's read (None: read now)."""
        if values is None:  # the run is ending mid-window: one extra read, once
            zero = torch.zeros((), device=self.device)
            scale = self.scaler.scale_tensor() if self.scaler else None
            values = self.health.step_readout(zero, zero, zero, scale, True)
        row = self.window.close(self, values)
        self.result.rows.append(row)
        self._call("on_log", row)
        if self.on_log:
            self.on_log(row, self.step)
        reset_peak(self.device)

    def end(self, reason: str) -> None:
        """The run ends: "done", "diverged" (the evidence goes into the result) or "stop" (a
        signal: the parts write a checkpoint of this step)."""
        if reason != "done" and self.window.steps:
            self.log_row(None)
        self._call("on_end", reason)
        if reason != "stop":
            summarise(self)


def train_model(cfg, train_inputs, train_targets, val_inputs=None, val_targets=None, **kwargs) -> TrainResult:
    """Train the energy-flow model on (memory-mapped) embedding arrays; return model and telemetry.

    With `place` from distributed.process_group, this process is one rank of a DDP job and the
    arrays are the whole splits: each rank reads its own batches of them.

    `on_log(metrics, step)` receives each telemetry row and each epoch's validation metrics
    (the stage points it at MLflow; tests leave it out). The keywords are Trainer's."""
    return Trainer(cfg, train_inputs, train_targets, val_inputs, val_targets, **kwargs).run()
