"""What one training process will need, known from the config before any of it is spent.

`check` runs in the train stage after the shards' manifest is read (it gives the embedding dim)
and before the model, the optimizer or a checkpoint is built or loaded. It estimates the peak
memory of one training step and the size of one resumable checkpoint, compares them with the
memory and disk there are, and refuses a config that cannot fit with a `ResourceError` naming
the estimate's parts, what is available and the keys that drive it (train.memory_check=false
skips the refusal; the estimate is still computed and logged).

The parts (all MB = 2**20 bytes), and why each is counted the way it is:

- baseline: this process's RSS at the check (Python, torch, pandas, the stage's modules, and
  torch's decompositions, which the meta-device build imports and building AdamW would import
  anyway). Measured, not estimated.
- params / grads: every parameter is fp32 (autocast casts activations, never the weights); the
  count is exact, from the model built on the meta device (as checkpoint.model_shapes). Gradients:
  one fp32 tensor per parameter, alive from backward until zero_grad(set_to_none=True).
- optimizer: AdamW (pipeline/train/optimizer.py), exp_avg and exp_avg_sq: 2 fp32 tensors
  per parameter, allocated at the first step and kept.
- update: step_health's update/weight ratio, once per log window, clones every weight before
  the optimizer step and then builds every (weight - clone) at once: 2 more fp32 copies of the
  parameters alive together with params, grads and optimizer state. On a parameter-heavy model
  this is the step's peak: 6 x params (params + grads + 2 AdamW + clone + deltas). For
  model.lattice_width=100000 (591 M parameters, 2,256 MB each copy) that is 13.5 GB + baseline
  (tests/test_memory_estimate.py checks the count and the 6 x params peak).
- activations: bytes saved for backward at the end of the forward pass, when all of them are
  alive (activations.py's `flow_step_bytes` counts them), plus what does not scale with flows:
  the (batch, lattice cells) tensors saved by the input map's tanh and the output map's
  LayerNorm and Linear.
- temporaries: alive during backward on top of the saved activations: two (batch, cells)
  gradients of the output surface, the largest parameter once (the dense gradient of the
  lattice gather / AdamW's denominator, one tensor at a time), and with model.checkpoint_steps
  one flow step's full activations recomputed.
- ddp: DistributedDataParallel's gradient buckets (gradient_as_bucket_view is off): one more
  fp32 copy of the parameters per process when there are several.
- resume: a checkpoint being resumed is loaded to host memory (map_location=cpu) and the stage
  holds it for the run: its file size.
- MLflow: rank 0's tracking client, run and metric buffer, started after the check (TRACKING_MB, measured).
- data: the batches in flight (train.prefetch + 2, inputs and targets, fp32). The memory-mapped
  shards are not counted: their pages are file-backed, reclaimable page cache (they show in RSS
  as the epoch touches them, but never cause an OOM).

peak = baseline + MLflow + data + resume + ddp + params + grads + optimizer + max(activations +
temporaries, update); on CUDA the model's part (ddp onwards) is on the device and compared with
torch.cuda.mem_get_info, the rest with host memory.

Measured (estimate / peak RSS of a fresh process running the check then train_model, VmHWM;
tests/test_memory_estimate.py prints both and checks their ratio, the seed preset in a slow
test): smoke 470 / 477 MB, default 544 / 560, seed 1,609 / 1,604.
What it leaves out: the allocator keeps what varying shapes (the live-flow count changes every
step) leave behind, so RSS creeps up over a long run and levels off, above this estimate: that
is the report's memory_growth check's business; the estimate is of a step's peak.

train.grad_accum adds nothing: each micro-batch's graph is freed by its backward (the trainer
deletes the step's outputs), and the micro-batches accumulate into the same .grad tensors, so
the peak is one micro-batch's (train.batch_size rows). Evaluation runs under no_grad with the
same batch size: less than a training step. fault=leak's kept graphs grow without bound by
design and are not counted.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Optional

import torch

from pipeline.core import resources
from pipeline.core.distributed import Dist, device_for
from pipeline.core.errors import ResourceError
from pipeline.model import EnergyFlowModel
from pipeline.train.activations import FP32, MB, fixed_activation_bytes, flow_step_bytes
from pipeline.train.device import select_device, select_precision
from pipeline.train.telemetry import rss_mb

log = logging.getLogger(__name__)

ADAMW_STATES = 2  # exp_avg, exp_avg_sq (amsgrad is off)

# Rank 0 with tracking on imports MLflow, opens its store and run (the local sqlite store) and
# the metric buffer (MLflow's async queue and the system-metrics sampler, threads of the stage's
# process), after the check. A constant: it cannot be measured before it is spent, and it is the
# same for every model: set from `python -m bench.tracking_memory` (MLflow's tables created in a new
# store), rounded up; bench/results/tracking_memory.json holds its last measurement.
TRACKING_MB = 147.0


# --------------------------------------------------------------------------- the estimate


def _mb(n_bytes: float) -> float:
    return n_bytes / MB


def _fmt(mb: float) -> str:
    return f"{mb:,.0f} MB"


@dataclass(frozen=True)
class MemoryEstimate:
    """One training process's memory, by part, in MB (module docstring: what each part is)."""

    device: str  # where the model lives: "cpu" or "cuda:N"
    processes: int  # training processes on this node (each holds all of this)
    parameters: int  # exact count
    biggest: tuple[str, int]  # the top-level module holding the most parameters, and how many
    baseline_mb: float
    params_mb: float
    grads_mb: float
    optimizer_mb: float
    update_mb: float
    activations_mb: float  # at the expected flow steps (the refusal uses this one: see `estimate`)
    activations_worst_mb: float  # every flow for the whole step bound
    temporaries_mb: float
    ddp_mb: float
    resume_mb: float
    data_mb: float
    tracking_mb: float
    checkpoint_mb: float  # one resumable checkpoint on disk (model + AdamW state)
    flows: int  # flows spawned per micro-batch: batch x flows_per_sample
    steps_expected: int
    step_bound: int
    bytes_per_flow_step: float
    probe: str  # where the activation probe ran, and in which precision

    def _model_mb(self, activations_mb: float) -> float:
        step = max(activations_mb + self.temporaries_mb, self.update_mb)
        return self.ddp_mb + self.params_mb + self.grads_mb + self.optimizer_mb + step

    @property
    def on_device(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def host_peak_mb(self) -> float:
        host = self.baseline_mb + self.tracking_mb + self.data_mb + self.resume_mb
        return host if self.on_device else host + self._model_mb(self.activations_mb)

    @property
    def device_peak_mb(self) -> float:
        return self._model_mb(self.activations_mb) if self.on_device else 0.0

    @property
    def peak_mb(self) -> float:
        """Per process, host and device together (on CPU: the host peak)."""
        return self.host_peak_mb + self.device_peak_mb

    @property
    def peak_worst_mb(self) -> float:
        return self.peak_mb + self._model_mb(self.activations_worst_mb) - self._model_mb(self.activations_mb)

    @property
    def activations_drive(self) -> bool:
        """The step's peak is its activations (not the copies of the parameters)."""
        return self.activations_mb + self.temporaries_mb > self.update_mb

    def metrics(self) -> dict[str, float]:
        """MLflow metrics, `split/name` as every other metric of the run: each part (the fields in
        MB), the peaks, then the checkpoint."""
        mb = [f.name for f in dataclasses.fields(self) if f.name.endswith("_mb") and f.name != "checkpoint_mb"]
        mb += ["peak_mb", "peak_worst_mb", "host_peak_mb", "device_peak_mb", "checkpoint_mb"]
        return {
            **{f"mem/estimate_{name}": float(getattr(self, name)) for name in mb},
            "mem/estimate_parameters": float(self.parameters),
            "mem/estimate_flow_steps": float(self.flows * self.steps_expected),
            "mem/estimate_flow_steps_worst": float(self.flows * self.step_bound),
            "mem/estimate_bytes_per_flow_step": float(self.bytes_per_flow_step),
            "mem/estimate_processes": float(self.processes),
        }

    def parts(self, where: str = "all") -> str:
        """The peak's sum, part by part (what the log line and the refusal show). `where`: "host"
        (baseline, MLflow, data, a resumed checkpoint), "model" (what lives with the model: on the
        GPU on CUDA) or "all"."""
        host = [
            ("baseline", self.baseline_mb),
            ("MLflow", self.tracking_mb),
            ("data", self.data_mb),
            ("resumed checkpoint", self.resume_mb),
        ]
        model = [
            ("DDP buckets", self.ddp_mb),
            ("parameters", self.params_mb),
            ("gradients", self.grads_mb),
            ("AdamW state", self.optimizer_mb),
        ]
        always = ("baseline", "parameters", "gradients", "AdamW state")
        items = {"host": host, "model": model, "all": host + model}[where]
        terms = [f"{name} {_fmt(mb)}" for name, mb in items if mb >= 0.5 or name in always]
        if where != "host":
            terms.append(
                f"max(activations {_fmt(self.activations_mb)} + temporaries {_fmt(self.temporaries_mb)}, "
                f"update copies {_fmt(self.update_mb)})"
            )
        return " + ".join(terms)

    def describe(self) -> str:
        where = f" on {self.device}" if self.on_device else ""
        return (
            f"peak {_fmt(self.peak_mb)} per process{where} = {self.parts()}; activations for "
            f"{self.flows:,} flows x {self.steps_expected} steps at {self.bytes_per_flow_step:,.0f} bytes a flow "
            f"step (worst case {self.step_bound} steps: peak {_fmt(self.peak_worst_mb)}); "
            f"{self.parameters:,} parameters; checkpoint {_fmt(self.checkpoint_mb)}"
        )


@dataclass(frozen=True)
class Available:
    """Memory this node's training processes can still have."""

    host_free_mb: float  # min(MemAvailable, cgroup headroom): what can still be allocated
    held_mb: float  # what this process holds now (its RSS): part of the budget it already has
    processes: int
    host_source: str  # where host_free_mb comes from, for the message
    device_free_mb: Optional[float] = None  # torch.cuda.mem_get_info on the model's device
    device_name: str = ""
    process_limit_mb: Optional[float] = None  # each process's own ceiling (an rlimit), if one is set
    process_source: str = ""

    @property
    def host_mb(self) -> float:
        """For all `processes` together: what is free plus what each of them holds now (every
        rank has about this one's baseline when the check runs)."""
        return self.host_free_mb + self.processes * self.held_mb

    def metrics(self) -> dict[str, float]:
        out = {"mem/available_host_mb": self.host_mb}
        if self.device_free_mb is not None:
            out["mem/available_device_mb"] = self.device_free_mb
        return out


def available_memory(device: torch.device, processes: int = 1) -> Available:
    """What this node's processes can still have: MemAvailable or the tightest limit of this
    process's own cgroups (pipeline/core/resources.py), and an rlimit's ceiling per process."""
    mem = resources.available_memory()
    device_free, name = None, ""
    if device.type == "cuda":
        device_free = _mb(torch.cuda.mem_get_info(device)[0])
        name = str(device)
    held = rss_mb()
    cap = mem.per_process
    # An rlimit bounds what this process maps: its resident peak can reach what it holds now plus
    # what is left under the limit.
    per_process = (held + _mb(cap.headroom), cap.source) if cap is not None else (None, "")
    return Available(mem.free_mb, held, processes, mem.source, device_free, name, *per_process)


def estimate(
    cfg,
    dim: int,
    place: Dist = Dist(),
    device: Optional[torch.device] = None,
    resume_path: Optional[Path] = None,
    tracked: bool = True,
) -> MemoryEstimate:
    """The memory of one training process of `cfg` on `dim`-d embeddings (nothing is built but a
    probe of one flow step). `tracked`: the process logs to MLflow (rank 0 counts TRACKING_MB).

    Flow steps, expected and worst: forward runs every flow until it arrives (z >= depth) or
    dies, each step moving it forward between min_forward and max_forward, so no step holds more
    than batch x flows_per_sample x ceil(depth / min_forward) (capped at max_steps): the worst
    case. An untrained forward head (sigmoid ~ 0.5) moves a flow (min + max) / 2 a step, so most
    flows arrive after ceil(depth / ((min + max) / 2)) steps, the slower ones a step later: the
    expected figure is that + 1 (capped). Untrained models stop at or before the expected figure
    (tests/test_memory_estimate.py checks the default, checkpointed, bf16 and seed-carrier
    configs); a trained default run uses fewer flow steps than the cap (metrics/train.json:
    flow/steps_used against flow/step_cap). The refusal uses the expected figure: refusing on the
    bound would multiply the activation term (the seed preset: 20 steps against 7, a 3,699 MB peak
    against 1,609) and could refuse what runs, and no run here came near it. The worst case is
    logged with it, and the log line warns when only the expected figure fits."""
    device = device or select_device(device_for(cfg.train.device, place))
    m, t = cfg.model, cfg.train
    # The exact parameter count: the model built on the meta device (as checkpoint.model_shapes
    # does), which allocates nothing, whatever its size (tests/test_memory_estimate.py refuses a
    # 10**10-cell config within its time limit).
    with torch.device("meta"):
        meta = EnergyFlowModel.from_config(m, dim)
    sizes = {name: p.numel() for name, p in meta.named_parameters()}
    n_params = sum(sizes.values())
    by_module = collections.Counter()
    for name, n in sizes.items():
        by_module[name.split(".")[0]] += n
    biggest = max(by_module.items(), key=lambda kv: kv[1])
    largest_tensor = max(sizes.values(), default=0)
    param_bytes = FP32 * n_params
    batch = int(t.batch_size)
    flows = meta.flows_per_sample(batch)
    cap = min(int(m.max_steps), meta.step_bound)
    expected_steps = min(cap, math.ceil(m.lattice_depth / ((m.min_forward + m.max_forward) / 2)) + 1)
    meta.flow_loop = str(t.get("flow_loop", "auto"))
    if meta.uses_masked_loop(device):
        # The masked loop keeps every flow to its end and starts at its cap (FlowLength.cap):
        # the bound is what it holds, not a worst case.
        cap = expected_steps = meta.masked_step_cap
    n_flows = batch * flows
    amp_dtype = select_precision(t.precision, device)
    per_flow_step, per_forward, where = flow_step_bytes(m, dim, amp_dtype)
    fixed = fixed_activation_bytes(batch, meta.n_cells, dim, int(m.output_hidden), flows) + per_forward
    act_expected = fixed + per_flow_step * n_flows * expected_steps
    act_worst = fixed + per_flow_step * n_flows * cap

    # Backward: the surface's gradient and the output LayerNorm's input gradient, (batch, cells)
    # each, while the flows' activations are still alive; then one parameter-sized temporary at a
    # time (the lattice gather's dense gradient, AdamW's denominator on the CPU).
    temporaries = 2 * FP32 * batch * meta.n_cells + FP32 * largest_tensor
    if m.checkpoint_steps:
        # Backward recomputes one flow step at a time: the widest (all flows alive) at most.
        plain, _, _ = flow_step_bytes({**{k: m[k] for k in m}, "checkpoint_steps": False}, dim, amp_dtype)
        temporaries += plain * n_flows
    # The clone of every weight, then (after the optimizer step freed its own temporaries: on
    # CUDA foreach AdamW's sqrt of all exp_avg_sq, ~1 x params) the deltas: 2 x params at most.
    update = 2 * param_bytes
    resume = 0
    if resume_path is not None and t.resume and Path(resume_path).is_file():
        resume = Path(resume_path).stat().st_size
    data = (int(t.prefetch) + 2) * 2 * batch * dim * FP32
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp_dtype]
    return MemoryEstimate(
        device=str(device),
        processes=max(1, int(place.local_world_size)),
        parameters=n_params,
        biggest=biggest,
        baseline_mb=rss_mb(),
        params_mb=_mb(param_bytes),
        grads_mb=_mb(param_bytes),
        optimizer_mb=_mb(ADAMW_STATES * param_bytes),
        update_mb=_mb(update),
        activations_mb=_mb(act_expected),
        activations_worst_mb=_mb(act_worst),
        temporaries_mb=_mb(temporaries),
        ddp_mb=_mb(param_bytes) if place.world_size > 1 else 0.0,
        resume_mb=_mb(resume),
        data_mb=_mb(data),
        tracking_mb=TRACKING_MB if place.is_main and tracked else 0.0,
        # Model + AdamW moments; step counters, schedule, RNG states and telemetry rows are KBs.
        checkpoint_mb=_mb((1 + ADAMW_STATES) * param_bytes),
        flows=n_flows,
        steps_expected=expected_steps,
        step_bound=cap,
        bytes_per_flow_step=per_flow_step,
        probe=f"{where} {precision if where == 'cpu' else 'fp32'}{', checkpointed' if m.checkpoint_steps else ''}",
    )


