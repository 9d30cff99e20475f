"""Where the run trains and in which number format: the device and the autocast dtype."""

from __future__ import annotations

from typing import Optional

import torch

from pipeline.core.errors import PipelineError


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
