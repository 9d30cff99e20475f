"""Portable CPU numerics: the same bits on an Intel and an AMD x86 machine.

A CPU run's floating-point results depend on the machine through four libraries, each of which
picks its code by the CPU it finds:
- MKL (matrix products, and ATen's exp / tanh / erf / sqrt, which go through MKL's vector math):
  its fast kernels by vendor and ISA; it takes its AVX-512 paths on Intel CPUs only. Its sqrt
  differs by vendor on every branch, so the code that needs one takes exact_math.exact_sqrt.
- ATen's own vectorised kernels (softmax, reductions, Sleef transcendentals): by
  torch.backends.cpu.get_cpu_capability(), AVX2 or AVX-512 widths.
- oneDNN (fp16/bf16 on CPU): by ISA.
- numpy's OpenBLAS (evaluate's ridge baseline): a kernel per CPU family.
And on the number of threads, which splits the sums of a product or a reduction.

`pin()` makes every one of them take one path on any x86-64 CPU with AVX2 (Intel Haswell and
later, AMD Zen and later), by setting defaults in the environment before torch is imported:
MKL_CBWR=COMPATIBLE (MKL's conditional-numerical-reproducibility branch meant for "Intel and
compatible" processors; its AVX2/AVX512 branches fall back to AUTO on a non-Intel CPU),
MKL_DYNAMIC=FALSE, ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell;
and `threads()` gives the fixed intra-op thread count that a stage uses when none is configured
(MKL's COMPATIBLE branch has no thread-count-independent "strict" mode). bench/numerics.py
measures what each of these changes and what the setting costs.

A value the user set is never overridden. `ENERGY_FLOW_NUMERICS=native` turns it all off (each
library picks its fastest path for this CPU, and threads are the machine's cores): faster,
reproducible on this machine only. A stage process calls `pin()` (stages/startup.py) before it imports
torch, so every stage, DVC's and torchrun's processes included, gets it (the environment is
inherited by child processes too).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from pathlib import Path
from typing import MutableMapping

MODE_VAR = "ENERGY_FLOW_NUMERICS"
MODES = ("portable", "native")
PORTABLE = {
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "OMP_NUM_THREADS": "1",
}
PORTABLE_THREADS = 1  # a fixed count: see the module doc (MKL's COMPATIBLE branch has no strict mode)


def mode(environ: MutableMapping[str, str] | None = None) -> str:
    """ "portable" or "native" as asked by ENERGY_FLOW_NUMERICS (unset: portable)."""
    env = os.environ if environ is None else environ
    value = env.get(MODE_VAR, "").strip().lower() or "portable"
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={env.get(MODE_VAR)!r}: expected one of {', '.join(MODES)}")
    return value


def pin(environ: MutableMapping[str, str] | None = None) -> dict:
    """Set the portable setting's variables as defaults in `environ` (os.environ), and
    ENERGY_FLOW_NUMERICS=portable, which marks it pinned for this process and its children. A
    variable already set keeps its value. Returns what is in effect: {"mode", "set": {var: value
    set now}, "kept": {var: the user's value}}. With ENERGY_FLOW_NUMERICS=native nothing is set.

    Only before torch is imported (MKL and ATen read these once, at their first use): if torch is
    already in sys.modules of this process, nothing is set and the record says
    {"mode": "native", "late": True}: a process that is half portable would be worse than one
    that is plainly native."""
    env = os.environ if environ is None else environ
    m = mode(env)
    record: dict = {"mode": m, "set": {}, "kept": {}}
    if m == "portable" and environ is None and "torch" in sys.modules and MODE_VAR not in env:
        record.update(mode="native", late=True)
    elif m == "portable":
        for key, value in {**PORTABLE, MODE_VAR: "portable"}.items():
            if key in env:
                record["kept"][key] = env[key]
            else:
                env[key] = value
                record["set"][key] = value
    return record


def pinned() -> bool:
    """Whether this process runs under the portable setting (pinned here or inherited)."""
    return os.environ.get(MODE_VAR, "").strip().lower() == "portable"


def threads(configured: int = 0) -> int:
    """The intra-op thread count a stage sets: `configured` (train.threads) if set; else, under
    the portable setting, OMP_NUM_THREADS (which pin() defaults to PORTABLE_THREADS); else 0 (keep
    torch's default, or share out the cores: pipeline/core/distributed.threads_per_process)."""
    if configured:
        return configured
    return portable_threads() if pinned() else 0


def portable_threads() -> int:
    """The intra-op thread count under the portable setting: OMP_NUM_THREADS as pin() leaves it
    (PORTABLE_THREADS unless the user set it). Also what a benchmark asks, to train as a stage
    does without being pinned itself (bench/trainer.py: stage_threads)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", PORTABLE_THREADS)))
    except ValueError:
        return PORTABLE_THREADS


def vectors_tag() -> str:
    """What, besides the model and the text, decides a vector's bits in this process: the
    portable setting and its thread count ("portable/1": MKL's COMPATIBLE branch splits sums by
    thread), or natively this CPU ("native/<CPU model>": MKL's strict mode, which the embed stage
    sets natively, keeps the thread count out of the bits). The embedding cache keys its vectors
    by it, so a vector made under one setting is never reused under another (a cache filled
    natively would otherwise carry this machine's bits into every later portable run)."""
    import torch

    if pinned():
        return f"portable/{torch.get_num_threads()}"
    return f"native/{cpu_model()}"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else platform.processor(), else the machine type."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _mkl_version(config: str) -> str:
    for line in config.splitlines():
        if "Math Kernel Library Version" in line:
            return line.split("Version", 1)[1].split("for Intel")[0].strip()
    return "none"


def numerics_info() -> dict[str, str]:
    """What decides this process's CPU numerics, as short strings for MLflow params or tags:
    mode, torch and MKL versions, ATen's CPU capability, MKL_CBWR, the thread count, the CPU
    model, and the pinned variables' values."""
    import torch

    info = {
        "numerics.mode": "portable" if pinned() else "native",
        "numerics.torch": torch.__version__,
        "numerics.mkl": _mkl_version(torch.__config__.show()) if torch.backends.mkl.is_available() else "none",
        "numerics.cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numerics.threads": str(torch.get_num_threads()),
        "numerics.cpu": cpu_model(),
    }
    for key in PORTABLE:
        info[f"numerics.{key}"] = os.environ.get(key, "")
    return info
