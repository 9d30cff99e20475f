"""A telemetry window: the steps since the last logged row, summed on the host, and the row they
close into (telemetry/train_steps.csv, MLflow). The device-side sums of the same window are
StepHealth's; both are read with the step's one read (pipeline/train/step_health.py).

Peak-memory statistics are reset only once a row is out (telemetry.reset_peak), so a row's peak
covers its window. The window is a part of the loop (pipeline/train/parts.py): it counts each step
once its decision is known, and opens the next window (with StepHealth's) once a row is out and
any checkpoint written, so a row times training steps only.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from pipeline.train.parts import Step, TrainPart
from pipeline.train.step_health import OVERRUN
from pipeline.train.telemetry import PHASES, device_memory_mb, device_row, release_free_heap, reset_peak, rss_mb


class TelemetryWindow(TrainPart):
    def __init__(self, device: torch.device, grad_accum: int):
        self.device, self.grad_accum = device, grad_accum
        self.open()

    def open(self) -> None:
        self.steps = self.skipped = self.overruns = self.samples = 0
        self.flow_steps = self.steps_used = 0
        self.lr = 0.0  # the highest LR an update of the window applied
        self.t0 = time.perf_counter()
        self.not_steps_s = 0.0  # time inside the window that is not training (validation)
        self.untimed_s = 0.0  # sampled steps (step_counters): counted or profiled, so not timed
        self.untimed_steps = 0

    def on_start(self, tr) -> None:
        reset_peak(self.device)
        self.open()
        tr.health.new_window()

    def after_step(self, tr, s: Step) -> None:
        self.samples += s.samples
        self.flow_steps += s.flow_steps
        self.steps_used += s.steps_used
        if s.code & OVERRUN:  # the loop's length, not a skip for the run's health
            self.overruns += 1
        elif s.skip:
            self.skipped += 1
        if s.lr is not None:
            self.lr = max(self.lr, s.lr)
        if s.untimed_s is not None:
            self.untimed_s += s.untimed_s
            self.untimed_steps += 1
        self.steps += 1

    def on_step_end(self, tr, s: Step) -> None:
        if s.log_step:  # after the row and its checkpoint
            self.open()
            tr.health.new_window()

    def log_row(self, tr, values: Optional[list[float]]) -> None:
        """Close the window into a telemetry row for the parts' on_log and the run's on_log;
        `values` is this step's read (None: the run is ending mid-window, one extra read, once)."""
        if values is None:
            zero = torch.zeros((), device=self.device)
            scale = tr.scaler.scale_tensor() if tr.scaler else None
            values = tr.health.step_readout(zero, zero, zero, scale, True)
        row = self.close(tr, values)
        tr.result.rows.append(row)
        tr.call("on_log", row)
        if tr.on_log:
            tr.on_log(row, tr.step)
        reset_peak(self.device)

    def close(self, tr, values: list[float]) -> dict:
        """The window's telemetry row; `values` is a step_readout with the window's accumulators.
        A fault (tr.faults) may stand in for device figures this machine cannot measure; its own
        work is not training time."""
        fault_overhead_s = tr.faults.take_overhead() if tr.faults else 0.0
        # Both ends follow a read, so the device is done; validation and a fault's own work are
        # not training steps.
        wall = time.perf_counter() - self.t0 - self.not_steps_s - fault_overhead_s
        steps = max(self.steps, 1)
        timed_wall, timed_steps = wall, steps
        if self.steps > self.untimed_steps:  # a window of sampled steps only is timed as is
            timed_wall, timed_steps = wall - self.untimed_s, self.steps - self.untimed_steps
        metrics = tr.health.window_metrics(values)
        phases = tr.timer.take()
        alloc, peak = device_memory_mb(self.device)
        release_free_heap()  # (before "mem/rss_mb": see telemetry.release_free_heap)
        return {
            "step": tr.step,
            "epoch": tr.epoch,
            "train/loss": metrics.pop("train/loss"),
            "train/skipped": self.skipped,
            "train/skipped_steps": tr.events.skipped_total,
            "train/lr": self.lr or tr.opt.param_groups[0]["lr"],
            **metrics,
            "perf/step_ms": 1000 * timed_wall / timed_steps,
            **{f"perf/{p}_ms": 1000 * phases[p] / steps for p in PHASES},
            "perf/samples_per_s": self.samples / wall if wall > 0 else 0.0,
            "flow/steps_used": self.steps_used / steps / self.grad_accum,
            "flow/flow_steps": self.flow_steps / steps,
            "flow/overruns": self.overruns,
            **device_row(tr.sample, timed_wall / timed_steps, self.steps_used / steps, tr.faults, self.device),
            "mem/rss_mb": rss_mb(),
            "mem/device_allocated_mb": alloc,
            "mem/device_peak_mb": peak,
        }
