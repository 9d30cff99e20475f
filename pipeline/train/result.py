"""What a training run hands back: the model, its telemetry rows, its events and its summary
(metrics/train.json), and the error a diverged run stops with, which carries the same."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.model import EnergyFlowModel
from pipeline.train.telemetry import rss_mb, run_device_figures


@dataclass
class TrainResult:
    model: EnergyFlowModel
    rows: list[dict] = field(default_factory=list)  # telemetry, one per log window
    events: list[dict] = field(default_factory=list)  # skipped and flagged steps
    summary: dict = field(default_factory=dict)  # metrics/train.json
    module_names: list[str] = field(default_factory=list)  # the grad/<module>/norm columns


class TrainingDiverged(PipelineError):
    """Too many consecutive skipped steps: the run stops instead of spinning. Carries the partial
    result so the stage can still write the telemetry that shows what happened."""

    def __init__(self, message: str, result: TrainResult):
        super().__init__(message)
        self.result = result


def row_figures(rows: list[dict]) -> dict[str, float]:
    """The run's figures taken from its telemetry rows: the last finite loss, the median step
    time, the mean flow steps per batch, the device figures and the peak RSS."""
    finite_losses = [r["train/loss"] for r in rows if math.isfinite(r["train/loss"])]
    return {
        "train/loss": finite_losses[-1] if finite_losses else float("nan"),
        "perf/step_ms": float(np.median([r["perf/step_ms"] for r in rows])) if rows else 0.0,
        "flow/steps_used": float(np.mean([r["flow/steps_used"] for r in rows])) if rows else 0.0,
        **run_device_figures(rows),
        "mem/rss_peak_mb": max((r["mem/rss_mb"] for r in rows), default=rss_mb()),
    }


def summarise(tr) -> None:
    """The run's figures into tr.result.summary (metrics/train.json), at its end."""
    wall = tr.elapsed_before + time.perf_counter() - tr.t_start
    t = tr.t
    tr.result.summary.update(
        {
            **row_figures(tr.result.rows),
            "train/steps": tr.step,
            "train/planned_steps": tr.total_steps,
            "train/skipped_steps": tr.events.skipped_total,
            "train/spikes": tr.events.spikes_total,
            "train/effective_batch": t.batch_size * t.grad_accum * tr.place.world_size,
            "train/processes": tr.place.world_size,
            "train/resumed_from_step": tr.resumed_from,
            "train/seconds": wall,
            "perf/samples_per_s": tr.samples_total / wall if wall > 0 else 0.0,
            "flow/overruns": tr.events.overruns_total,
            "flow/loop": 1.0 if tr.masked else 0.0,  # 1 masked, 0 compacting
            "perf/cuda_graph": 1.0 if tr.runner.enabled else 0.0,
            # train.precision=auto on CUDA: forward + backward of the first batch in each.
            **{f"perf/precision_{k}_ms": v for k, v in tr.precision_ms.items()},
            # The report's convergence check judges flow/steps_used against these two bounds.
            "flow/step_cap": min(tr.model.max_steps, tr.model.step_bound),
            "flow/min_steps_to_arrive": tr.model.min_steps_to_arrive,
        }
    )
    if tr.scaler:
        tr.result.summary["amp/scale"] = tr.scaler.get_scale()
