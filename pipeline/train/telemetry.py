"""Per-window training telemetry: what each logged row holds, phase timing and memory readings."""

from __future__ import annotations

import functools
import math
import time
from types import MappingProxyType
from typing import Optional

import numpy as np
import psutil
import torch

from pipeline.model.energy_flow import RANGE_KEYS
from pipeline.train.step_counters import SAMPLE_KEYS
from pipeline.train.step_health import ZONES

PHASES = ("data", "forward", "backward", "optimizer")

# Columns of the per-log-row telemetry table (telemetry/train_steps.csv, a DVC plot), in order;
# one `grad/<module>/norm` column per top-level module follows them. The report stage reads the
# same names; `split/name` everywhere, as in MLflow.
STEP_COLUMNS = (
    "step",
    "epoch",
    "train/loss",
    "train/skipped",
    "train/skipped_steps",
    "train/spikes",
    "train/lr",
    "grad/global_norm",
    "grad/max_norm",
    "grad/clipped_norm",
    "grad/clip_fraction",
    "grad/nonfinite_steps",
    "grad/update_ratio",
    "grad/zone",
    *(f"grad/steps_{z}" for z in ZONES),
    "amp/scale",
    "perf/step_ms",
    *(f"perf/{p}_ms" for p in PHASES),
    "perf/samples_per_s",
    # Step time per flow step: a model that takes more flow steps per batch does more work per
    # step, which is not a slower loop (the step-time check judges this one).
    "perf/flow_step_ms",
    # From the latest sampled step (step_counters; sample_due says when): host reads and aten ops
    # per step, every source; on CUDA kernels per step, their mean duration and the fraction of
    # the step the GPU was busy (NaN elsewhere; perf/busy_synthetic = 1 when a fault made them up).
    *(f"perf/{k}" for k in SAMPLE_KEYS),
    "perf/busy_synthetic",
    "flow/steps_used",
    "flow/flow_steps",
    "flow/overruns",  # masked loop: batches that needed more flow steps than it ran (not applied)
    # Value ranges of the log step's forward (min / max / RMS): carried flow energies, the last
    # carrier layer's hidden states, the output surface. Read with the step's one host read.
    *(f"range/{k}" for k in RANGE_KEYS),
    "mem/rss_mb",
    "mem/device_allocated_mb",
    "mem/device_peak_mb",
)


def step_columns(module_names: list[str]) -> list[str]:
    return [*STEP_COLUMNS, *(f"grad/{m}/norm" for m in module_names)]


def rss_mb() -> float:
    """This process's resident memory (psutil.Process() is the calling process, a forked child's too)."""
    return psutil.Process().memory_info().rss / 2**20


@functools.cache  # the C library's function: looked up once, the same for the process's life
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system before RSS is read. The compacting flow
    loop frees and allocates tensors of a different size every flow step (the live-flow count
    changes); glibc keeps the freed pieces, so RSS climbed through a default run that held nothing
    and the memory_growth check read it as a leak. After a trim RSS counts what is held: a real
    leak (fault=leak, the fault matrix) still climbs, a clean run (the default run's report) does
    not. One call per logged row: a walk of the heap's free lists, not of its tensors."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def device_memory_mb(device: torch.device) -> tuple[float, float]:
    """(allocated, peak since the last reset) in MB; zeros off CUDA. Peak is reset by the caller
    only at log boundaries, so the peak covers the whole window."""
    if device.type != "cuda":
        return 0.0, 0.0
    return torch.cuda.memory_allocated(device) / 2**20, torch.cuda.max_memory_allocated(device) / 2**20


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class PhaseTimer:
    """Time spent per phase of a step, summed over a log window, without forcing a sync.

    On the CPU work is synchronous, so wall-clock marks are exact. On CUDA the host runs ahead of
    the device, so each phase is bracketed by CUDA events; a pair is read only once the device
    has passed it (`query()`), and pairs still in flight carry over to the next window."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals = dict.fromkeys(PHASES, 0.0)  # seconds
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._phase_start = None

    def start(self) -> None:
        self._phase_start = torch.cuda.Event(enable_timing=True) if self.cuda else time.perf_counter()
        if self.cuda:
            self._phase_start.record()

    def add_host(self, phase: str, seconds: float) -> None:
        """A phase timed on the host (waiting for data is host time whatever the device)."""
        self.totals[phase] += seconds

    def lap(self, phase: str) -> None:
        """End `phase` now and start the next one."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((phase, self._phase_start, end))
            self._phase_start = end
        else:
            now = time.perf_counter()
            self.totals[phase] += now - self._phase_start
            self._phase_start = now

    def take(self) -> dict[str, float]:
        """Totals (seconds) of the window so far; reset for the next one."""
        if self.cuda:
            still = []
            for phase, a, b in self._pending:
                if b.query():
                    self.totals[phase] += a.elapsed_time(b) / 1000
                else:
                    still.append((phase, a, b))
            self._pending = still
        out, self.totals = self.totals, dict.fromkeys(PHASES, 0.0)
        return out


# Sampled steps: the third (after the first steps' allocations, and a CUDA graph's first capture)
# and then every SAMPLE_EVERY from the thirteenth (after the masked loop has fitted its length).
# On CUDA the step after a counted one is profiled: counting and profiling each slow a step down,
# so they never share one, and neither is timed.
SAMPLE_EVERY = 100
_FIRST_SAMPLES = (3, 13)


def sample_due(step: int, device_type: str) -> Optional[str]:
    """ "count" (host reads and ops), "profile" (CUDA kernels and busy time) or None."""

    def counted(s: int) -> bool:
        return s in _FIRST_SAMPLES or (s > _FIRST_SAMPLES[-1] and (s - _FIRST_SAMPLES[-1]) % SAMPLE_EVERY == 0)

    if counted(step):
        return "count"
    if device_type == "cuda" and counted(step - 1):
        return "profile"
    return None


def device_row(sample, step_s: float, steps_used: float, faults, device: torch.device) -> dict[str, float]:
    """The row's perf/flow_step_ms and the latest sample's figures (a fault, when one is
    configured, may stand in for a device this machine lacks: FaultInjector.device_figures)."""
    figures = sample.figures()
    if faults is not None:
        figures = faults.device_figures(figures, device.type)
    return {
        "perf/flow_step_ms": 1000 * step_s / steps_used if steps_used > 0 else math.nan,
        **{f"perf/{k}": float(figures[k]) for k in SAMPLE_KEYS},
        "perf/busy_synthetic": float(figures.get("busy_synthetic", 0.0)),
    }


# metrics/train.json's device figures: the median over the rows of each (NaN where never measured).
_RUN_FIGURES = MappingProxyType(
    {
        "perf/flow_step_ms": "perf/flow_step_ms",
        "perf/host_syncs": "perf/host_syncs_per_step",
        "perf/ops": "perf/ops_per_step",
        "perf/kernels": "perf/kernels_per_step",
        "perf/kernel_us": "perf/kernel_us",
        "perf/gpu_busy": "perf/gpu_busy",
    }
)


def run_device_figures(rows: list[dict]) -> dict[str, float]:
    out = {}
    for col, key in _RUN_FIGURES.items():
        values = [r[col] for r in rows if col in r and math.isfinite(r[col])]
        out[key] = float(np.median(values)) if values else math.nan
    return out
