"""The machine's own speed, sampled between a benchmark's runs, so that each figure can be read
against probes taken at the same moments.

A probe is a fixed, small fp32 matmul workload (PROBE_N x PROBE_N by PROBE_N x PROBE_N, PROBE_REPS
times) timed with the caller's thread settings, in wall and in this process's CPU seconds. Long
enough to span a few of the scheduler's time slices, so that another process's share of the
cores shows in it as it shows in a training step; short enough to take often. On a shared
machine other processes come and go: a run that happens while they run is slow, and so are the
probes taken around it. Benchmarks therefore

- take probes interleaved with their work (between runs, arms, steps or telemetry rows) and
  divide each timed span by the probes taken at the same moments (`normaliser`);
- use the BEST of many probes as the machine's matmul peak (interference only ever slows a
  probe down, so the fastest is the closest to the hardware);
- print the CPU model and the probes' spread (`machine`), so a reader can tell a quiet run
  (spread near 1) from a busy one and weigh the figures accordingly.
"""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

import numpy as np
import torch

from pipeline.core.numerics import cpu_model

PROBE_N = 256  # small enough to fit in cache, large enough to run at the matmul peak
PROBE_REPS = 24
CUDA_PROBE_N = 4096  # a GPU needs a larger matmul to leave its launch overhead behind
# Probes whose p90 is more than this over their p10: other processes took the cores for a good
# part of the run. A light neighbour leaves the spread well below it, a neighbour that trains on
# every core puts it far above; figures from such a run say more about the machine than about the
# code: `busy` says so.
BUSY_SPREAD = 2.0


class Probe:
    """`probe()` times the reference workload once and returns its seconds; every time is kept
    (`times`), with the intra-op thread counts it ran with (`threads`). With `threads`, every
    probe runs on that many (the workload's count: a probe on two threads says little about a
    run on one); else on whatever the caller has set at that moment."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        n: Optional[int] = None,
        reps: int = PROBE_REPS,
        threads: Optional[int] = None,
    ):
        self.device = torch.device(device)
        self.want_threads = threads
        self.n = n or (CUDA_PROBE_N if self.device.type == "cuda" else PROBE_N)
        self.reps = reps
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(self.n, self.n, generator=gen).to(self.device)
        self.b = torch.randn(self.n, self.n, generator=gen).to(self.device)
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # this process's CPU seconds of each probe (bench/clock.py)
        self.threads: set[int] = set()
        self()  # warm-up: the BLAS's thread pool and packing buffers, untimed
        self.times.clear()
        self.cpu_times.clear()
        self.threads.clear()

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3 * self.reps

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _run(self) -> None:
        a, b = self.a, self.b
        for _ in range(self.reps):
            torch.mm(a, b)
        self._sync()

    def __call__(self) -> float:
        saved = torch.get_num_threads()
        if self.want_threads and saved != self.want_threads:
            torch.set_num_threads(self.want_threads)
        try:
            self._sync()
            t0, c0 = time.perf_counter(), time.process_time()
            self._run()
            seconds = time.perf_counter() - t0
            self.cpu_times.append(time.process_time() - c0)
            self.threads.add(torch.get_num_threads())
        finally:
            if torch.get_num_threads() != saved:
                torch.set_num_threads(saved)
        self.times.append(seconds)
        return seconds

    def take(self, k: int) -> list[float]:
        """`k` probes back to back."""
        return [self() for _ in range(k)]

    def peak_flops(self) -> float:
        """The fastest probe's FLOP/s: the machine's matmul peak as best seen so far."""
        return self.flops / min(self.times)

    def peak_flops_cpu(self) -> float:
        """The same peak per CPU second of this process: what a busy machine's other processes
        take from the cores does not count in it."""
        return self.flops / min(self.cpu_times)

    def median(self) -> float:
        return float(np.median(self.times))

    def summary(self) -> dict:
        return {
            "probe_workload": f"{self.reps} x fp32 matmul {self.n}x{self.n} @ {self.n}x{self.n}",
            "probe_device": str(self.device),
            "probe_threads": sorted(self.threads),
            "probe_peak_gflops": self.peak_flops() / 1e9,
            **spread(self.times),
        }


def spread(times: Sequence[float], prefix: str = "probe") -> dict:
    """min / p10 / median / p90 / max of probe times in ms, and two spreads: p90/p10 (the
    typical variation) and max/min (the worst moment against the best)."""
    if not times:
        return {f"{prefix}_count": 0}
    t = np.asarray(times, dtype=np.float64) * 1000
    p10, p50, p90 = np.percentile(t, [10, 50, 90])
    return {
        f"{prefix}_count": int(t.size),
        f"{prefix}_ms_min": float(t.min()),
        f"{prefix}_ms_p10": float(p10),
        f"{prefix}_ms_median": float(p50),
        f"{prefix}_ms_p90": float(p90),
        f"{prefix}_ms_max": float(t.max()),
        f"{prefix}_spread_p90_p10": float(p90 / p10),
        f"{prefix}_spread_max_min": float(t.max() / t.min()),
    }


def machine(probe: Optional[Probe] = None) -> dict:
    """What every benchmark prints about where it ran: the CPU model, core count, load, and (given
    the benchmark's probe) the probes' spread."""
    out = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "load_avg_1min_at_end": os.getloadavg()[0]}
    if probe is not None:
        out["probe"] = probe.summary()
        if probe.times:
            out["busy"] = out["probe"]["probe_spread_p90_p10"] > BUSY_SPREAD
    return out


def normaliser(probe_s: Sequence[float], reference_s: float) -> float:
    """Factor that brings a span timed while probes took `probe_s` to the speed of the machine at
    `reference_s` per probe: span * factor. The probes' median, so one probe that caught a
    passing process does not decide."""
    return reference_s / float(np.median(probe_s))
