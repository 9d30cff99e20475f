"""The training loop: AdamW, clipping, mixed precision, skip-and-recover, telemetry, checkpoints.

What a step does when something goes wrong, and why (the trainers we trust differ here):
- A non-finite loss or gradient skips the step, as Megatron and DeepSpeed do for fp16 overflow:
  no optimizer step, no LR-schedule step, gradients zeroed; the GradScaler backs off. The event
  names the step, the kind (nan/inf, loss/grad) and the first module whose gradient was
  non-finite. After `max_consecutive_skips` in a row the run stops with an error instead of
  spinning (transformers raises after 100 GradScaler overflows in a row; torchtitan stops at once).
- A loss spike (above mean + k std of the trailing window) is flagged, and skipped if
  `skip_spikes` is set (OLMo-core's choice).

Host syncs are rationed (each costs a pipeline stall on a GPU): one small read per step carries
the skip decision, and on a log step the window's device-side accumulators in the same read
(pipeline/train/step_health.py). The model's flow loop reads one integer per flow step on its own.
Nothing of a step survives it: the loss kept for logging is detached, and
`torch.cuda.empty_cache()` is never called (the prototype measured it as a 15-20 % slowdown).
Peak-memory statistics are reset only at log boundaries, so a row's peak covers its window.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from pipeline.core import numerics
from pipeline.core.distributed import Dist, device_for, threads_per_process
from pipeline.core.errors import PipelineError
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.cuda_graph import FlowRunner, tf32_matmuls, why_eager
from pipeline.train.faults import FaultInjector
from pipeline.train.resume_state import rng_state, save_state, set_rng_state
from pipeline.train.step_counters import StepSample, count_host, optimizer_host_tensors, profile_device
from pipeline.train.step_health import NONFINITE, OVERRUN, SPIKE, StepHealth, decode_kind
from pipeline.train.stop_signals import DeferredStop
from pipeline.train.telemetry import (
    PHASES,
    PhaseTimer,
    device_memory_mb,
    device_row,
    release_free_heap,
    reset_peak,
    rss_mb,
    run_device_figures,
    sample_due,
)

log = logging.getLogger(__name__)
_EVENT_LOG_MAX = 10  # events printed one by one; the rest are counted (all are in the events file)
FLOW_STEPS_OBSERVED = 10  # steps the masked loop runs at its cap before fitting its length


class TrainingDiverged(PipelineError):
    """Too many consecutive skipped steps: the run stops instead of spinning. Carries the partial
    result so the stage can still write the telemetry that shows what happened."""

    def __init__(self, message: str, result: "TrainResult"):
        super().__init__(message)
        self.result = result


@dataclass
class TrainResult:
    model: EnergyFlowModel
    rows: list[dict] = field(default_factory=list)  # telemetry, one per log window
    events: list[dict] = field(default_factory=list)  # skipped and flagged steps
    summary: dict = field(default_factory=dict)  # metrics/train.json
    module_names: list[str] = field(default_factory=list)  # the grad/<module>/norm columns


@dataclass
class Checkpointing:
    """Where and how often to write resumable state, and (optionally) a state to resume from."""

    path: Path
    fingerprint: str
    every: int
    extra: dict = field(default_factory=dict)  # stored with each checkpoint (the MLflow run id)
    resume_from: Optional[dict] = None  # a state from train_state.load_state
    before_save: Optional[Callable[[], None]] = None  # e.g. flush buffered metrics: a resumed run keeps them


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineError(f"train.device = {name!r} but CUDA is not available here; use train.device=cpu or auto")
    return torch.device(name)


def select_precision(name: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype, or None for fp32 (and tf32, fp32 with TF32 matmuls). `auto` is fp32
    here; on CUDA the trainer then times fp32 against bf16 on the first batch and keeps the faster
    (precision_candidates)."""
    if name in ("auto", "fp32", "tf32"):
        return None
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def precision_candidates(name: str, device: torch.device) -> list[Optional[torch.dtype]]:
    """What `train.precision=auto` times on this device: fp32 and, on a CUDA GPU that has it, bf16
    (same range as fp32, so no scaler). Off CUDA only fp32: a CPU's bf16 speed depends on its
    instructions (AMX or not), and the same config must give the same numbers on every CPU."""
    if name == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return [None, torch.bfloat16]
    return [select_precision(name, device)]


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


