"""How benchmarks time their work so that their ratios hold on a shared machine: arms of one
process in its CPU seconds, interleaved, the median of the per-pair ratios; a ratio across thread
or process counts only in wall time, and only on a quiet machine (two threads doing the same work
in half the wall time spend the same CPU seconds, plus their waiting; docs/benchmarks.md, "Figures
that hold on a busy machine")."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Span:
    """One timed call: wall seconds and this process's CPU seconds."""

    wall: float
    cpu: float


def measure(fn: Callable[[], object], sync: Callable[[], None] = lambda: None) -> tuple[Span, object]:
    """Calls `fn` once; its span and its result. `sync` waits for an accelerator's queued work,
    before and after, so the span holds the call's whole work."""
    sync()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    sync()
    return Span(time.perf_counter() - w0, time.process_time() - c0), out


def sync(device) -> None:
    """Waits for a CUDA device's queued work (a CPU's is done when the call returns)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def cpu_per_call(fn: Callable[[], object], reps: int, sync: Callable[[], None] = lambda: None) -> Span:
    """The median span of `reps` calls after one untimed warm-up call (allocator, thread pool)."""
    fn()
    spans = [measure(fn, sync)[0] for _ in range(reps)]
    return Span(float(np.median([s.wall for s in spans])), float(np.median([s.cpu for s in spans])))


def interleaved_ratio(
    a: Callable[[], object], b: Callable[[], object], pairs: int, sync: Callable[[], None] = lambda: None
) -> dict:
    """CPU seconds of `a` over `b`, as the median over `pairs` interleaved pairs, the order
    alternating (ab, ba, ab, ...) so that neither arm always runs first; each arm warmed once.
    Returns the ratio, each pair's ratio and each arm's median spans."""
    a()
    b()
    spans: dict[str, list[Span]] = {"a": [], "b": []}
    for i in range(pairs):
        for arm in ("a", "b") if i % 2 == 0 else ("b", "a"):
            spans[arm].append(measure(a if arm == "a" else b, sync)[0])
    ratios = [x.cpu / y.cpu for x, y in zip(spans["a"], spans["b"])]
    return {
        "ratio": float(np.median(ratios)),
        "pair_ratios": ratios,
        "a_cpu_s": float(np.median([s.cpu for s in spans["a"]])),
        "b_cpu_s": float(np.median([s.cpu for s in spans["b"]])),
        "a_wall_s": float(np.median([s.wall for s in spans["a"]])),
        "b_wall_s": float(np.median([s.wall for s in spans["b"]])),
    }


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of the pairwise ratios a[i] / b[i] (spans taken side by side)."""
    return float(np.median([x / y for x, y in zip(a, b)]))


def stage_threads() -> int:
    """The intra-op threads a stage trains on (train.threads=0): under the portable numerics, the
    default, the fixed count stages/__init__.py pins (OMP_NUM_THREADS, else PORTABLE_THREADS: 1);
    natively 0, torch's default. A bench process is not pinned, and on every core the same model
    contends with MLflow's logging threads in a way the stage never does."""
    from pipeline.core import numerics

    return numerics.portable_threads() if numerics.mode() == "portable" else 0


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def wall_ratio_unreliable(busy: Optional[bool], needs_cores: int) -> Optional[str]:
    """Why a ratio of wall-clock spans across thread or process counts cannot be trusted here
    (None: it can): it needs `needs_cores` cores to itself, and a quiet machine."""
    have = cores()
    if have < needs_cores:
        return (
            f"a wall-clock ratio across thread or process counts needs {needs_cores} cores to itself; "
            f"this machine has {have}, shared with whatever else runs"
        )
    if busy or busy is None:
        return (
            "a wall-clock ratio across thread or process counts moves with the other processes' load, "
            "and the probes say the machine was busy (or took none)"
        )
    return None


def pin_threads(threads: Optional[int] = None) -> int:
    """Sets torch's intra-op threads for a bench that compares arms by CPU seconds: `threads`, by
    default the train stage's (stage_threads; 0 leaves torch's default). CPU seconds measure a
    process's work only while none of its threads waits for another that the machine's other
    load took off a core. Returns the count in use."""
    import torch

    want = stage_threads() if threads is None else threads
    if want:
        torch.set_num_threads(want)
    return torch.get_num_threads()


# Two runs agree when each figure is within this fraction of the other; a figure whose own
# spread inside one run is wider than that cannot be expected to agree with another run's.
AGREEMENT = 0.10


def median_half_width(xs: Sequence[float]) -> Optional[float]:
    """Half the width of an approximate 95 % interval of the median of `xs` (a box plot's notch:
    1.57 x the interquartile range over the square root of the count); None for fewer than 3."""
    xs = np.asarray(xs, dtype=float)
    if xs.size < 3:
        return None
    q1, q3 = np.percentile(xs, [25, 75])
    return float(1.57 * (q3 - q1) / np.sqrt(xs.size))


def spread_unreliable(figure: Optional[float], spread: Optional[float], how: str) -> Optional[str]:
    """Why `figure` cannot be reported (None: it can): its spread within this run (`how` says
    what the spread is; None: too few samples to have one) is wider than the tolerance two runs
    are held to."""
    if figure is None or not np.isfinite(figure):
        return "nothing was measured"
    if spread is None:
        return f"too few samples to know its spread ({how})"
    if spread > AGREEMENT * abs(figure):
        return (
            f"its spread within this run ({how}: {spread:.3g}) is more than {AGREEMENT:.0%} of the "
            f"figure ({figure:.3g}), so another run would not reproduce it"
        )
    return None


def cpu_with_children() -> tuple[float, float]:
    """(this process's CPU seconds, its waited-for children's)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), ru.ru_utime + ru.ru_stime