# --------------------------------------------------------------------------- the check


_PARAM_KEYS = MappingProxyType(
    {
        "input_mapper": "model.lattice_width x model.lattice_height (the input map is embedding dim x cells)",
        "output_mapper": "model.lattice_width x model.lattice_height or model.output_hidden (the output map is "
        "cells x output_hidden)",
        "lattice": "model.lattice_width x lattice_height x lattice_depth or model.cell_state_dim (the lattice "
        "holds cells x depth x cell_state_dim)",
        "carrier": "model.carrier_hidden or model.carrier_layers",
        "neuron": "model.neuron_hidden",
    }
)
_ACTIVATION_KEYS = (
    "train.batch_size, model.max_active_flows (flows per step), model.lattice_depth (steps), "
    "or set model.checkpoint_steps=true (a flow step then saves ~1/8 as much: 647 of 5,095 bytes at the "
    "default sizes)"
)


@dataclass(frozen=True)
class MemoryCheck:
    estimate: MemoryEstimate
    available: Available
    problems: tuple[str, ...] = ()  # what does not fit (empty: it fits)
    worst_fits: bool = True  # the worst-case flow steps fit too
    disk_free_mb: Optional[float] = None  # on train.checkpoint_dir's disk, when checkpointing

    @property
    def fits(self) -> bool:
        return not self.problems

    def metrics(self) -> dict[str, float]:
        out = {**self.estimate.metrics(), **self.available.metrics()}
        if self.disk_free_mb is not None:
            out["mem/available_disk_mb"] = self.disk_free_mb
        return out

    def log(self) -> None:
        """The line in the stage's log: a warning when it does not fit (train.memory_check=false let
        it through) or when only the expected flow steps fit, not the worst case."""
        if not self.fits:
            log.warning("%s; going on: train.memory_check=false", self.describe())
        else:
            log.log(logging.INFO if self.worst_fits else logging.WARNING, "%s", self.describe())

    def describe(self) -> str:
        """One line for the log: estimate, available, verdict."""
        e, a = self.estimate, self.available
        n = f"{e.processes} processes x " if e.processes > 1 else ""
        if e.on_device:
            room = (
                f"{_fmt(e.device_peak_mb)} on {a.device_name} of {_fmt(a.device_free_mb or 0)} free there, "
                f"host {n}{_fmt(e.host_peak_mb)} of {_fmt(a.host_mb)} available"
            )
        else:
            room = f"{n}{_fmt(e.peak_mb)} of {_fmt(a.host_mb)} available ({a.host_source})"
        if a.process_limit_mb is not None:
            room += f", each process at most {_fmt(a.process_limit_mb)} ({a.process_source})"
        verdict = "fits" if self.fits else "does not fit"
        if self.fits and not self.worst_fits:
            verdict += f" (the worst case, {_fmt(e.peak_worst_mb)}, would not: flows slower than expected could OOM)"
        return f"memory estimate: {e.describe()}; {room}: {verdict}"


