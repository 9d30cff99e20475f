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
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from bench.clock import sync
from pipeline.core.numerics import cpu_model

PROBE_N = 256  # small enough to fit in cache, large enough to run at the matmul peak
PROBE_REPS = 24
CUDA_PROBE_N = 4096  # a GPU needs a larger matmul to leave its launch overhead behind
# Probes whose p90 is more than this over their p10: other processes took the cores for a good
# part of the run. A light neighbour leaves the spread well below it, a neighbour that trains on
# every core puts it far above; figures from such a run say more about the machine than about the
# code: `busy` says so.
BUSY_SPREAD = 2.0
PROBE_EVERY_S = 1.0  # probes inside a run: often enough to follow the load, rare enough to cost little
SEGMENT_ROWS = 4  # rows a segment of the in-run A/B holds at least: its first span is left out, 3 count


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

    def _run(self) -> None:
        a, b = self.a, self.b
        for _ in range(self.reps):
            torch.mm(a, b)
        sync(self.device)

    def __call__(self) -> float:
        saved = torch.get_num_threads()
        if self.want_threads and saved != self.want_threads:
            torch.set_num_threads(self.want_threads)
        try:
            sync(self.device)
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


class RowProbe:
    """The trainer's on_log in every arm: notes when each telemetry row arrives, on a clock with
    the probes taken out, takes a probe when PROBE_EVERY_S has passed since the last, then passes
    the row on (to the arm's logger, if any). The probe comes first: the logger's work for this
    row starts after it.

    With `segment_s`, rows go to the logger in alternate segments (on, off, on, ...) of that many
    seconds and at least SEGMENT_ROWS rows (on a slow machine a row can take seconds): the run
    holds its own A/B, seconds apart, so a load that comes and goes over seconds hits both sides
    alike (see segment_ratios)."""

    def __init__(
        self,
        probe: Probe,
        inner: Optional[Callable[[dict, int], None]] = None,
        every_s: float = PROBE_EVERY_S,
        segment_s: float = 0.0,
    ):
        self.probe, self.inner, self.every_s, self.segment_s = probe, inner, every_s, segment_s
        self.segment_rows = 0  # rows in the current segment so far
        self.stamps: list[tuple[int, float]] = []  # (step, clock)
        self.cpu_stamps: list[tuple[int, float]] = []  # (step, cpu_clock)
        self.probe_cpu_s = 0.0  # this process's CPU seconds spent probing
        self.sent: list[bool] = []  # per row: handed to the logger
        self.probes: list[float] = []
        self.probe_s = 0.0  # seconds spent probing, including this bookkeeping
        self.last = time.perf_counter()
        self.on, self.switch_at = True, None

    def clock(self) -> float:
        return time.perf_counter() - self.probe_s

    def cpu_clock(self) -> float:
        """This process's CPU seconds (its logging threads' included), the probes taken out."""
        return time.process_time() - self.probe_cpu_s

    def take(self) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        self.probes.append(self.probe())
        self.last = time.perf_counter()
        self.probe_s += self.last - t0
        self.probe_cpu_s += time.process_time() - c0

    def __call__(self, metrics: dict, step: int) -> None:
        now = self.clock()
        self.stamps.append((step, now))
        self.cpu_stamps.append((step, self.cpu_clock()))
        if self.segment_s:
            if self.switch_at is None:
                self.switch_at = now + self.segment_s
            elif now >= self.switch_at and self.segment_rows >= SEGMENT_ROWS:
                self.on, self.switch_at, self.segment_rows = not self.on, now + self.segment_s, 0
            self.segment_rows += 1
        self.sent.append(self.inner is not None and self.on)
        if time.perf_counter() - self.last >= self.every_s:
            self.take()
        if self.sent[-1]:
            self.inner(metrics, step)

    def steady_ms(self, skip: float) -> float:
        """Wall ms per step from the row at `skip` of the run to the last."""
        (s0, t0), (s1, t1) = self.stamps[min(int(len(self.stamps) * skip), len(self.stamps) - 2)], self.stamps[-1]
        return 1000 * (t1 - t0) / (s1 - s0)

    def segments(self, skip: float, cpu: bool = False) -> list[tuple[bool, float]]:
        """(sent, ms per step) of each segment from the row at `skip` of the run on. The span
        between rows j-1 and j holds row j-1's hand-over and the training of row j's window; it
        counts for the segment of row j-1, and only when row j-2 was in the same segment (the
        first span after a switch is left out: the logger may still be busy with the rows before).
        With `cpu`, ms of this process's CPU time per step (cpu_stamps) in place of wall time."""
        stamps = self.cpu_stamps if cpu else self.stamps
        out: list[list] = []  # [sent, seconds, steps, last row index]
        first = max(2, int(len(stamps) * skip))
        for j in range(first, len(stamps)):
            if self.sent[j - 1] != self.sent[j - 2]:
                continue
            dt = stamps[j][1] - stamps[j - 1][1]
            ds = stamps[j][0] - stamps[j - 1][0]
            if out and out[-1][0] == self.sent[j - 1] and out[-1][3] == j - 1:
                out[-1][1] += dt
                out[-1][2] += ds
                out[-1][3] = j
            else:
                out.append([self.sent[j - 1], dt, ds, j])
        return [(sent, 1000 * sec / steps) for sent, sec, steps, _ in out if steps]

    def segment_ratios(self, skip: float, cpu: bool = False) -> list[float]:
        """ms per step of a sent segment over its unsent neighbour's, for every pair of adjacent
        segments (each boundary gives one); with `cpu`, in this process's CPU time."""
        seg = self.segments(skip, cpu)
        return [(a[1] / b[1]) if a[0] else (b[1] / a[1]) for a, b in zip(seg, seg[1:]) if a[0] != b[0]]

    def sent_ms(self, skip: float) -> Optional[float]:
        """ms per step over the sent segments alone (None: no segments)."""
        seg = [ms for sent, ms in self.segments(skip) if sent]
        return float(np.median(seg)) if seg else None

    def record(self, arm: str, skip: float, probes_before: list, times: tuple, steps: int, **fields) -> dict:
        """A run as compare_arms (bench/tracking.py) reads it: its phases' wall seconds from
        `times` (start, set up, trained, ended; on this clock), its steady step time, the span
        beyond its steps at that rate, its probes and rows; `fields` add the arm's own."""
        t0, t_setup, t_train, t_end = times
        steady, wall = self.steady_ms(skip), t_end - t0
        return {
            "arm": arm,
            "wall_s": wall,
            "setup_s": t_setup - t0,
            "train_s": t_train - t_setup,
            "teardown_s": t_end - t_train,
            "steps": steps,
            "steady_ms": steady,
            "fixed_s": wall - steps * steady / 1000,
            "probes": probes_before + self.probes,
            "rows": len(self.sent),
            "rows_sent": sum(self.sent),
            **fields,
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
