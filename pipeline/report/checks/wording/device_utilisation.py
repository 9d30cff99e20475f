"""The device_utilisation check's messages."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

SYNTHETIC_SAID = (
    "These are synthetic device figures from fault=sync_bound on a machine without a GPU "
    "(perf/busy_synthetic = 1): the host syncs and ops are counted, the busy share and kernels are not measured."
)
SYNC_BOUND_FIX = (
    "Sync-bound: every host read (.item(), .tolist(), bool(tensor), nonzero, a boolean-mask "
    "index) makes the host wait for the GPU. Keep values on the device and read them once per "
    "step, as the training loop's one read does; the masked flow loop (train.flow_loop=masked, "
    "the default on CUDA) makes no read per flow step."
)
LAUNCH_BOUND_FIX = (
    "Launch-bound: many short kernels. Capture the flow loop as a CUDA graph (train.cuda_graph=always "
    "says why when it cannot; it needs the masked flow loop, train.flow_loop=masked, and one process), "
    "or raise train.batch_size so each kernel does more work."
)
DATA_BOUND_FIX = (
    "Data-bound: gather batches ahead on a background thread (train.prefetch=2 or more), pinned "
    "in memory on CUDA so the copy to the GPU does not wait on the host."
)
UNIDENTIFIED_FIX = (
    "The GPU idles, but neither host syncs, short kernels nor data waits account for it: profile a "
    "step (torch.profiler) and look at the gaps between kernels."
)


def not_logged_fix(col: str) -> str:
    return f"Log {col} (the trainer's sampled-step profile, NaN off CUDA) to enable this check."


def sync_bound(syncs: float, limit: int) -> str:
    return f"{syncs:.0f} host syncs per step (more than report.device_max_syncs = {limit})"


def launch_bound(kernels: float, kernel_us: float, short_kernel_us: float) -> str:
    return (
        f"{kernels:,.0f} kernels of {kernel_us:.1f} µs per step (shorter than the "
        f"~{short_kernel_us:g} µs a launch costs the host)"
    )


def data_bound(share: float, bound: float) -> str:
    return (
        f"{100 * share:.0f} % of the step waiting for data (perf/data_ms / perf/step_ms, more than {100 * bound:.0f} %)"
    )


def numbers(fig: Mapping[str, float]) -> str:
    """The figures measured, in words: '42 host syncs, 1,200 kernels of 5.0 µs per step, ...'."""
    parts = []
    if math.isfinite(fig["host_syncs_per_step"]):
        syncs = fig["host_syncs_per_step"]
        parts.append(f"{syncs:.0f} host sync{'' if syncs == 1 else 's'}")
    if math.isfinite(fig["kernels_per_step"]):
        of = f" of {fig['kernel_us']:.1f} µs" if math.isfinite(fig["kernel_us"]) else ""
        parts.append(f"{fig['kernels_per_step']:,.0f} kernels{of}")
    elif math.isfinite(fig["ops_per_step"]):
        parts.append(f"{fig['ops_per_step']:,.0f} ops")
    text = ", ".join(parts) + " per step" if parts else ""
    if math.isfinite(fig["data_wait_fraction"]):
        text += (", " if text else "") + f"{100 * fig['data_wait_fraction']:.0f} % of the step waiting for data"
    return text


def causes(found: Sequence[Mapping[str, str]], passed: bool) -> str:
    """The causes named, for the evidence: 'sync-bound, data-bound'."""
    return ", ".join(c["name"] for c in found) or ("none judged" if passed else "not identified")


def no_gpu(col: str, numbers_text: str) -> str:
    return (
        f"No GPU figures: {col} is NaN on every row (a run without CUDA), so there is nothing to judge"
        + (f"; {numbers_text}" if numbers_text else "")
        + "."
    )


def summary(e: Mapping, passed: bool, causes: Sequence[Mapping[str, str]], numbers_text: str) -> str:
    """From the check's evidence."""
    text = (
        f"The GPU ran kernels {100 * e['busy_fraction']:.0f} % of the sampled steps' wall time (median of "
        f"{e['rows']} rows; warns below {100 * e['warn_below_fraction']:.0f} %, fails below "
        f"{100 * e['fail_below_fraction']:.0f} %)"
    )
    if passed:
        text += (f"; {numbers_text}" if numbers_text else "") + "."
    elif causes:
        text += ": " + "; ".join(f"{c['name']}, {c['said']}" for c in causes) + "."
    else:
        text += f": cause not identified ({numbers_text or 'no sampled-step counts logged'})."
    if e["synthetic"]:
        text += " " + SYNTHETIC_SAID
    return text


def fix(passed: bool, causes: Sequence[Mapping[str, str]]) -> str | None:
    if passed:
        return None
    return " ".join(c["fix"] for c in causes) if causes else UNIDENTIFIED_FIX