@torch.no_grad()
def evaluate_loss(
    model: EnergyFlowModel,
    inputs,
    targets,
    batch_size: int,
    weights: dict[str, float],
    device: torch.device,
    place: Dist = Dist(),
) -> dict[str, float]:
    """Mean loss and cosine over the rows; with several ranks each takes every world_size-th batch
    and the sums are all-reduced (the same batches as one process, so the same numbers)."""
    model.eval()
    loader = BatchLoader(
        inputs, targets, batch_size, shuffle=False, rank=place.rank, world_size=place.world_size, even=False
    )
    loss_sum = torch.zeros((), device=device)
    cos_sum = torch.zeros((), device=device)
    n = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss_sum += energy_flow_loss(out.pred, y, **weights) * len(x)
        cos_sum += torch.nn.functional.cosine_similarity(out.pred, y, dim=1).sum()
        n += len(x)
    model.train()
    count = torch.tensor(float(n), dtype=torch.float64, device=device)
    totals = place.all_reduce(torch.stack([loss_sum.double(), cos_sum.double(), count]))
    loss_total, cos_total, n_total = totals.tolist()
    return {"loss": loss_total / max(n_total, 1), "cosine": cos_total / max(n_total, 1)}


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
        self.model = EnergyFlowModel.from_config(cfg.model, int(train_inputs.shape[1])).to(device)
        self.model.train()
        # The flow loop (pipeline/model/energy_flow.py): the masked one runs a fixed number of flow
        # steps with no host read. It starts at flow_cap, a count no batch can exceed (every flow
        # has arrived by then, or the compacting loop stops there too), and after the first
        # FLOW_STEPS_OBSERVED steps runs one more than any batch has needed; a batch that needs
        # more is an overrun: its update is not applied and the count goes up (_fit_flow_steps).
        self.model.flow_loop = str(t.flow_loop)
        self.masked = self.model.uses_masked_loop(device)
        self.flow_cap = self.model.masked_step_cap
        self.model.fixed_steps = self.flow_cap if self.masked else None
        self.flow_steps_seen = 0  # the most flow steps a batch has needed so far
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
        s = t.scaler
        # train.scaler.recovery=prototype: the prototype's recovery (docs/prototype.md), an overflow
        # multiplies the scale by 0.1 (as GradScaler's back-off, so its growth count resets the
        # same way), then _train_step floors it at 1.
        self.prototype_recovery = s.recovery == "prototype"
        self.scaler = (
            torch.amp.GradScaler(
                device.type,
                init_scale=s.init_scale,
                growth_factor=s.growth_factor,
                backoff_factor=0.1 if self.prototype_recovery else s.backoff_factor,
                growth_interval=s.growth_interval,
            )
            if self.amp_dtype == torch.float16
            else None
        )
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
        self.faults = FaultInjector(cfg.fault, self.model, rank=place.rank)
        self.timer = PhaseTimer(device)
        # The latest sampled step's counts (pipeline/train/step_counters.py), in every row until
        # the next sample; `precision` what train.precision=auto timed and chose.
        self.sample = StepSample()
        self.precision_ms: dict[str, float] = {}
        self.val = (val_inputs, val_targets) if val_inputs is not None and len(val_inputs) else None
        self.on_log, self.progress, self.ckpt = on_log, progress, checkpointing
        self.result = TrainResult(self.model, module_names=list(self.health.module_names))
        # Position and counters: all of it goes into a checkpoint.
        self.step = self.epoch = self.epoch_step = 0
        self.consecutive_skips = self.skipped_total = self.spikes_total = self.samples_total = 0
        self.overruns_total = 0
        self.elapsed_before = 0.0  # seconds trained by earlier (killed) processes of this run
        self.resumed_from = 0
        self.stop: Optional[DeferredStop] = None  # set while run() runs
        if checkpointing and checkpointing.resume_from:
            self._restore(checkpointing.resume_from)

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
                "consecutive_skips": self.consecutive_skips,
                "skipped_total": self.skipped_total,
                "spikes_total": self.spikes_total,
                "samples_total": self.samples_total,
                "overruns_total": self.overruns_total,
                "flow_steps_seen": self.flow_steps_seen,
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
        self.consecutive_skips, self.skipped_total = c["consecutive_skips"], c["skipped_total"]
        self.spikes_total, self.samples_total, self.elapsed_before = c["spikes_total"], c["samples_total"], c["elapsed"]
        self.overruns_total, self.flow_steps_seen = c.get("overruns_total", 0), c.get("flow_steps_seen", 0)
        if self.masked and c.get("fixed_steps"):
            self.model.fixed_steps = c["fixed_steps"]
        if c.get("amp_dtype") == str(torch.bfloat16) and self.t.precision == "auto":
            self.amp_dtype = torch.bfloat16
        self.result.rows, self.result.events = list(state["rows"]), list(state["events"])
        self.result.summary = dict(state["summary"])
        self.resumed_from = self.step
        log.info("resumed from the checkpoint at step %d (epoch %d)", self.step, self.epoch + 1)

    # ------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        # These settings are process-wide: set them for the run and leave them as found.
        threads = torch.get_num_threads()
        deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        mkldnn = torch.backends.mkldnn.enabled
        # The configured count; else the portable numerics' fixed one (pipeline/core/numerics.threads);
        # else, natively, one process keeps torch's default and a rank gets its share of the cores.
        if self.t.threads or self.place.enabled or numerics.threads():
            torch.set_num_threads(threads_per_process(self.t.threads, self.place))
        if self.t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        tf32 = tf32_matmuls(self.t.precision == "tf32" and self.device.type == "cuda")
        if self.amp_dtype is not None and self.device.type == "cpu":
            # fp16/bf16 matmuls on CPU go through oneDNN, whose two kernel caches keep one entry
            # (~0.6 MB) per matmul shape, up to 1024 each; live flows change the shapes every
            # step, so RSS climbed 426 -> 735 MB in 224 fp16 smoke steps (to ~1.06 GB in longer
            # runs) and the report rightly called it a leak. Without oneDNN: flat at 406 MB, for
            # +5-12 % fp16 step time and none measurable in bf16. Plain assignment: the flags()
            # context manager warns about TF32 on this build. (fp32 never uses these kernels.)
            torch.backends.mkldnn.enabled = False
        try:
            # Log lines (epoch summaries, skipped steps) go through tqdm.write while the bar is up,
            # so they print above it instead of after it on the bar's own line.
            with logging_redirect_tqdm() if self.progress else contextlib.nullcontext(), DeferredStop() as stop, tf32:
                self.stop = stop
                return self._run()
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
            torch.backends.mkldnn.enabled = mkldnn

    def _run(self) -> TrainResult:
        from tqdm.auto import tqdm

        t = self.t
        self.t_start = time.perf_counter()
        self.bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not self.progress,
            mininterval=1.0,
        )
        candidates = precision_candidates(t.precision, self.device)
        if len(candidates) > 1 and self.step == 0:
            self.amp_dtype = self._fastest_precision(candidates)
        reset_peak(self.device)
        self._new_window()
        while self.epoch < t.epochs:
            self.loader.set_epoch(self.epoch)
            batches = self.loader.batches(self.epoch_step * t.grad_accum)
            while self.epoch_step < self.steps_per_epoch:
                self._train_step(batches)
            if self.val:
                t_val = time.perf_counter()
                val = evaluate_loss(self.model, *self.val, t.batch_size, self.loss_weights, self.device, self.place)
                # Not a training step: kept out of perf/step_ms (it showed as a 2x spike at every
                # epoch boundary of the default run, about twice a step's time).
                self.win["not_steps_s"] += time.perf_counter() - t_val
                row = {"val/loss": val["loss"], "val/cosine": val["cosine"], "epoch": self.epoch}
                self.result.summary.update({k: v for k, v in row.items() if k != "epoch"})
                if self.on_log:
                    self.on_log(row, self.step)
            self._epoch_summary()
            self.epoch += 1
            self.epoch_step = 0
        self.bar.close()
        self._summarise()
        return self.result

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

    def _train_step(self, batches) -> None:
        self.step += 1
        self.epoch_step += 1
        step = self.step
        log_step = step % self.t.log_every == 0 or step == self.total_steps
        # Now and then a step is counted (host reads, ops) or, on CUDA, profiled (kernels, busy):
        # never both in one step, and neither step's time enters the row's step time.
        kind = sample_due(step, self.device.type)
        t0 = time.perf_counter()
        if kind == "count":
            with count_host(optimizer_host_tensors(self.opt)) as sample:
                code, values, skip = self._step_work(batches, step, log_step)
            self.sample.host_syncs, self.sample.ops = sample.host_syncs, sample.ops
        elif kind == "profile":
            with profile_device(self.device) as sample:
                code, values, skip = self._step_work(batches, step, log_step)
            for k in ("kernels", "kernel_us", "gpu_busy", "cuda_syncs"):
                setattr(self.sample, k, getattr(sample, k))
        else:
            code, values, skip = self._step_work(batches, step, log_step)
        if kind:
            self.win["untimed_s"] += time.perf_counter() - t0
            self.win["untimed_steps"] += 1
        self.faults.after_step(step)  # outside the phases, and its time is taken off the window's
        self.win["steps"] += 1
        self.bar.update(1)
        if code & (NONFINITE | SPIKE):
            self._record_event(step, code, values[1], values[2], skip)
        if code & OVERRUN:
            # Not a fault: the masked loop was shorter than this batch needed. Its update was not
            # applied (it would differ from the compacting loop's), and the loop is now longer.
            self.result.events.append(
                {"step": step, "kind": "flow_overrun", "action": f"skipped; flow steps now {self.model.fixed_steps}"}
            )
        if self.consecutive_skips >= self.t.max_consecutive_skips:
            self._diverged(step)
        if log_step:
            self._close_window(values)
            if self.ckpt and self.ckpt.every and step % self.ckpt.every == 0 and self.place.is_main:
                if self.ckpt.before_save:
                    self.ckpt.before_save()
                save_state(self.ckpt.path, self.state_dict())
            self._new_window()  # after logging and checkpointing: a row times training steps only
        if self.stop is not None and self.stop.requested:
            self._stop_here(step)

    def _step_work(self, batches, step: int, log_step: bool) -> tuple[int, list[float], bool]:
        """One optimizer step: forward and backward of each micro-batch, the health read-out (the
        step's one host read) and the update (or its skip). Returns the code, the values read
        and whether the update was skipped."""
        t, timer = self.t, self.timer
        anomaly = step <= t.detect_anomaly_steps
        ranges = None
        loss_sum = None
        flow = None  # the masked loop's device counters: steps used (sum, max), flow steps, overrun
        for micro in range(t.grad_accum):
            t_data = time.perf_counter()
            x, y = (b.to(self.device, non_blocking=True) for b in next(batches))
            timer.add_host("data", time.perf_counter() - t_data)
            timer.start()
            # DDP all-reduces the gradients in the backward of the step's last micro-batch only.
            last = micro == t.grad_accum - 1
            sync = not self.place.enabled or last
            # Value ranges of a log step's last micro-batch, read with the step's one read.
            self.model.record_ranges = log_step and last
            with (
                torch.autograd.set_detect_anomaly(anomaly, check_nan=True),
                contextlib.nullcontext() if sync else self.forward.no_sync(),
            ):
                try:
                    with self._autocast():
                        out = self.runner(x, self.amp_dtype)
                    loss = energy_flow_loss(out.pred.float(), y, **self.loss_weights)
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
                used = torch.stack([out.steps_used, out.steps_used, out.flow_steps, out.unfinished.long()])
                flow = (
                    used
                    if flow is None
                    else torch.stack(
                        [flow[0] + used[0], torch.maximum(flow[1], used[1]), flow[2] + used[2], flow[3] | used[3]]
                    )
                )
            else:  # python ints: known on the host already
                self.win["flow_steps"] += out.flow_steps
                self.win["steps_used"] += out.steps_used
            self.win["samples"] += len(x) * self.place.world_size  # every rank's batch is this size
            self.samples_total += len(x) * self.place.world_size
            del out, loss, scaled  # nothing of this step's graph outlives it
        self.model.record_ranges = False  # validation and evaluation forwards record nothing

        if self.place.enabled:  # the global batch's loss, as one process would compute it
            # In place: loss_sum is this step's own detached sum, nothing else holds it.
            loss_sum = self.place.all_reduce(loss_sum) / self.place.world_size
        self.faults.on_grads(step)  # before unscale_, so the scaler sees an injected inf
        if self.scaler:
            self.scaler.unscale_(self.opt)  # clipping and norms see true gradients
        code_t, threshold_t = self.health.measure(loss_sum, flow[3].bool() if flow is not None else None)
        scale_t = self.scaler._scale if self.scaler else None  # the tensor: get_scale() would sync
        values = self.health.step_readout(
            code_t, loss_sum, threshold_t, scale_t, log_step, ranges, flow
        )  # the one sync
        if flow is not None:
            values, (used_sum, used_max, flow_steps, _) = values[:-4], values[-4:]
            self.win["steps_used"] += used_sum
            self.win["flow_steps"] += flow_steps
        code = int(values[0])
        if code & OVERRUN:
            self.win["overruns"] += 1
            self.overruns_total += 1
        skip = bool(code & NONFINITE) or bool(code & SPIKE and t.skip_spikes) or bool(code & OVERRUN)
        if not skip:
            before = self.health.snapshot() if self.win["steps"] == 0 else None
            with self.faults.lr(step, self.opt):
                self.win["lr"] = max(self.win["lr"], self.opt.param_groups[0]["lr"])
                self.opt.step()
            if before is not None:
                self.health.record_update(before)  # the window's sampled update/weight ratio
            self.sched.step()
            self.consecutive_skips = 0
        elif not code & OVERRUN:  # an overrun is the loop's length, not the run's health
            self.consecutive_skips += 1
            self.skipped_total += 1
            self.win["skipped"] += 1
        if self.scaler:
            self.scaler.update()  # backs off after an overflow (found by unscale_), else counts growth
            if self.prototype_recovery and code & NONFINITE:
                self.scaler._scale.clamp_(min=1.0)  # max(scale * 0.1, 1), on the device: no host read
            if self.place.enabled:
                self._agree_scaler()
        self.opt.zero_grad(set_to_none=True)
        timer.lap("optimizer")
        if flow is not None:
            self._fit_flow_steps(step, int(used_max), bool(code & OVERRUN))
        return code, values, skip

    def _fit_flow_steps(self, step: int, used: int, overrun: bool) -> None:
        """The masked loop's fixed flow-step count: flow_cap while the first batches show what
        they need, then one more than the most any batch has needed; after an overrun two more
        (a CUDA graph is captured anew for each count, so it moves rarely and only up)."""
        self.flow_steps_seen = max(self.flow_steps_seen, used)
        fixed = self.model.fixed_steps
        if overrun:
            # (At the cap no flow can still be travelling; should float rounding leave one, the
            # loop runs to max_steps, where it ends as the compacting loop does.)
            fixed = min(self.flow_cap, fixed + 2) if fixed < self.flow_cap else self.model.max_steps
        elif step == FLOW_STEPS_OBSERVED:
            fixed = min(self.flow_cap, self.flow_steps_seen + 1)
        if fixed != self.model.fixed_steps:
            log.info(
                "step %d: the masked flow loop now runs %d flow steps (batches so far needed up to %d)",
                step,
                fixed,
                self.flow_steps_seen,
            )
            self.model.fixed_steps = fixed

    def _stop_here(self, step: int) -> None:
        """SIGTERM or Ctrl-C arrived during this step (pipeline/train/stop_signals.py): close the telemetry
        window, write a checkpoint of this step (rank 0, when checkpointing is on) and stop."""
        if self.win["steps"]:
            self._close_window(None)
        self.bar.close()
        if self.ckpt and self.ckpt.every and self.place.is_main:
            if self.ckpt.before_save:
                self.ckpt.before_save()
            save_state(self.ckpt.path, self.state_dict())
            log.warning(
                "stopping at step %d: checkpoint written to %s (the stage resumes from it when run again)",
                step,
                self.ckpt.path,
            )
        self.stop.raise_()

    def _agree_scaler(self) -> None:
        """Every rank's GradScaler in the same state. Each found its overflow in its own (reduced,
        so equal) gradients, but an inf made on one rank after the all-reduce backs off that rank's
        scale alone, and DDP would then average gradients scaled differently. The smallest scale
        and growth count win: the backed-off ones."""
        state = torch.stack([self.scaler._scale.double(), self.scaler._growth_tracker.double()])
        self.place.all_reduce(state, "min")
        self.scaler._scale.fill_(state[0])
        self.scaler._growth_tracker.fill_(state[1].to(self.scaler._growth_tracker.dtype))

    def _record_event(self, step: int, code: int, loss: float, threshold: float, skipped: bool) -> None:
        kind = decode_kind(code)
        if kind:
            modules = self.health.nonfinite_modules(code)
            event = {
                "step": step,
                "kind": kind,
                "module": modules[0] if modules else None,
                "modules": modules,
                "action": "skipped",
            }
            if self.scaler:
                event["scale"] = self.scaler.get_scale()  # after update(): the backed-off scale
                event["action"] = "skipped; scaler backed off"
        else:
            event = {
                "step": step,
                "kind": "loss_spike",
                "loss": loss,
                "threshold": threshold,
                "action": "skipped" if skipped else "flagged",
            }
        self.result.events.append(event)
        if kind is None:
            self.spikes_total += 1
        if not self.place.is_main:
            return  # the ranks take the decision together (agreed flags): rank 0 reports it
        if len(self.result.events) <= _EVENT_LOG_MAX:
            where = f" (first non-finite gradient: {event['module']})" if event.get("module") else ""
            detail = f" loss {loss:.4g} > {threshold:.4g}" if kind is None else ""
            log.warning("step %d: %s%s%s -> %s", step, event["kind"], detail, where, event["action"])
        elif len(self.result.events) == _EVENT_LOG_MAX + 1:
            log.warning("more events follow; all are in the events file and the stability report")

    def _diverged(self, step: int) -> None:
        """Too many skipped steps in a row: write the evidence into the result and stop."""
        self._close_window(None)
        self._summarise()
        self.bar.close()
        event = self.result.events[-1]
        cause = (
            f"{event['kind']} in {event.get('module') or 'the loss'}"
            if event["kind"] != "loss_spike"
            else "loss spikes"
        )
        raise TrainingDiverged(
            f"{self.consecutive_skips} consecutive skipped steps (last at step {step}, {cause}): stopping "
            f"instead of spinning (train.max_consecutive_skips={self.t.max_consecutive_skips}). Lower "
            f"train.lr, set train.grad_clip (e.g. 1.0), use train.precision=bf16 or a smaller "
            f"train.scaler.init_scale, or check the input embeddings for NaN/Inf.",
            self.result,
        )

    # ------------------------------------------------------------------ telemetry windows
    def _new_window(self) -> None:
        self.win = dict(
            steps=0,
            skipped=0,
            overruns=0,
            samples=0,
            flow_steps=0,
            steps_used=0,
            lr=0.0,
            t0=time.perf_counter(),
            not_steps_s=0.0,
            untimed_s=0.0,  # sampled steps (step_counters): counted or profiled, so not timed
            untimed_steps=0,
        )
        self.health.new_window()

    def _close_window(self, values: Optional[list[float]]) -> None:
        """Turn the window into a telemetry row; `values` is this step's read (None: read now)."""
        if values is None:  # the run is stopping mid-window: one extra read, once
            zero = torch.zeros((), device=self.device)
            values = self.health.step_readout(zero, zero, zero, self.scaler._scale if self.scaler else None, True)
        # Both ends follow a read, so the device is done; validation and a fault's own work are
        # not training steps.
        wall = time.perf_counter() - self.win["t0"] - self.win["not_steps_s"] - self.faults.take_overhead()
        steps = max(self.win["steps"], 1)
        timed_wall, timed_steps = wall, steps
        if self.win["steps"] > self.win["untimed_steps"]:  # a window of sampled steps only is timed as is
            timed_wall, timed_steps = wall - self.win["untimed_s"], self.win["steps"] - self.win["untimed_steps"]
        metrics = self.health.window_metrics(values)
        phases = self.timer.take()
        alloc, peak = device_memory_mb(self.device)
        release_free_heap()  # (before "mem/rss_mb": see telemetry.release_free_heap)
        row = {
            "step": self.step,
            "epoch": self.epoch,
            "train/loss": metrics.pop("train/loss"),
            "train/skipped": self.win["skipped"],
            "train/skipped_steps": self.skipped_total,
            "train/lr": self.win["lr"] or self.opt.param_groups[0]["lr"],
            **metrics,
            "perf/step_ms": 1000 * timed_wall / timed_steps,
            **{f"perf/{p}_ms": 1000 * phases[p] / steps for p in PHASES},
            "perf/samples_per_s": self.win["samples"] / wall if wall > 0 else 0.0,
            "flow/steps_used": self.win["steps_used"] / steps / self.t.grad_accum,
            "flow/flow_steps": self.win["flow_steps"] / steps,
            "flow/overruns": self.win["overruns"],
            **device_row(
                self.sample, timed_wall / timed_steps, self.win["steps_used"] / steps, self.faults, self.device
            ),
            "mem/rss_mb": rss_mb(),
            "mem/device_allocated_mb": alloc,
            "mem/device_peak_mb": peak,
        }
        self.result.rows.append(row)
        if math.isfinite(row["train/loss"]):
            self.bar.set_postfix(loss=f"{row['train/loss']:.4f}", refresh=False)
        if self.on_log:
            self.on_log(row, self.step)
        reset_peak(self.device)

    def _epoch_summary(self) -> None:
        """One line per epoch (rank 0's: the other ranks log warnings only)."""
        rows = [r for r in self.result.rows if r["epoch"] == self.epoch]
        losses = [r["train/loss"] for r in rows if math.isfinite(r["train/loss"])]
        parts = [f"train/loss {losses[-1]:.4f}" if losses else "train/loss n/a"]
        if self.val:
            parts += [
                f"val/loss {self.result.summary['val/loss']:.4f}",
                f"val/cosine {self.result.summary['val/cosine']:.4f}",
            ]
        skipped = sum(r["train/skipped"] for r in rows)
        log.info(
            "epoch %d/%d (step %d): %s, %d skipped", self.epoch + 1, self.t.epochs, self.step, ", ".join(parts), skipped
        )

    def _summarise(self) -> None:
        rows = self.result.rows
        wall = self.elapsed_before + time.perf_counter() - self.t_start
        finite_losses = [r["train/loss"] for r in rows if math.isfinite(r["train/loss"])]
        self.result.summary.update(
            {
                "train/loss": finite_losses[-1] if finite_losses else float("nan"),
                "train/steps": self.step,
                "train/planned_steps": self.total_steps,
                "train/skipped_steps": self.skipped_total,
                "train/spikes": self.spikes_total,
                "train/effective_batch": self.t.batch_size * self.t.grad_accum * self.place.world_size,
                "train/processes": self.place.world_size,
                "train/resumed_from_step": self.resumed_from,
                "train/seconds": wall,
                "perf/samples_per_s": self.samples_total / wall if wall > 0 else 0.0,
                "perf/step_ms": float(np.median([r["perf/step_ms"] for r in rows])) if rows else 0.0,
                "flow/steps_used": float(np.mean([r["flow/steps_used"] for r in rows])) if rows else 0.0,
                "flow/overruns": self.overruns_total,
                "flow/loop": 1.0 if self.masked else 0.0,  # 1 masked, 0 compacting
                "perf/cuda_graph": 1.0 if self.runner.enabled else 0.0,
                # train.precision=auto on CUDA: forward + backward of the first batch in each.
                **{f"perf/precision_{k}_ms": v for k, v in self.precision_ms.items()},
                **run_device_figures(rows),
                # The report's convergence check judges flow/steps_used against these two bounds.
                "flow/step_cap": min(self.model.max_steps, self.model.step_bound),
                "flow/min_steps_to_arrive": self.model.min_steps_to_arrive,
                "mem/rss_peak_mb": max((r["mem/rss_mb"] for r in rows), default=rss_mb()),
            }
        )
        if self.scaler:
            self.result.summary["amp/scale"] = self.scaler.get_scale()


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
