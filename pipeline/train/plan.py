"""What a train config will cost, before any rank starts (pipeline/core/preflight.py runs `costs`):
the memory of all its processes on this node, and the time of its planned steps.

Memory: the train stage's own estimate (pipeline/train/memory_estimate.py) for the node's
processes, so that train.nproc=N is checked as N x one process's peak before torchrun starts N of
them. The launcher stays alive while its ranks run: what it holds is spent, so each rank is
counted with its whole peak (its baseline included) against what is free now.

Time: planned optimizer steps (epochs x steps per epoch, from the train split's row count in the
shards' manifest) x a lower bound on one step's time. The bound is memory traffic, which no
step can beat: the activations are written in the forward pass and read back in the backward
pass, and the weights, gradients and AdamW's two moments are read and written once a step, at a
bandwidth above what the device has (so the bound stays below the truth, and a warning is never
raised for a run that is in fact short); and never under a millisecond a step, which even the
smallest model here takes in kernel launches and Python. A run whose lower bound exceeds a day is
warned about before it starts, the figure named a lower bound. The bound can be far below the
truth, so the trainer also times its first steps (`DurationWatch`) and warns, once, when the
remaining steps at that pace take more than a day.
"""

from __future__ import annotations

import dataclasses
import time

from pipeline.core.distributed import Dist, device_for
from pipeline.core.errors import PipelineError
from pipeline.core.paths import repo_path
from pipeline.core.preflight import DAY_S, warn_duration
from pipeline.data.loader import BatchLoader
from pipeline.data.shards import load_manifest
from pipeline.train import memory_estimate
from pipeline.train.device import select_device
from pipeline.train.parts import Step, TrainPart
from pipeline.train.resume_state import STATE_FILE

MB = 2**20
# Bytes a second a step's memory traffic cannot exceed: above the DRAM bandwidth of a CPU socket
# (tens of GB/s) and the HBM of a GPU (a few TB/s).
CPU_BYTES_PER_S = 200e9
CUDA_BYTES_PER_S = 5e12
MIN_STEP_S = 1e-3
# Per parameter per optimizer step, fp32 each: read in forward, gradient written in backward,
# AdamW reads weight, gradient and two moments and writes weight and two moments.
TOUCHES_PER_PARAMETER = 9


def step_seconds(e: memory_estimate.MemoryEstimate, grad_accum: int) -> float:
    """A lower bound on one optimizer step's time (module docstring)."""
    bandwidth = CUDA_BYTES_PER_S if e.on_device else CPU_BYTES_PER_S
    traffic = 2 * e.activations_mb * MB * grad_accum + TOUCHES_PER_PARAMETER * 4 * e.parameters
    return max(MIN_STEP_S, traffic / bandwidth)


def planned_steps(cfg, manifest: dict, processes: int) -> tuple[int, int]:
    """(optimizer steps per epoch, planned steps) as the trainer counts them (pipeline/train/loop.py)."""
    t = cfg.train
    rows = int(manifest["splits"].get("train", {}).get("count", 0))
    per_epoch = (rows // (t.batch_size * processes)) // t.grad_accum
    return per_epoch, int(t.epochs) * per_epoch


def batch_loader(cfg, inputs, targets, device, place: Dist) -> tuple[BatchLoader, int]:
    """The trainer's loader of this rank's batches, and its optimizer steps per epoch (an error
    when not one fits)."""
    t = cfg.train
    loader = BatchLoader(
        inputs,
        targets,
        t.batch_size,
        shuffle=True,
        seed=cfg.run.seed,
        drop_last=len(inputs) > t.batch_size,
        pin_memory=device.type == "cuda",
        prefetch=t.prefetch,
        rank=place.rank,
        world_size=place.world_size,
    )
    per_epoch = len(loader) // t.grad_accum
    if per_epoch == 0:
        procs = f" * {place.world_size} processes" if place.enabled else ""
        raise PipelineError(
            f"the train split has {len(inputs)} rows: fewer than train.batch_size * train.grad_accum"
            f"{procs} = {t.batch_size * t.grad_accum * place.world_size}, so not one optimizer step fits; "
            "lower one of them"
        )
    return loader, per_epoch


def costs(cfg, processes: int, tracked: bool = True) -> None:
    """Refuse (ResourceError) what cannot fit this node's memory; warn about a run of more than a day.
    `tracked`: rank 0 logs to MLflow (the stage says)."""
    manifest = load_manifest(repo_path(cfg.embed.out_dir))  # a missing or bad manifest: its own message, once
    place = Dist(rank=0, world_size=processes, local_rank=0, local_world_size=processes)
    device = select_device(device_for(cfg.train.device, Dist()))
    available = memory_estimate.available_memory(device, processes)
    if processes > 1:  # the launcher's memory is spent; each rank brings its own baseline
        available = dataclasses.replace(available, held_mb=0.0)
    ckpt = repo_path(cfg.train.checkpoint_dir) / STATE_FILE
    check = memory_estimate.check(cfg, int(manifest["dim"]), place, ckpt, available=available, tracked=tracked)
    per_epoch, steps = planned_steps(cfg, manifest, processes)
    per_step = step_seconds(check.estimate, int(cfg.train.grad_accum))
    warn_duration(
        "train",
        steps * per_step,
        f"{int(cfg.train.epochs):,} epochs x {per_epoch:,} steps x at least {per_step * 1e3:,.1f} ms a step, "
        "a lower bound",
        "train.epochs",
    )


# The first steps are not timed: the first builds AdamW's state and (on CUDA) warms the kernels.
WATCH_SKIP = 2
WATCH_STEPS = 20  # then the mean of this many steps is the run's pace


class DurationWatch(TrainPart):
    """After the first steps, once: the remaining planned steps at the pace measured so far; a
    warning when that is more than a day (rank 0 only). A part of the loop: it starts counting
    where this process starts (a resumed run's step)."""

    def __init__(self, total_steps: int, start_step: int, report: bool):
        self.total = int(total_steps)
        # Past a day at the least time a step can take, the preflight has said so already.
        self.report = report and self.total * MIN_STEP_S <= DAY_S
        self.start_step, self.t0 = start_step + WATCH_SKIP, 0.0

    def on_start(self, tr) -> None:
        self.__init__(tr.total_steps, tr.step, tr.place.is_main)

    def on_step_end(self, tr, s: Step) -> None:
        self.tick(s.step)

    def tick(self, step: int) -> None:
        if not self.report:
            return
        if step == self.start_step:
            self.t0 = time.perf_counter()
        elif step == self.start_step + WATCH_STEPS:
            self.report = False
            pace = (time.perf_counter() - self.t0) / WATCH_STEPS
            left = self.total - step
            warn_duration(
                "train",
                left * pace,
                f"{left:,} steps left at {pace * 1e3:,.0f} ms a step, measured over {WATCH_STEPS} steps",
                "train.epochs",
            )