def _free_disk(path: Path) -> tuple[Path, int]:
    """Free bytes on the disk that will hold `path` (its nearest existing ancestor's)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path, shutil.disk_usage(path).free


def _what_to_change(e: MemoryEstimate) -> str:
    params = (
        f"the parameters ({e.parameters:,}, {e.biggest[1]:,} of them in {e.biggest[0]}) through "
        f"{_PARAM_KEYS.get(e.biggest[0], 'the model section')}"
    )
    acts = f"the activations through {_ACTIVATION_KEYS}"
    first, second = (acts, params) if e.activations_drive else (params, acts)
    return f"lower {first}; or {second}; or set train.memory_check=false to run anyway"


def check(
    cfg,
    dim: int,
    place: Dist = Dist(),
    checkpoint_path: Optional[Path] = None,
    available: Optional[Available] = None,
    tracked: bool = True,
) -> MemoryCheck:
    """Estimate, compare with what is available, and raise ResourceError when it cannot fit
    (unless train.memory_check=false). `checkpoint_path`: the resumable checkpoint's file (its
    size if it exists is a resume's; its disk must hold one more). `available`: what to compare
    with (default: this machine's, `available_memory`)."""
    device = select_device(device_for(cfg.train.device, place))
    e = estimate(cfg, dim, place, device, resume_path=checkpoint_path, tracked=tracked)
    a = available or available_memory(device, e.processes)
    problems = []
    n = e.processes
    host_what = e.parts("host" if e.on_device else "all")
    total = f" per process x {n} processes on this node = {_fmt(n * e.host_peak_mb)}" if n > 1 else ""
    if n * e.host_peak_mb > a.host_mb:
        held = f"{_fmt(a.held_mb)} this process holds" + (f", x {n} processes" if n > 1 else "")
        problems.append(
            f"the estimated {'host ' if e.on_device else ''}peak is {_fmt(e.host_peak_mb)} "
            f"({host_what}){total}, but {_fmt(a.host_mb)} host memory is available "
            f"({_fmt(a.host_free_mb)} from {a.host_source} + {held})"
        )
    if a.process_limit_mb is not None and e.host_peak_mb > a.process_limit_mb:
        problems.append(
            f"the estimated {'host ' if e.on_device else ''}peak of one process is {_fmt(e.host_peak_mb)} "
            f"({host_what}), but {a.process_source} lets each process reach {_fmt(a.process_limit_mb)}"
        )
    worst_fits = n * (e.peak_worst_mb if not e.on_device else e.host_peak_mb) <= a.host_mb
    if e.on_device and a.device_free_mb is not None:
        if e.device_peak_mb > a.device_free_mb:
            problems.append(
                f"the estimated peak on {a.device_name} is {_fmt(e.device_peak_mb)} ({e.parts('model')}), "
                f"but it has {_fmt(a.device_free_mb)} free (torch.cuda.mem_get_info)"
            )
        worst_fits = worst_fits and e.device_peak_mb + e.peak_worst_mb - e.peak_mb <= a.device_free_mb
    disk_free = None
    if checkpoint_path is not None and cfg.train.checkpoint_every > 0:
        where, free = _free_disk(Path(checkpoint_path).parent)
        disk_free = _mb(free)
        if disk_free < e.checkpoint_mb:
            problems.append(
                f"one resumable checkpoint ({e.parameters:,} parameters + AdamW state = "
                f"{_fmt(e.checkpoint_mb)}) does not fit the {_fmt(disk_free)} free on the disk of "
                f"train.checkpoint_dir ({where}); point train.checkpoint_dir at a disk with room, or set "
                f"train.checkpoint_every=0 (no resuming)"
            )
    result = MemoryCheck(e, a, tuple(problems), worst_fits, disk_free)
    if problems and cfg.train.memory_check:
        memory = [p for p in problems if not p.startswith("one resumable checkpoint")]
        advice = f"; {_what_to_change(e)}" if memory else "; or set train.memory_check=false to run anyway"
        raise ResourceError(
            f"this config cannot train here: {'; and '.join(problems)}{advice} "
            f"(estimate: {e.flows:,} flows x {e.steps_expected} steps at "
            f"{e.bytes_per_flow_step:,.0f} bytes a flow step; nothing was built)"
        )
    return result
