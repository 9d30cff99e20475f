"""Where the run trains and in which number format: the device, the autocast dtype, and the model
on its device with what runs its forward pass."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

import numpy as np
import torch

from pipeline.core.distributed import Dist, device_for
from pipeline.core.errors import PipelineError
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.cuda_graph import FlowRunner, why_eager

log = logging.getLogger(__name__)


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


def slow_precision_warning(name: str, device: torch.device) -> Optional[str]:
    """What to tell a run that asked for fp16 on a CPU, or None. CPUs have no fast fp16 matmuls:
    autocast's fp16 kernels on a CPU run several times slower than fp32, while the GradScaler
    behaviour the fp16 presets show is the same as on a GPU, so such a run is allowed, and told."""
    if name != "fp16" or device.type != "cpu":
        return None
    return (
        "train.precision=fp16 on a CPU: CPUs have no fast fp16 kernels, so each step runs several times "
        "slower than in fp32; use train.precision=fp32 (the same numbers on every CPU) or bf16 unless the "
        "run is about fp16 itself (the fp16_* presets)"
    )


def precision_candidates(name: str, device: torch.device) -> list[Optional[torch.dtype]]:
    """What `train.precision=auto` times on this device: fp32 and, on a CUDA GPU that has it, bf16
    (same range as fp32, so no scaler). Off CUDA only fp32: a CPU's bf16 speed depends on its
    instructions (AMX or not), and the same config must give the same numbers on every CPU."""
    if name == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return [None, torch.bfloat16]
    return [select_precision(name, device)]


def device_and_precision(t, place: Dist, report: bool) -> tuple[torch.device, Optional[torch.dtype]]:
    """train.device for this rank (a CUDA rank: cuda:LOCAL_RANK) and train.precision's autocast
    dtype there; `report`: say when the precision is a slow one here."""
    device = select_device(device_for(t.device, place))
    if (slow := slow_precision_warning(t.precision, device)) and report:
        log.warning(slow)
    return device, select_precision(t.precision, device)


def choose_precision(tr) -> None:
    """train.precision=auto on CUDA, at a run's first step: the faster candidate (fastest_precision)."""
    candidates = precision_candidates(tr.t.precision, tr.device)
    if len(candidates) > 1 and tr.step == 0:
        tr.amp_dtype = fastest_precision(tr, candidates)


def fastest_precision(tr, candidates: list[Optional[torch.dtype]]) -> Optional[torch.dtype]:
    """train.precision=auto on CUDA: time forward + backward of the first batch in each candidate
    precision, as the run `tr` will execute it (graphs captured where they apply), and keep the
    faster (its times in tr.precision_ms). The gradients are dropped: no update is made, nothing
    of the run moves."""
    with contextlib.closing(tr.loader.batches(0)) as first:  # closing stops a prefetch thread
        x, y = (b.to(tr.device) for b in next(first))
    times = {}
    for dtype in candidates:
        name = "fp32" if dtype is None else "bf16"
        spent = []
        for i in range(5):  # the first two warm up (and capture)
            torch.cuda.synchronize(tr.device)
            t0 = time.perf_counter()
            with autocast(tr, dtype):
                out = tr.runner(x, dtype)
            energy_flow_loss(out.pred.float(), y, **tr.loss_weights).backward()
            torch.cuda.synchronize(tr.device)
            spent.append(time.perf_counter() - t0)
            tr.opt.zero_grad(set_to_none=True)
        times[name] = 1000 * float(np.median(spent[2:]))
    tr.precision_ms = times
    best = min(times, key=times.get)
    log.info(
        "train.precision=auto: %s (forward + backward of one batch: %s)",
        best,
        ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()),
    )
    return None if best == "fp32" else torch.bfloat16


def build_model(
    cfg, dim: int, device: torch.device, place: Dist
) -> tuple[EnergyFlowModel, torch.nn.Module, FlowRunner]:
    """The model on `device`, what its forward pass (and backward's gradient all-reduce) goes
    through, DDP with several processes (health, checkpoints and evaluation use the model itself),
    and the runner that calls it (CUDA graphs where they apply). All parameters take part in every
    forward (checked: no gradient is None at batch 1, 4 or 16), so no unused-parameter search; the
    model has no buffers, so DDP has none to broadcast."""
    t = cfg.train
    model = EnergyFlowModel.from_config(cfg.model, dim).to(device)
    model.train()
    model.flow_loop = str(t.flow_loop)
    forward = model
    if place.enabled:
        forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    anomaly = t.detect_anomaly_steps > 0
    eager = why_eager(model, device, processes=place.world_size, grad_accum=t.grad_accum, anomaly=anomaly)
    return model, forward, FlowRunner(model, forward, device, str(t.cuda_graph), eager)


def autocast(tr, dtype="run"):
    """The run's autocast (`dtype`: another one, as fastest_precision times)."""
    dtype = tr.amp_dtype if dtype == "run" else dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(tr.device.type, dtype=dtype, cache_enabled=tr.runner.autocast_cache())
