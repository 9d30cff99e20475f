"""torch.distributed for the stages: which rank this process is, its process group, and the launch
(docs/training.md, "Distributed training and embedding").

A stage runs under `torchrun ... -m stages.train` (it joins torchrun's group), or, with
`train.nproc` (or `embed.nproc`) > 1, starts torchrun's launcher itself (elastic_launch, a
standalone rendezvous on this machine, no restarts) and exits with the code of the rank that
failed first. The backend follows the device: nccl on CUDA, gloo on CPU. Only rank 0 talks.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from pipeline.core import lifetime, numerics
from pipeline.core.environment import temporary_env

log = logging.getLogger(__name__)

# A rank that waits longer than this in a collective is stuck (a peer died without torchrun
# noticing): fail instead of hanging a CI job for torch's default 30 minutes.
TIMEOUT = datetime.timedelta(minutes=10)
LAUNCH_DIR_PREFIX = "energy-flow-launch-"
# torchrun's agent gives the ranks this long to stop after its signal before it kills them.
AGENT_STOP_WAIT = 30


@dataclass(frozen=True)
class Dist:
    """This process's place in the job; Dist() is the single-process case."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: Optional[str] = None  # None: no process group

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place across ranks (sum, max or min); a no-op for one process. Returns the tensor."""
        if self.enabled:
            ops = {
                "sum": torch.distributed.ReduceOp.SUM,
                "max": torch.distributed.ReduceOp.MAX,
                "min": torch.distributed.ReduceOp.MIN,
            }
            torch.distributed.all_reduce(tensor, op=ops[op])
        return tensor

    def broadcast_text(self, text: str = "") -> str:
        """Rank 0's string on every rank (a path, a run id): bytes in a tensor, no pickle."""
        if not self.enabled:
            return text
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.long)
        torch.distributed.broadcast(size, 0)
        if not self.is_main:
            data = torch.empty(int(size), dtype=torch.uint8)
        torch.distributed.broadcast(data, 0)
        return bytes(data.tolist()).decode()


def from_env() -> Dist:
    """The place torchrun gave this process (RANK, WORLD_SIZE, ...), without joining a group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return Dist(
        rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
    )


def under_launcher() -> bool:
    """True inside a process torchrun (or our launch()) started."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def available_device(key: str, name: str) -> str:
    """`name` (auto, cpu, cuda, cuda:N) as a device this machine has: auto is cuda when there is
    one, else cpu; a CUDA device that is not here is a ConfigError naming `key`, before any work."""
    from pipeline.core.errors import ConfigError

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"parameter '{key}' = {name!r}, but this machine has no CUDA device (torch "
                f"{torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA); "
                f"expected {key}=cpu or auto"
            )
        index = torch.device(name).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(
                f"parameter '{key}' = {name!r}, but this machine has {torch.cuda.device_count()} CUDA "
                f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1}); expected one of them"
            )
    return name


def device_for(name: str, place: Dist) -> str:
    """A device setting for this rank: each rank of a CUDA job gets its own GPU (cuda:LOCAL_RANK),
    whatever index the setting names (one setting serves every rank)."""
    if place.enabled and torch.cuda.is_available() and (name == "auto" or name.startswith("cuda")):
        torch.cuda.set_device(place.local_rank)
        return f"cuda:{place.local_rank}"
    return name


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[Dist]:
    """Join torchrun's process group for the run (when there is one) and leave it after. On CUDA
    each rank takes its own GPU, cuda:LOCAL_RANK (the trainer puts the model there too)."""
    place = from_env()
    if not place.enabled:
        yield place
        return
    backend = backend_for(device)
    gpu = None
    if device.type == "cuda":
        gpu = torch.device("cuda", place.local_rank)
        torch.cuda.set_device(gpu)
    # With nccl, small host-side exchanges (broadcast_text) still go over gloo: one group, both.
    torch.distributed.init_process_group(
        "cpu:gloo,cuda:nccl" if backend == "nccl" else backend, timeout=TIMEOUT, device_id=gpu
    )
    try:
        yield Dist(place.rank, place.world_size, place.local_rank, place.local_world_size, backend)
    finally:
        torch.distributed.destroy_process_group()


def threads_per_process(configured: int, place: Dist) -> int:
    """Intra-op threads: the configured number; else, under the portable numerics (the default),
    its fixed count (pipeline/core/numerics.threads: the machine's core count would change the bits);
    else this machine's cores shared out among the processes on it, so that 2 processes on 2
    cores do not start 2 threads each and oversubscribe them (torchrun's command line sets
    OMP_NUM_THREADS=1 for the same reason)."""
    fixed = numerics.threads(configured)
    if fixed:
        return fixed
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, place.local_world_size))


def configure_rank_output(stage: str, place: Dist) -> str:
    """Only rank 0 talks: other ranks keep their errors, prefixed with their rank, and drop
    their warnings, which rank 0 gives once (every rank reads the same data and config, so a
    warning about them came out once per rank: a 24-row test split was reported twice). Returns
    the prefix for this process's own messages."""
    if place.is_main:
        return stage
    name = f"{stage} rank {place.rank}"
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    logging.basicConfig(level=logging.ERROR, format=f"[{name}] %(message)s")
    logging.captureWarnings(True)  # warnings.warn from torch and friends: logged, so dropped too
    return name


def launch(nproc: int, module: str, args: Sequence[str], stage: str) -> int:
    """Run `python -m module args` in `nproc` processes on this machine under torchrun's launcher;
    return the exit code of the first rank that failed (0 when all succeeded)."""
    with lifetime.private_temp_dir(LAUNCH_DIR_PREFIX) as tmp:
        # The environment torchrun copies to the ranks: the launcher's pid, for the parent-death
        # signal, and TMPDIR, so that what the ranks leave in their temp directory goes with the launch's.
        with temporary_env({lifetime.PARENT_ENV: str(os.getpid()), "TMPDIR": str(tmp)}):
            # This process waits for the ranks' stops, then torchrun's kill: its own stop gets longer.
            lifetime.set_stop_grace(2 * AGENT_STOP_WAIT + lifetime.STOP_GRACE)
            return _launch(nproc, module, args, stage, tmp)


def _launch(nproc: int, module: str, args: Sequence[str], stage: str, tmp) -> int:
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp)),  # else a torchelastic_* directory in /tmp, per launch
    )
    # torchrun's own loggers set their level at import (WARNING): quiet them, as the failure and
    # the signal are reported below in one line each (they add "Received 15 death signal" and an
    # "E ... failed (exitcode: 1)" line with a pointer to torchrun's error-file docs).
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    log.info("%d processes under torchrun (standalone, this machine)", nproc)
    try:
        elastic_launch(config, sys.executable)("-u", "-m", module, *args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode  # -15: killed by SIGTERM
        print(
            f"[{stage}] rank {rank} of {nproc} failed first (exit code {failure.exitcode}); its message is "
            "above. The other ranks were stopped.",
            file=sys.stderr,
        )
        return code
    except SignalException as e:
        print(f"[{stage}] stopped by {e.sigval.name}: the {nproc} ranks were stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    return 0
