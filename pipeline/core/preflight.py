"""What a stage's config will cost, checked before any work and before any rank starts.

`preflight(cfg, stage, processes, costs)` runs in stages/_cli.py's run_stage after the config and
the output directories are checked, in the process that would start the work (the one process,
or the launcher before torchrun starts the ranks). It refuses more processes than usable cores
(CPU) or GPUs (CUDA): beyond the cores they only take turns, and each holds a whole copy of the
model; more intra-op threads than usable cores, refused rather than clamped, as the thread count
splits the sums of every product (pipeline/core/numerics.py); and, through the stage's own
`costs` (`check_memory`), memory that the node cannot give. Each refusal names the key to lower
and the numbers; `costs` may also warn about what will take longer than a day (`warn_duration`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from omegaconf import OmegaConf

from pipeline.core import resources
from pipeline.core.errors import ConfigError, ResourceError

log = logging.getLogger(__name__)

NPROC_KEYS = {"train": "train.nproc", "embed": "embed.nproc"}
DEVICE_KEYS = {"train": "train.device", "embed": "embed.device"}
THREAD_KEYS = ("train.threads",)  # every intra-op thread count a user sets (schema.py)
DAY_S = 86_400.0


@dataclass(frozen=True)
class Need:
    """Memory one process of a stage needs, and what a user can lower to need less."""

    per_process_mb: float
    parts: str  # the estimate's sum, part by part, for the message
    keys: str  # the keys that drive it


def _mb(mb: float) -> str:
    return f"{mb:,.0f} MB"


def check_cores(cfg, stage: str, processes: int, device: str, cores: Optional[resources.Cores] = None) -> None:
    """Processes against usable cores (CPU) or GPUs (CUDA); thread counts against usable cores."""
    cores = cores or resources.usable_cores()
    key = NPROC_KEYS.get(stage)
    if key and processes > 1:
        if device.startswith("cuda"):
            import torch

            gpus = torch.cuda.device_count()
            if processes > gpus:
                raise ConfigError(
                    f"parameter '{key}' = {processes}, but this machine has {gpus} CUDA device(s) and each "
                    f"process needs its own; expected {key} <= {gpus}. Nothing was started"
                )
        elif processes > cores.usable:
            raise ConfigError(
                f"parameter '{key}' = {processes}, but this process may use {cores.usable} core(s) "
                f"({cores.source}); expected {key} <= {cores.usable} on {DEVICE_KEYS[stage]}=cpu. Nothing was started"
            )
    if stage != "train":
        return
    for tkey in THREAD_KEYS:
        threads = int(OmegaConf.select(cfg, tkey) or 0)
        if threads > cores.usable:
            raise ConfigError(
                f"parameter '{tkey}' = {threads}, but this process may use {cores.usable} core(s) "
                f"({cores.source}); expected {tkey} <= {cores.usable} (0 = the stage's own choice)"
            )
        if threads and processes > 1 and threads * processes > cores.usable:
            log.warning(
                "%s = %d threads x %d processes = %d threads on %d usable core(s): they will take turns",
                tkey,
                threads,
                processes,
                threads * processes,
                cores.usable,
            )


def check_memory(need: Need, processes: int, memory: Optional[resources.Memory] = None, held_mb: float = 0.0) -> None:
    """processes x need against what this node's cgroup (or the machine) can still give; each
    process against its rlimit. `held_mb`: what each process already holds of its need (it is
    in the estimate and no longer free)."""
    memory = memory or resources.available_memory()
    total, room = processes * need.per_process_mb, memory.free_mb + processes * held_mb
    times = f" x {processes} processes = {_mb(total)}" if processes > 1 else ""
    held = f" + {_mb(held_mb)} this process holds" + (f", x {processes}" if processes > 1 else "") if held_mb else ""
    if total > room:
        raise ResourceError(
            f"this config needs about {_mb(need.per_process_mb)} per process ({need.parts}){times}, but "
            f"{_mb(room)} is available ({_mb(memory.free_mb)} from {memory.source}{held}); lower {need.keys}. "
            "Nothing was started"
        )
    cap = memory.per_process
    if cap is not None and need.per_process_mb - held_mb > cap.headroom / resources.MB:
        raise ResourceError(
            f"this config needs about {_mb(need.per_process_mb)} per process ({need.parts}), but "
            f"{cap.source} leaves each process {_mb(cap.headroom / resources.MB)} more; lower {need.keys}, "
            "or raise the limit. Nothing was started"
        )


def warn_duration(stage: str, seconds: float, plan: str, keys: str) -> bool:
    """One warning when the planned work takes longer than a day: "train will take about N days
    (plan); lower keys". True when it warned."""
    if seconds <= DAY_S:
        return False
    log.warning("%s will take about %s (%s); lower %s", stage, _duration(seconds), plan, keys)
    return True


def _duration(seconds: float) -> str:
    days = seconds / DAY_S
    if days >= 365 * 100:
        return f"{days / 365:,.3g} years"
    return f"{days:,.1f} days" if days < 365 else f"{days / 365:,.1f} years"


def preflight(
    cfg,
    stage: str,
    processes: int,
    costs: Optional[Callable[[object, int], None]] = None,
    cores: Optional[resources.Cores] = None,
) -> None:
    """The checks above, then the stage's own (`costs(cfg, processes)`: raises when the config
    cannot fit, warns when it will take more than a day). Raises ConfigError / ResourceError."""
    from pipeline.core.distributed import available_device

    key = DEVICE_KEYS.get(stage)
    device = available_device(key, str(OmegaConf.select(cfg, key))) if key else "cpu"
    check_cores(cfg, stage, processes, device, cores)
    if costs is not None:
        costs(cfg, processes)
