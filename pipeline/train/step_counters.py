"""What one training step asks of the host and the device, counted rather than estimated.

A step on a GPU is fast only if the host queues work faster than the device runs it. Two things
break that, and both are counted here over a sampled step, whatever their source (the model's
flow loop, the training loop, the optimizer, logging):

- **host reads** (`host_syncs`): every call that needs a tensor's *values* on the host: `.item()`,
  `.tolist()`, `bool(t)`, `.cpu()`, a boolean-mask index, `nonzero` (its output size depends on
  the data). On a GPU each one makes the host wait until the device has caught up (a sync); on a
  CPU it costs nothing, but it is the same call, so the count is the same on both and a test on a
  CPU proves it. Tensors that live on the host by design are not device reads: an optimizer's
  step counter (AdamW keeps it on the CPU on every device unless `capturable`), passed as `host`.
- **ops dispatched** (`ops`): the aten operators the step runs, forward and backward. On a GPU
  each is (about) one kernel launch, and launching costs the host microseconds whatever the
  kernel's size: thousands of tiny ops make a step launch-bound.

On CUDA a short `torch.profiler` window over the same step adds what only the device knows:
kernels launched, their mean duration, the syncs the CUDA runtime saw
(`cudaStreamSynchronize` and friends) and the fraction of the step's wall time the GPU was
busy. Off CUDA those stay NaN: measured, never estimated.

Counting costs a Python call per op (milliseconds a step) and profiling slows launches, so
the two never share a step and neither is timed: the trainer samples a step now and then and
leaves the sampled steps out of its step-time figures.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods and torch functions that bring values to the host. `cpu` and `to` count only
# when they move a tensor off another device (on a CPU run they are no-ops).
_VALUE_READS = frozenset(
    {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__", "__format__"}
)
# Ops whose output size depends on the data: the host must know it to allocate.
_SIZE_READS = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
# The CUDA runtime calls that block the host until the device has finished.
CUDA_SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
SAMPLE_KEYS = ("host_syncs", "ops", "kernels", "kernel_us", "gpu_busy")


def _is_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _off_device_copy(name: str, args, kwargs) -> bool:
    """`t.cpu()` / `t.to("cpu")` of a tensor that is not on the host already."""
    t = args[0] if args else None
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return False
    if name == "cpu":
        return True
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


def _caller() -> str:
    """ "dir/file.py:line function" of the frame that made the call (past this module)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    where = "/".join(frame.f_code.co_filename.split("/")[-2:])
    return f"{where}:{frame.f_lineno} {frame.f_code.co_name}"


class _HostReads(TorchFunctionMode):
    def __init__(self, host: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.count = 0
        self.sites: collections.Counter = collections.Counter()
        self._host = {id(t) for t in host}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        read = False
        if name in _VALUE_READS or name in _SIZE_READS or (name == "where" and len(args) + len(kwargs) == 1):
            first = args[0] if args else None
            read = not (isinstance(first, torch.Tensor) and id(first) in self._host)
        elif name == "__getitem__" and len(args) > 1:
            read = _is_bool_index(args[1])
        elif name in ("cpu", "to"):
            read = _off_device_copy(name, args, kwargs)
        if read:
            self.count += 1
            self.sites[f"{_caller()} {name}"] += 1
        return func(*args, **kwargs)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


@dataclass
class StepSample:
    """One sampled step's counts (per optimizer step). NaN: not measured on this device."""

    host_syncs: float = math.nan
    ops: float = math.nan
    kernels: float = math.nan
    kernel_us: float = math.nan
    gpu_busy: float = math.nan
    cuda_syncs: float = math.nan  # what the CUDA runtime saw (the ground truth of host_syncs there)
    read_sites: dict[str, int] = field(default_factory=dict)  # "file:line function op" -> reads

    def figures(self) -> dict[str, float]:
        """The telemetry's figures (SAMPLE_KEYS)."""
        return {k: float(getattr(self, k)) for k in SAMPLE_KEYS}


def optimizer_host_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer state kept on the host on every device (AdamW's per-parameter step count
    when not capturable): reading it never waits for a GPU."""
    return [
        v
        for state in opt.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0
    ]


def _device_figures(prof, wall_s: float) -> dict[str, float]:
    """Kernels, their mean duration, runtime syncs and the busy fraction from a profiler window
    over one step on CUDA."""
    kernels, kernel_us, syncs = 0, 0.0, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            kernel_us += e.time_range.elapsed_us()
        elif e.name in CUDA_SYNC_CALLS:
            syncs += 1
    return {
        "kernels": float(kernels),
        "kernel_us": kernel_us / kernels if kernels else math.nan,
        "gpu_busy": min(1.0, kernel_us / 1e6 / wall_s) if wall_s > 0 else math.nan,
        "cuda_syncs": float(syncs),
    }


@contextlib.contextmanager
def count_host(host: Iterable[torch.Tensor] = ()) -> Iterator[StepSample]:
    """Count the host reads and ops of the code inside; fills the yielded StepSample's
    host_syncs, ops and read_sites on exit (per call: divide by the steps inside yourself).
    The counting costs a Python call per op, so time nothing inside it."""
    sample = StepSample()
    reads, ops = _HostReads(host), _Ops()
    with reads, ops:
        yield sample
    sample.host_syncs = float(reads.count)
    sample.ops = float(ops.count)
    sample.read_sites = dict(reads.sites.most_common())


@contextlib.contextmanager
def profile_device(device: torch.device) -> Iterator[StepSample]:
    """A torch.profiler window over the code inside, on CUDA: fills kernels, kernel_us,
    cuda_syncs and gpu_busy of the yielded StepSample on exit. The device is
    synchronised before and after, so the window holds this code's work only. Off CUDA it
    measures nothing (the fields stay NaN). The profiler's own bookkeeping adds host time per
    launch, so the busy fraction it gives is a lower bound."""
    sample = StepSample()
    if device.type != "cuda":
        yield sample
        return
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        yield sample
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    for k, v in _device_figures(prof, wall).items():
        setattr(sample, k, v)
    sample.cuda_syncs -= 1  # the window's own closing synchronize


@contextlib.contextmanager
def sampled_step(kind: Optional[str], latest: StepSample, opt: torch.optim.Optimizer, device: torch.device):
    """Around one optimizer step that telemetry.sample_due picked: "count" (host reads and ops,
    the optimizer's host-resident tensors left out), "profile" (CUDA kernels and busy time) or
    None (nothing measured). What was measured replaces those fields of `latest`, the sample
    every telemetry row carries until the next one."""
    if kind == "count":
        with count_host(optimizer_host_tensors(opt)) as sample:
            yield
        latest.host_syncs, latest.ops = sample.host_syncs, sample.ops
    elif kind == "profile":
        with profile_device(device) as sample:
            yield
        for k in ("kernels", "kernel_us", "gpu_busy", "cuda_syncs"):
            setattr(latest, k, getattr(sample, k))
    else:
        yield
