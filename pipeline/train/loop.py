"""The training loop: AdamW, clipping, mixed precision, skip-and-recover, telemetry, checkpoints.

The loop itself is `Trainer._run` (epochs) and `Trainer._train_step` (one optimizer step); each
concern around it is a part in its own module:
- device.py: the device and the autocast dtype; loss_scaler.py: fp16's GradScaler and its recovery
- step_health.py: gradient norms, clipping, the spike test and the step's one host read
- events.py: what a skipped or flagged step records, and when the run gives up
- flow_length.py: the masked flow loop's fixed flow-step count
- window.py, telemetry.py, step_counters.py: telemetry rows, phase timing, sampled steps
- checkpoints.py, resume_state.py, stop_signals.py: resumable state and stopping cleanly
- faults.py: deliberate faults (only built when one is configured); progress.py: the bar
- run_settings.py: the process-wide torch settings of a run; validation.py: the val split's loss

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
from typing import Any, Callable, Optional

import numpy as np
import torch

from pipeline.core.distributed import Dist, device_for
from pipeline.core.errors import PipelineError
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.cuda_graph import FlowRunner, why_eager
from pipeline.train.device import precision_candidates, select_device, select_precision, slow_precision_warning
from pipeline.train.events import StepEvents, skips
from pipeline.train.faults import injector_for
from pipeline.train.flow_length import FLOW_STEPS_OBSERVED, FlowLength, add_masked_counters
from pipeline.train.loss_scaler import build_scaler
from pipeline.train.plan import DurationWatch
from pipeline.train.progress import Progress, log_epoch
from pipeline.train.result import TrainingDiverged, TrainResult, row_figures
from pipeline.train.resume_state import rng_state, set_rng_state
from pipeline.train.run_settings import run_settings
from pipeline.train.step_counters import StepSample, sampled_step
from pipeline.train.step_health import NONFINITE, OVERRUN, SPIKE, StepHealth
from pipeline.train.stop_signals import DeferredStop
from pipeline.train.telemetry import PhaseTimer, reset_peak, sample_due
from pipeline.train.validation import evaluate_loss
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
        self.place = place
        torch.manual_seed(cfg.run.seed)
        self.device = device = select_device(device_for(t.device, place))  # a CUDA rank: cuda:LOCAL_RANK
        self.amp_dtype = select_precision(t.precision, device)
        slow = slow_precision_warning(t.precision, device)
        if slow and place.is_main:
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
        self.forward = (
            torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None
            )
            if place.enabled
            else self.model
        )
        self.runner = FlowRunner(
            self.model,
            self.forward,
            device,
            str(t.cuda_graph),
            why_eager(
                self.model,
                device,
                processes=place.world_size,
                grad_accum=t.grad_accum,
                anomaly=t.detect_anomaly_steps > 0,
            ),
        )
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
            per_step = t.batch_size * t.grad_accum * place.world_size
            procs = f" * {place.world_size} processes" if place.enabled else ""
            raise PipelineError(
                f"the train split has {len(train_inputs)} rows: fewer than train.batch_size * train.grad_accum"
                f"{procs} = {per_step}, so not one optimizer step fits; lower one of them"
            )
        self.total_steps = t.epochs * self.steps_per_epoch
        self.loss_weights = loss_weights(t)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t.warmup_steps, self.total_steps))
        self.scaler = build_scaler(t.scaler, device, self.amp_dtype, place.all_reduce if place.enabled else None)
        self.health = StepHealth(
            self.model,
            grad_clip=t.grad_clip,
            grad_warning=t.grad_warning,
            grad_critical=t.grad_critical,
            spike_window=t.spike_window,
            spike_k=t.spike_k,
            skip_spikes=t.skip_spikes,
            device=device,
            agree=(lambda flags: place.all_reduce(flags, "max")) if place.enabled else None,
        )
        self.faults = injector_for(cfg.fault, self.model, rank=place.rank)  # None: no fault configured
        self.timer = PhaseTimer(device)
        # The latest sampled step's counts (pipeline/train/step_counters.py), in every row until
        # the next sample; `precision_ms` what train.precision=auto timed and chose.
        self.sample = StepSample()
        self.precision_ms: dict[str, float] = {}
        self.val = (val_inputs, val_targets) if val_inputs is not None and len(val_inputs) else None
        self.on_log, self.ckpt = on_log, checkpointing
        self.progress = Progress(progress)
        self.events = StepEvents(report=place.is_main)  # the ranks take the decision together: rank 0 reports it
        self.result = TrainResult(self.model, events=self.events.events, module_names=list(self.health.module_names))
        self.window = TelemetryWindow(device, t.grad_accum)
        # Position and counters: all of it goes into a checkpoint.
        self.step = self.epoch = self.epoch_step = self.samples_total = 0
        self.elapsed_before = 0.0  # seconds trained by earlier (killed) processes of this run
        self.resumed_from = 0
        self.stop: Optional[DeferredStop] = None  # set while run() runs
        if checkpointing and checkpointing.resume_from:
            self._restore(checkpointing.resume_from)

    # ------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        with (
            run_settings(self.t, self.place, self.device, self.amp_dtype),
            self.progress.redirect_logs(),
            DeferredStop() as stop,
        ):
            self.stop = stop
            try:
                return self._run()
            except RuntimeError:
                # The ranks get a stop signal together but each sees it at the end of its own step:
                # a rank that stopped a step ahead leaves this one's collective without its peer
                # (gloo: "Connection closed by peer"). That is the stop this rank was asked for too.
                if stop.requested and self.place.enabled:
                    stop.raise_()
                raise

    def _run(self) -> TrainResult:
        t = self.t
        self._start()
        while self.epoch < t.epochs:
            self.loader.set_epoch(self.epoch)
            batches = self.loader.batches(self.epoch_step * t.grad_accum)
            while self.epoch_step < self.steps_per_epoch:
                self._train_step(batches)
                self.duration.after_step(self.step)
            if self.val:
                self._validate()
            log_epoch(self.result.rows, self.epoch, t.epochs, self.step, self.result.summary if self.val else None)
            self.epoch += 1
            self.epoch_step = 0
        self.progress.close()
        self._summarise()
        return self.result

    def _start(self) -> None:
        """What a run (or a resumed one) does before its first step."""
        self.t_start = time.perf_counter()
        self.progress.start(self.total_steps, self.step)
        self.duration = DurationWatch(self.total_steps, self.step, self.place.is_main)
        candidates = precision_candidates(self.t.precision, self.device)
        if len(candidates) > 1 and self.step == 0:
            self.amp_dtype = self._fastest_precision(candidates)
        reset_peak(self.device)
        self._new_window()

    def _train_step(self, batches) -> None:
        self.step += 1
        self.epoch_step += 1
        step = self.step
        log_step = step % self.t.log_every == 0 or step == self.total_steps
        # Now and then a step is counted (host reads, ops) or, on CUDA, profiled (kernels, busy):
        # never both in one step, and neither step's time enters the row's step time.
        kind = sample_due(step, self.device.type)
        t0 = time.perf_counter()
        with sampled_step(kind, self.sample, self.opt, self.device):
            code, values, skip = self._step_work(batches, step, log_step)
        if kind:
            self.window.add_untimed(time.perf_counter() - t0)
        if self.faults:
            self.faults.after_step(step)  # outside the phases, and its time is taken off the window's
        self.window.steps += 1
        self.progress.step()
        if code & (NONFINITE | SPIKE):
            # get_scale() reads the device: only for a non-finite step, which is rare
            scale = self.scaler.get_scale() if self.scaler and code & NONFINITE else None
            self.events.record(step, code, values[1], values[2], skip, self.health.nonfinite_modules(code), scale)
        if code & OVERRUN:
            self.events.overrun(step, self.model.fixed_steps)
        if self.events.consecutive_skips >= self.t.max_consecutive_skips:
            self._diverged(step)
        if log_step:
            self._log_row(values)
            if self.ckpt and self.ckpt.due(step) and self.place.is_main:
                self.ckpt.save(self.state_dict)
            self._new_window()  # after logging and checkpointing: a row times training steps only
        if self.stop is not None and self.stop.requested:
            self._stop_here(step)

    def _step_work(self, batches, step: int, log_step: bool) -> tuple[int, list[float], bool]:
        """One optimizer step: forward and backward of each micro-batch, the health read-out (the
        step's one host read) and the update (or its skip). Returns the code, the values read
        and whether the update was skipped."""
        loss_sum, ranges, flow = self._forward_backward(batches, step, log_step)
        if self.place.enabled:  # the global batch's loss, as one process would compute it
            # In place: loss_sum is this step's own detached sum, nothing else holds it.
            loss_sum = self.place.all_reduce(loss_sum) / self.place.world_size
        if self.faults:
            self.faults.on_grads(step)  # before unscale_, so the scaler sees an injected inf
        if self.scaler:
            self.scaler.unscale_(self.opt)  # clipping and norms see true gradients
        code_t, threshold_t = self.health.measure(loss_sum, flow[3].bool() if flow is not None else None)
        scale_t = self.scaler.scale_tensor() if self.scaler else None
        values = self.health.step_readout(
            code_t, loss_sum, threshold_t, scale_t, log_step, ranges, flow
        )  # the one sync
        if flow is not None:
            values, (used_sum, used_max, flow_steps, _) = values[:-4], values[-4:]
            self.window.steps_used += used_sum
            self.window.flow_steps += flow_steps
        code = int(values[0])
        skip = skips(code, self.t.skip_spikes)
        self.events.count(code, skip)
        self.window.count(code, skip)
        if not skip:
            self._update(step)
        if self.scaler:
            self.scaler.end_step(overflowed=bool(code & NONFINITE))
        self.opt.zero_grad(set_to_none=True)
        self.timer.lap("optimizer")
        if flow is not None:
            self.flow_length.fit(step, int(used_max), bool(code & OVERRUN))
        return code, values, skip

    def _forward_backward(self, batches, step: int, log_step: bool):
        """Forward and backward of the step's micro-batches. Returns the step's detached loss (the
        micro-batches' mean), the value ranges of a log step's last micro-batch (read with the
        step's one read) and the masked loop's device counters (None with the compacting loop)."""
        t, timer = self.t, self.timer
        anomaly = step <= t.detect_anomaly_steps
        ranges = loss_sum = flow = None
        for micro in range(t.grad_accum):
            t_data = time.perf_counter()
            x, y = (b.to(self.device, non_blocking=True) for b in next(batches))
            timer.add_host("data", time.perf_counter() - t_data)
            timer.start()
            # DDP all-reduces the gradients in the backward of the step's last micro-batch only.
            last = micro == t.grad_accum - 1
            sync = not self.place.enabled or last
            self.model.record_ranges = log_step and last
            with (
                torch.autograd.set_detect_anomaly(anomaly, check_nan=True),
                contextlib.nullcontext() if sync else self.forward.no_sync(),
            ):
                try:
                    with self._autocast():
                        out = self.runner(x, self.amp_dtype)
                    loss = energy_flow_loss(out.pred.float(), y, **self.loss_weights)
                    if self.faults:
                        loss = self.faults.on_loss(step, loss)
                    timer.lap("forward")
                    scaled = loss / t.grad_accum
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                except RuntimeError as e:
                    if not anomaly:
                        raise
                    raise PipelineError(
                        f"step {step}: anomaly detection (train.detect_anomaly_steps="
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
                self.window.flow_steps += out.flow_steps
                self.window.steps_used += out.steps_used
            self.window.samples += len(x) * self.place.world_size  # every rank's batch is this size
            self.samples_total += len(x) * self.place.world_size
            del out, loss, scaled  # nothing of this micro-batch's graph outlives it
        self.model.record_ranges = False  # validation and evaluation forwards record nothing
        return loss_sum, ranges, flow

    def _update(self, step: int) -> None:
        """The optimizer and LR-schedule step of a step that is not skipped."""
        before = self.health.snapshot() if self.window.steps == 0 else None
        with self.faults.lr(step, self.opt) if self.faults else contextlib.nullcontext():
            self.window.lr = max(self.window.lr, self.opt.param_groups[0]["lr"])
            self.opt.step()
        if before is not None:
            self.health.record_update(before)  # the window's sampled update/weight ratio
        self.sched.step()

    def _validate(self) -> None:
        t_val = time.perf_counter()
        val = evaluate_loss(self.model, *self.val, self.t.batch_size, self.loss_weights, self.device, self.place)
        # Not a training step: kept out of perf/step_ms (it showed as a spike at every epoch
        # boundary of the default run).
        self.window.not_steps_s += time.perf_counter() - t_val
        row = {"val/loss": val["loss"], "val/cosine": val["cosine"], "epoch": self.epoch}
        self.result.summary.update({k: v for k, v in row.items() if k != "epoch"})
        if self.on_log:
            self.on_log(row, self.step)

    def _autocast(self, dtype="run"):
        dtype = self.amp_dtype if dtype == "run" else dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype, cache_enabled=self.runner.autocast_cache())

    def _fastest_precision(self, candidates: list[Optional[torch.dtype]]) -> Optional[torch.dtype]:
        """train.precision=auto on CUDA: time forward + backward of the first batch in each
        candidate precision, as the run will execute it (graphs captured where they apply), and
        keep the faster. The gradients are dropped: no update is made, nothing of the run moves."""
        with contextlib.closing(self.loader.batches(0)) as first:  # closing stops a prefetch thread
            x, y = (b.to(self.device) for b in next(first))
        times = {}
        for dtype in candidates:
            name = "fp32" if dtype is None else "bf16"
            spent = []
            for i in range(5):  # the first two warm up (and capture)
                torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                with self._autocast(dtype):
                    out = self.runner(x, dtype)
                energy_flow_loss(out.pred.float(), y, **self.loss_weights).backward()
                torch.cuda.synchronize(self.device)
                spent.append(time.perf_counter() - t0)
                self.opt.zero_grad(set_to_none=True)
            times[name] = 1000 * float(np.median(spent[2:]))
        self.precision_ms = times
        best = min(times, key=times.get)
        log.info(
            "train.precision=auto: %s (forward + backward of one batch: %s)",
            best,
            ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()),
        )
        return None if best == "fp32" else torch.bfloat16

    # ------------------------------------------------------------------ telemetry rows
    def _new_window(self) -> None:
        self.window.open()
        self.health.new_window()

    def _log_row(self, values: Optional[list[float]]) -> None:
        """Close the window into a telemetry row; `values` is this step's read (None: read now)."""
        if values is None:  # the run is stopping mid-window: one extra read, once
            zero = torch.zeros((), device=self.device)
            scale = self.scaler.scale_tensor() if self.scaler else None
            values = self.health.step_readout(zero, zero, zero, scale, True)
        row = self.window.close(
            values,
            step=self.step,
            epoch=self.epoch,
            health=self.health,
            timer=self.timer,
            skipped_total=self.events.skipped_total,
            lr_now=self.opt.param_groups[0]["lr"],
            sample=self.sample,
            faults=self.faults,
            fault_overhead_s=self.faults.take_overhead() if self.faults else 0.0,
        )
        self.result.rows.append(row)
        self.progress.show_loss(row["train/loss"])
        if self.on_log:
            self.on_log(row, self.step)
        reset_peak(self.device)

    def _summarise(self) -> None:
        wall = self.elapsed_before + time.perf_counter() - self.t_start
        t = self.t
        self.result.summary.update(
            {
                **row_figures(self.result.rows),
                "train/steps": self.step,
                "train/planned_steps": self.total_steps,
                "train/skipped_steps": self.events.skipped_total,
                "train/spikes": self.events.spikes_total,
                "train/effective_batch": t.batch_size * t.grad_accum * self.place.world_size,
                "train/processes": self.place.world_size,
                "train/resumed_from_step": self.resumed_from,
                "train/seconds": wall,
                "perf/samples_per_s": self.samples_total / wall if wall > 0 else 0.0,
                "flow/overruns": self.events.overruns_total,
                "flow/loop": 1.0 if self.masked else 0.0,  # 1 masked, 0 compacting
                "perf/cuda_graph": 1.0 if self.runner.enabled else 0.0,
                # train.precision=auto on CUDA: forward + backward of the first batch in each.
                **{f"perf/precision_{k}_ms": v for k, v in self.precision_ms.items()},
                # The report's convergence check judges flow/steps_used against these two bounds.
                "flow/step_cap": min(self.model.max_steps, self.model.step_bound),
                "flow/min_steps_to_arrive": self.model.min_steps_to_arrive,
            }
        )
        if self.scaler:
            self.result.summary["amp/scale"] = self.scaler.get_scale()

    # ------------------------------------------------------------------ stopping early
    def _stop_here(self, step: int) -> None:
        """SIGTERM or Ctrl-C arrived during this step (pipeline/train/stop_signals.py): close the
        telemetry window, write a checkpoint of this step (rank 0, when checkpointing is on) and stop."""
        if self.window.steps:
            self._log_row(None)
        self.progress.close()
        if self.ckpt and self.ckpt.every and self.place.is_main:
            self.ckpt.save(self.state_dict)
            log.warning(
                "stopping at step %d: checkpoint written to %s (the stage resumes from it when run again)",
                step,
                self.ckpt.path,
            )
        self.stop.raise_()

    def _diverged(self, step: int) -> None:
        """Too many skipped steps in a row: write the evidence into the result and stop."""
        self._log_row(None)
        self._summarise()
        self.progress.close()
        raise TrainingDiverged(self.events.divergence(step, self.t.max_consecutive_skips), self.result)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.ckpt.fingerprint if self.ckpt else "",
            "step": self.step,
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else {},
            "rng": rng_state(),
            "spikes": self.health.spikes.state_dict(),
            "counters": {
                **self.events.state_dict(),
                "samples_total": self.samples_total,
                "flow_steps_seen": self.flow_length.seen,
                "fixed_steps": self.model.fixed_steps,
                "amp_dtype": str(self.amp_dtype),  # what precision=auto chose: a resumed run keeps it
                "elapsed": self.elapsed_before + time.perf_counter() - self.t_start,
            },
            "rows": self.result.rows,
            "events": self.result.events,
            "summary": self.result.summary,
            "extra": dict(self.ckpt.extra) if self.ckpt else {},
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.health.spikes.load_state_dict(state["spikes"])
        set_rng_state(state["rng"])
        self.step, self.epoch, self.epoch_step = state["step"], state["epoch"], state["epoch_step"]
        c = state["counters"]
        self.events.load_state_dict(c, list(state["events"]))
        self.samples_total, self.elapsed_before = c["samples_total"], c["elapsed"]
        self.flow_length.restore(c.get("flow_steps_seen", 0), c.get("fixed_steps"))
        if c.get("amp_dtype") == str(torch.bfloat16) and self.t.precision == "auto":
            self.amp_dtype = torch.bfloat16
        self.result.rows = list(state["rows"])
        self.result.summary = dict(state["summary"])
        self.resumed_from = self.step
        log.info("resumed from the checkpoint at step %d (epoch %d)", self.step, self.epoch + 1)


def train_model(
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
) -> TrainResult:
    """Train the energy-flow model on (memory-mapped) embedding arrays; return model and telemetry.

    With `place` from distributed.process_group, this process is one rank of a DDP job and the
    arrays are the whole splits: each rank reads its own batches of them.

    `on_log(metrics, step)` receives each telemetry row and each epoch's validation metrics
    (the stage points it at MLflow; tests leave it out)."""
    return Trainer(
        cfg,
        train_inputs,
        train_targets,
        val_inputs,
        val_targets,
        on_log=on_log,
        progress=progress,
        checkpointing=checkpointing,
        place=place,
    ).run()
