"""Deliberate faults (the `fault` config group): how the detectors and the report are proven.

Each fault hits optimizer steps [step, step + steps) (1-based), except `leak` (as the prototype's
bug did) and `sync_bound`, which start at `step` and never stop. In distributed training
`fault.rank` picks the one rank it hits (-1: all of them), which is how a NaN on one rank is shown
to skip the step on all. The injector is a part of the loop (pipeline/train/parts.py): its hooks
put the fault in at the step's points, and it is in the loop only when a fault is configured.
"""

from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import ConfigError
from pipeline.train.parts import Step, TrainPart

# sync_bound's stand-in device figures on a machine without a GPU (device_figures): a GPU busy for
# a share of the step below report.device_busy_fail by a margin no rounding closes, running one
# kernel per op dispatched, each too short to outlast its own launch.
SYNTHETIC_GPU_BUSY = 0.05
SYNTHETIC_KERNEL_US = 5.0
# Faults that start at fault.step and run to the end of training.
_OPEN_ENDED = ("leak", "sync_bound")


def _nan(value) -> bool:
    """Not measured: NaN or absent."""
    return value is None or math.isnan(value)


def injector_for(fault_cfg, model: nn.Module, rank: int = 0) -> Optional["FaultInjector"]:
    """The run's injector, or None when no fault hits this rank: then the trainer calls nothing of
    it (a fault-free step runs no injector code at all)."""
    injector = FaultInjector(fault_cfg, model, rank)
    return None if injector.kind == "none" else injector


class FaultInjector(TrainPart):
    def __init__(self, fault_cfg, model: nn.Module, rank: int = 0):
        # A fault aimed at another rank is no fault here.
        self.kind = fault_cfg.kind if fault_cfg.get("rank", -1) in (-1, rank) else "none"
        self.first, self.last = fault_cfg.step, fault_cfg.step + fault_cfg.steps - 1
        self.factor = float(fault_cfg.factor)
        self.module = fault_cfg.module
        self.leak_elems = int(fault_cfg.leak_mb * 2**20) // 4  # float32 elements kept per step
        self._leak_block: np.ndarray | None = None
        self._leak_pos = 0
        self._kept: list = []  # the leak: losses whose graphs stay alive, and activation blocks
        self.overhead_s = 0.0  # the injector's own work, taken off the step time
        self._target = None
        self._saved_lr: Optional[list[float]] = None
        if self.kind == "inf_grad":
            children = dict(model.named_children())
            if self.module not in children:
                raise ConfigError(
                    f"parameter 'fault.module' = {self.module!r}: expected one of the model's "
                    f"top-level modules: {', '.join(children)}"
                )
            params = [p for p in children[self.module].parameters() if p.requires_grad]
            self._target = params[0]

    def hits(self, step: int) -> bool:
        if self.kind == "none":
            return False
        if self.kind in _OPEN_ENDED:
            return step >= self.first
        return self.first <= step <= self.last

    # -- the hooks
    def before_backward(self, tr, loss: torch.Tensor) -> torch.Tensor:
        return self.on_loss(tr.step, loss)

    def after_backward(self, tr) -> None:
        """Before unscale_ and the health measure, so the scaler sees an injected inf."""
        if self.kind == "inf_grad" and self.hits(tr.step) and self._target.grad is not None:
            with torch.no_grad():
                self._target.grad.view(-1)[0] = float("inf")

    def before_update(self, tr) -> None:
        """The LR spike (or jump, the same multiplier held longer) of this update, undone after it
        (after_update) so the schedule is untouched."""
        if self.kind in ("lr_spike", "lr_jump") and self.hits(tr.step):
            self._saved_lr = [g["lr"] for g in tr.opt.param_groups]
            for g in tr.opt.param_groups:
                g["lr"] = g["lr"] * self.factor

    def after_update(self, tr) -> None:
        if self._saved_lr is not None:
            for g, lr in zip(tr.opt.param_groups, self._saved_lr):
                g["lr"] = lr
            self._saved_lr = None

    def after_step(self, tr, s: Step) -> None:
        """After the step's timed phases. The leak keeps a step's worth of activations.

        Its own cost is the instrument's, not the model's, and is left out of the step time
        (take_overhead): making fresh memory resident costs page faults, more of them once a
        process has touched a lot of memory, which would make the fault trip the step-time check
        too, by an accident of the sandbox's page faults."""
        if self.kind == "leak" and self.hits(s.step):
            t0 = time.perf_counter()
            self._keep_activations()
            self.overhead_s += time.perf_counter() - t0

    # -- what the hooks do
    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Applied to each micro-batch loss before backward."""
        if not self.hits(step):
            return loss
        if self.kind == "nan_loss":
            return loss * float("nan")
        if self.kind == "loss_spike":
            return loss * self.factor
        if self.kind == "leak":
            self._kept.append(loss)  # the prototype's history list: not detached, its graph stays alive
        if self.kind == "sync_bound":
            self._read_to_host(loss)
        return loss

    def _read_to_host(self, loss: torch.Tensor) -> None:
        """int(factor) host reads of the loss, each a real one (float() of a tensor: on a GPU the
        host waits for the device each time), so the trainer's counter sees them as host syncs.
        Not taken off the step time: what they cost is the fault."""
        value = loss.detach()
        for _ in range(int(self.factor)):
            float(value)

    def device_figures(self, sample: dict, device_type: str) -> dict:
        """A sampled step's figures (host_syncs, ops, kernels, kernel_us, gpu_busy, busy_synthetic),
        as the telemetry will carry them. With sync_bound on a machine without a GPU the profiler
        measured nothing (gpu_busy NaN), so the device check would have nothing to judge: the figures
        a sync-bound GPU gives are filled in instead, marked busy_synthetic = 1.0 so the report says
        they are synthetic (gpu_busy 0.05, kernel_us 5.0, one kernel per op the CPU dispatched). The
        counts (host_syncs, ops) are always the real ones, and a row no step was sampled for yet
        (ops NaN) gets nothing made up. Otherwise the sample is returned as it is, with
        busy_synthetic 0.0 when missing."""
        out = dict(sample)
        if (
            self.kind == "sync_bound"
            and device_type != "cuda"
            and _nan(out.get("gpu_busy"))
            and not _nan(out.get("ops"))
        ):
            out.update(
                gpu_busy=SYNTHETIC_GPU_BUSY,
                kernels=float(out["ops"]),
                kernel_us=SYNTHETIC_KERNEL_US,
                busy_synthetic=1.0,
            )
        else:
            out.setdefault("busy_synthetic", 0.0)
        return out

    def take_overhead(self) -> float:
        """Seconds the injector spent on its own work since the last call."""
        spent, self.overhead_s = self.overhead_s, 0.0
        return spent

    def _keep_activations(self) -> None:
        """leak_mb more host memory resident: slices of a block reserved for 64 steps, filled in
        turn (untouched pages are not resident). numpy, because torch.empty of the 512 MB block
        was resident at once (the whole block in RSS before any fill); np.empty is mmap'd, resident only
        where written."""
        n = self.leak_elems
        if n == 0:
            return
        if self._leak_block is None or self._leak_pos + n > self._leak_block.size:
            self._leak_block = np.empty(n * 64, dtype=np.float32)
            self._kept.append(self._leak_block)
            self._leak_pos = 0
        self._leak_block[self._leak_pos : self._leak_pos + n] = 1.0
        self._leak_pos += n
