"""Device benchmark: what one training step costs on this device, preset by preset and precision
by precision, measured in this one run. The last stdout line is one JSON object; progress lines
go to stderr.

Each run is the real Trainer (pipeline/train/loop.py: the health read-out, telemetry rows every
train.log_every steps and its own sampled steps included; no MLflow, tracking off) on synthetic
data (bench.trainer.synthetic) with train.device=<device>, train.checkpoint_every=0 and one
epoch just long enough for these phases, in order:

- warm-up (--warmup, at least the masked loop's FLOW_STEPS_OBSERVED + 2: it runs at its cap
  until then, fits its length and captures its graphs anew);
- timed (--steps): step_ms, the median step time, and step_ms_mean (log steps' telemetry
  included). On CUDA from CUDA events recorded around each step (the device's timeline, the
  host's share included where the GPU waited for it), synchronised before the first and after
  the last; elsewhere from the host clock (a step ends with its host read, so it has finished);
- counted (the preset's log_every steps, one log step among them): host_syncs_per_step (every
  host read, from every source, by pipeline/train/step_counters.count_host; only the optimizer's
  host-resident step counters left out) and ops_per_step (aten ops dispatched), with the reads'
  sites (host_sync_sites);
- profiled (CUDA: one step under step_counters.profile_device): kernels_per_step,
  kernel_us_mean, gpu_busy (the share of the step's wall time the GPU ran kernels: a lower bound,
  the profiler slows launches) and cuda_syncs_per_step (the CUDA runtime's synchronize calls);
- FLOP-counted (the last step, a log step, so always eager even with CUDA graphs):
  gflop_per_step from torch.utils.flop_counter.FlopCounterMode (the matmuls forward and
  backward; the masked loop's work on finished flows included: the FLOPs executed), and
  achieved_gflops = that over step_ms, against matmul_peak_gflops, a square matmul (4096 on
  CUDA, 1024 on a CPU) in the same dtype on the same device and thread count, timed in the same
  run (the best of a few): fraction_of_matmul_peak.

Steps the trainer samples itself (pipeline/train/telemetry.sample_due: counted or profiled) are
run but never timed, counted or profiled here. flow_steps_per_batch is the trainer's
flow/steps_used over the run; ms_per_flow_step = step_ms / (flow_steps_per_batch x grad_accum).

Presets: default, seed and bench (--presets; --quick: smoke). Precisions: fp32 (TF32 off),
tf32 (train.precision=tf32: fp32 with TF32 matmuls; the matmul peak is timed with TF32 on, and
the process's settings are restored after each run) and bf16 (autocast): TF32 and bf16 on CUDA
only; on a CPU fp32 alone runs and the others are listed with null figures and a `why`. Each
preset and precision runs the compacting loop and the masked loop, and on CUDA the masked loop
with CUDA graphs too (train.cuda_graph always / never), and `ratios` sets them side by side,
measured in the same run: masked_over_compact_step_ms, graph_on_over_off_step_ms,
masked_graph_over_compact_step_ms, and per loop tf32_over_fp32_step_ms and bf16_over_fp32_step_ms
(below 1: faster).

`figures` (--save also writes bench/results/gpu.json, with the GPU's name as gpu_model): on CUDA,
every ratio and each run's step_ms, as "<preset>/<precision>/<label>/<key>" (the GPU is the
run's alone: wall time is its time). On a CPU they are null: its wall-clock step times move with
the machine's other load (bench.model and bench.train_step give the CPU's figures).

Every figure that could not be measured on this device is null with a `<figure>_why` beside it
(or one `why` for a run that did not happen). The JSON names the device (its CUDA name, or the
CPU model) and torch's version. A run that fails is reported with its error and the benchmark
exits 1 after printing the JSON.

Time: a whole default run on CUDA is 27 trainer runs of about 30 steps, meant to take a couple
of minutes on a data-centre GPU (each run's `seconds` and bench_seconds say; --steps and --presets
trim it). On a CPU the seed and bench presets take seconds a step, so a CPU run of all three
takes the better part of an hour: use --presets default there, or --quick.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import sys
import time
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench import results
from bench.clock import stage_threads, sync
from bench.probe import machine
from bench.workloads import synthetic
from pipeline.core.config import CONF_DIR, load_config
from pipeline.train.loop import FLOW_STEPS_OBSERVED, Trainer
from pipeline.train.step_counters import count_host, optimizer_host_tensors, profile_device
from pipeline.train.telemetry import sample_due

PRESETS = ("default", "seed", "bench")
QUICK_PRESETS = ("smoke",)
PRECISIONS = ("fp32", "tf32", "bf16")
PEAK_N = {"cuda": 4096, "cpu": 1024}
NEEDS_CUDA = "needs CUDA"
WHY_PRECISION = {
    "tf32": f"{NEEDS_CUDA}: TF32 is a mode of NVIDIA tensor cores (Ampere and later)",
    "bf16": f"{NEEDS_CUDA}: the trainer trains in bf16 on a GPU; a CPU's bf16 speed depends on its "
    "instructions (AMX or not)",
}
WHY_PROFILE = (
    f"{NEEDS_CUDA}: kernels, their duration, the GPU's busy share and the runtime's syncs come from "
    "torch.profiler's CUDA activity (step_counters.profile_device)"
)
WHY_GRAPH = f"{NEEDS_CUDA}: a CUDA graph captures GPU kernels"
GPU_FIGURES = ("kernels_per_step", "kernel_us_mean", "gpu_busy", "cuda_syncs_per_step")
FIGURES = (
    "step_ms",
    "step_ms_mean",
    "flow_steps_per_batch",
    "ms_per_flow_step",
    "host_syncs_per_step",
    "ops_per_step",
    *GPU_FIGURES,
    "gflop_per_step",
    "achieved_gflops",
    "matmul_peak_gflops",
    "fraction_of_matmul_peak",
)


say = functools.partial(results.say, "gpu")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu: --device cuda, but CUDA is not available here (use --device cpu or auto)")
    return torch.device(name)


@contextlib.contextmanager
def matmul_mode(precision: str, device: torch.device) -> Iterator[None]:
    """On CUDA, TF32 on for `tf32` and off otherwise (matmuls and cuDNN; float32 matmul precision
    "high" / "highest"); the process's settings as found afterwards. Elsewhere nothing changes."""
    if device.type != "cuda":
        yield
        return
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    on = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def matmul_peak(device: torch.device, precision: str, n: int, threads: int, rounds: int = 5) -> dict:
    """GFLOP/s of an n x n @ n x n matmul in the precision's dtype on this device and thread
    count: the best of `rounds` timings (10 matmuls each on CUDA, one on a CPU)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    inner = 10 if device.type == "cuda" else 1
    saved = torch.get_num_threads()
    if device.type == "cpu" and threads and threads != saved:
        torch.set_num_threads(threads)
    try:
        with matmul_mode(precision, device):
            gen = torch.Generator().manual_seed(0)
            a = torch.randn(n, n, generator=gen).to(device, dtype)
            b = torch.randn(n, n, generator=gen).to(device, dtype)
            torch.mm(a, b)  # warm-up: the BLAS's threads and buffers, cuBLAS's handle
            best = math.inf
            for _ in range(rounds):
                sync(device)
                t0 = time.perf_counter()
                for _ in range(inner):
                    torch.mm(a, b)
                sync(device)
                best = min(best, (time.perf_counter() - t0) / inner)
    finally:
        if torch.get_num_threads() != saved:
            torch.set_num_threads(saved)
    return {
        "gflops": 2 * n**3 / best / 1e9,
        "matmul": f"{n}x{n} @ {n}x{n} {str(dtype).removeprefix('torch.')}" + (" (TF32)" if precision == "tf32" else ""),
        "threads": torch.get_num_threads() if device.type == "cuda" else (threads or saved),
        "best_of": rounds,
    }


# ---------------------------------------------------------------------------- one run
def _sampled_by_trainer(step: int, device: torch.device) -> bool:
    return sample_due(step, device.type) is not None


def plan_steps(warmup: int, timed: int, counted: int, profiled: int, device: torch.device) -> list[str]:
    """What each optimizer step of the run is for: warmup, timed, count, profile, and the last,
    flops. Steps the trainer samples itself are `trainer` (run untouched, used for nothing)."""
    wanted = ["warmup"] * warmup + ["timed"] * timed + ["count"] * counted + ["profile"] * profiled
    kinds: list[str] = []
    while wanted:
        kinds.append("trainer" if _sampled_by_trainer(len(kinds) + 1, device) else wanted.pop(0))
    return kinds + ["flops"]


class StepPlan:
    """Takes the place of a Trainer's _train_step and runs each step for its part of the plan."""

    def __init__(self, trainer: Trainer, kinds: list[str]):
        self.trainer, self.kinds = trainer, kinds
        self.device = trainer.device
        self.cuda = self.device.type == "cuda"
        self._step = trainer._train_step  # the bound method; the instance attribute below shadows it
        trainer._train_step = self
        self.i = 0
        self.step_s: list[float] = []
        self._events: list[tuple] = []
        self.host_syncs = self.ops = 0.0
        self.counted = 0
        self.sites: collections.Counter = collections.Counter()
        self.profile = None
        self.flops: Optional[int] = None
        self.threads = torch.get_num_threads()

    def __call__(self, batches) -> None:
        kind = self.kinds[self.i] if self.i < len(self.kinds) else "extra"
        self.i += 1
        self.threads = torch.get_num_threads()  # as Trainer.run set it
        if kind == "timed":
            if not self.step_s and not self._events:
                sync(self.device)
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self._step(batches)
                end.record()
                self._events.append((start, end))
            else:
                t0 = time.perf_counter()
                self._step(batches)
                self.step_s.append(time.perf_counter() - t0)
            if self.kinds[self.i :].count("timed") == 0:
                sync(self.device)
        elif kind == "count":
            with count_host(optimizer_host_tensors(self.trainer.opt)) as sample:
                self._step(batches)
            self.host_syncs += sample.host_syncs
            self.ops += sample.ops
            self.sites.update(sample.read_sites)
            self.counted += 1
        elif kind == "profile":
            with profile_device(self.device) as sample:
                self._step(batches)
            self.profile = sample
        elif kind == "flops":
            counter = FlopCounterMode(display=False)
            with counter:
                self._step(batches)
            self.flops = counter.get_total_flops()
        else:
            self._step(batches)

    def times_ms(self) -> list[float]:
        if self.cuda:
            sync(self.device)
            return [start.elapsed_time(end) for start, end in self._events]
        return [1000 * s for s in self.step_s]


def flow_steps_per_batch(rows: list[dict]) -> float:
    """The trainer's flow/steps_used (flow steps per batch, averaged over each row's window) over
    the whole run."""
    prev, total = 0, 0.0
    for r in rows:
        total += r["flow/steps_used"] * (r["step"] - prev)
        prev = r["step"]
    return total / prev if prev else math.nan


def overrides_for(preset: str, precision: str, device: torch.device, variant: dict) -> list[str]:
    out = [
        f"preset={preset}",
        f"train.device={device.type}",
        "train.checkpoint_every=0",
        "train.epochs=1",
        f"train.precision={precision}",
    ]
    return out + [f"train.{k}={v}" for k, v in variant.items() if v is not None]


def run_case(preset: str, precision: str, device: torch.device, variant: dict, *, warmup: int, steps: int) -> dict:
    """One Trainer run planned by plan_steps; its figures (peak and FLOP/s filled in by the caller)."""
    overrides = overrides_for(preset, precision, device, variant)
    cfg = load_config(overrides)
    if device.type == "cpu" and not cfg.train.threads:
        cfg = load_config([*overrides, f"train.threads={stage_threads()}"])  # as the stage trains
    t = cfg.train
    counted = int(t.log_every)
    kinds = plan_steps(warmup, steps, counted, 1 if device.type == "cuda" else 0, device)
    x, y = synthetic(len(kinds) * t.batch_size * t.grad_accum)
    t0 = time.perf_counter()
    with matmul_mode(precision, device):
        trainer = Trainer(cfg, x, y, progress=False)
        plan = StepPlan(trainer, kinds)
        res = trainer.run()
        ms = plan.times_ms()
    seconds = time.perf_counter() - t0
    if res.summary["train/steps"] != len(kinds) or plan.i != len(kinds):
        raise RuntimeError(f"planned {len(kinds)} steps, the trainer ran {res.summary['train/steps']}")
    used = flow_steps_per_batch(res.rows)
    step_ms = float(np.median(ms))
    out = {
        "step_ms": step_ms,
        "step_ms_mean": float(np.mean(ms)),
        "step_ms_min": float(np.min(ms)),
        "timed_steps": len(ms),
        "flow_steps_per_batch": used,
        "ms_per_flow_step": step_ms / (used * t.grad_accum) if used > 0 else None,
        "host_syncs_per_step": plan.host_syncs / plan.counted,
        "ops_per_step": plan.ops / plan.counted,
        "counted_steps": plan.counted,
        "host_sync_sites": dict(plan.sites.most_common()),
        "flops_per_step": plan.flops,
        "threads": plan.threads,
        **{k: int(t[k]) for k in ("batch_size", "grad_accum", "log_every")},
        "warmup_steps": kinds.count("warmup"),
        "steps_sampled_by_trainer": kinds.count("trainer"),
        "run_steps": len(kinds),
        "seconds": seconds,
    }
    # What ran, as the trainer reports it (flow/loop: 1 masked, 0 compacting; perf/cuda_graph).
    s = res.summary
    out["flow_loop_ran"] = "masked" if s.get("flow/loop") else "compact"
    out["cuda_graph_ran"] = bool(s.get("perf/cuda_graph", False))
    out["flow_overruns"] = s.get("flow/overruns", 0)
    if device.type == "cuda":
        p = plan.profile
        out.update(
            {
                "kernels_per_step": p.kernels,
                "kernel_us_mean": p.kernel_us,
                "gpu_busy": p.gpu_busy,
                "cuda_syncs_per_step": p.cuda_syncs,
                "device_peak_mb": max((r["mem/device_peak_mb"] for r in res.rows), default=None),
            }
        )
    else:
        out.update({k: None for k in GPU_FIGURES})
        out.update({f"{k}_why": WHY_PROFILE for k in GPU_FIGURES})
    del trainer, plan, res
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next run's model starts from the same free memory
    return out


# ---------------------------------------------------------------------------- the matrix
def variants(device: torch.device) -> tuple[list[dict], list[dict]]:
    """(to run, not runnable here with why) as {"label", "flow_loop", "cuda_graph"}."""
    run = [
        {"label": "compact", "flow_loop": "compact", "cuda_graph": "never"},
        {"label": "masked", "flow_loop": "masked", "cuda_graph": "never"},
    ]
    # always: a capture that fails is this run's error, not a quiet fall back to eager.
    graph = {"label": "masked+graph", "flow_loop": "masked", "cuda_graph": "always"}
    if device.type == "cuda":
        return run + [graph], []
    return run, [{**graph, "why": WHY_GRAPH}]


def stub(preset: str, precision: str, variant: dict, why: str) -> dict:
    return {
        "preset": preset,
        "precision": precision,
        **{k: variant[k] for k in ("label", "flow_loop", "cuda_graph")},
        **{k: None for k in FIGURES},
        "why": why,
    }


def ratio(runs: dict, a: tuple, b: tuple, key: str = "step_ms") -> tuple[Optional[float], Optional[str]]:
    """runs[a][key] / runs[b][key], or None and why."""
    ra, rb = runs.get(a), runs.get(b)
    for r, name in ((ra, a), (rb, b)):
        if r is None:
            return None, f"{'/'.join(name)} was not run"
        if r.get(key) is None:
            return None, f"{'/'.join(name)}: {r.get('why') or r.get(key + '_why') or 'not measured'}"
    return ra[key] / rb[key], None


def ratios(runs: dict, presets, precisions, labels) -> list[dict]:
    def put(entry: dict, name: str, a: tuple, b: tuple) -> None:
        entry[name], why = ratio(runs, a, b)
        if why:
            entry[f"{name}_why"] = why

    out = []
    pairs = {
        "masked_over_compact_step_ms": ("masked", "compact"),
        "graph_on_over_off_step_ms": ("masked+graph", "masked"),
        "masked_graph_over_compact_step_ms": ("masked+graph", "compact"),
    }
    for preset in presets:
        for precision in precisions:
            entry: dict = {"preset": preset, "precision": precision}
            for name, (a, b) in pairs.items():
                if a in labels and b in labels:
                    put(entry, name, (preset, precision, a), (preset, precision, b))
            if len(entry) > 2:
                out.append(entry)
        for label in labels:
            entry = {"preset": preset, "label": label}
            for precision in ("tf32", "bf16"):
                if precision in precisions and "fp32" in precisions:
                    put(entry, f"{precision}_over_fp32_step_ms", (preset, precision, label), (preset, "fp32", label))
            if len(entry) > 2:
                out.append(entry)
    return out


def headline(res: dict, cuda: bool) -> dict:
    """Every ratio and step time by "<preset>/<precision or label>/<key>"; null off CUDA."""
    values: dict = {}
    for r in res["ratios"]:
        where = f"{r['preset']}/{r.get('precision') or r.get('label')}"
        for k, v in r.items():
            if k not in ("preset", "precision", "label") and not k.endswith("_why"):
                values[f"{where}/{k}"] = v
    for r in res["runs"]:
        values[f"{r['preset']}/{r['precision']}/{r['label']}/step_ms"] = r.get("step_ms")
    why = None if cuda else "on a CPU, wall-clock step times move with the machine's other load"
    return results.figures(values, {k: why for k in values})


def finite(obj):
    """obj with every non-finite float (a NaN from a counter that measured nothing) made None, and a
    `<key>_why` beside it in a dict where none is there already: JSON has no NaN."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
                if not str(k).endswith("_why") and f"{k}_why" not in obj:
                    out[f"{k}_why"] = f"measured {v}: nothing to measure on this run"
            else:
                out[k] = finite(v)
        return out
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def main(argv=None) -> dict:
    ap = results.parser("gpu", __doc__)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default auto: CUDA if present")
    ap.add_argument(
        "--presets",
        help=f"comma-separated presets (default {','.join(PRESETS)}; with --quick {','.join(QUICK_PRESETS)})",
    )
    ap.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"comma-separated, of {','.join(PRECISIONS)} (default all; tf32 and bf16 run on CUDA only)",
    )
    ap.add_argument("--steps", type=int, help="timed steps per run (default 10 on CUDA, 5 on a CPU)")
    ap.add_argument(
        "--warmup",
        type=int,
        help="warm-up steps per run (default 3; raised to the masked loop's FLOW_STEPS_OBSERVED + 2 where it has one)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="a fast check of the benchmark itself: the smoke preset, 3 timed steps"
    )
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    presets = [p for p in (args.presets or ",".join(QUICK_PRESETS if args.quick else PRESETS)).split(",") if p]
    known = sorted(f.stem for f in (CONF_DIR / "preset").glob("*.yaml"))
    if set(presets) - set(known):
        ap.error(f"--presets: unknown {sorted(set(presets) - set(known))}; expected some of {','.join(known)}")
    asked = [p for p in args.precisions.split(",") if p]
    if set(asked) - set(PRECISIONS):
        ap.error(f"--precisions: unknown {sorted(set(asked) - set(PRECISIONS))}; expected some of {PRECISIONS}")
    steps = args.steps or (3 if args.quick else (10 if cuda else 5))
    warmup = max(args.warmup if args.warmup is not None else 3, FLOW_STEPS_OBSERVED + 2)
    to_run, not_here = variants(device)
    labels = [v["label"] for v in to_run + not_here]
    precisions = [p for p in asked if cuda or p == "fp32"]
    res: dict = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else machine()["cpu_model"],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "presets": presets,
        "precisions": asked,
        "variants": to_run + not_here,
        "warmup_steps": warmup,
        "timed_steps": steps,
    }
    peaks: dict = {}
    runs: dict = {}
    out_runs: list[dict] = []
    errors: list[str] = []
    n_peak = PEAK_N[device.type]

    def case(preset: str, precision: str, v: dict) -> dict:
        """One run of the matrix, or its stub with why where it cannot run here or failed."""
        if precision not in precisions or "why" in v:
            return stub(preset, precision, v, v.get("why") or WHY_PRECISION[precision])
        variant = {k: v[k] for k in ("flow_loop", "cuda_graph")}
        say(f"{preset} {precision} {v['label']} ...")
        try:
            r = run_case(preset, precision, device, variant, warmup=warmup, steps=steps)
        except Exception as e:  # noqa: BLE001 - one failed run is reported; the others still run
            errors.append(f"{preset}/{precision}/{v['label']}: {type(e).__name__}: {e}")
            say(f"  failed: {errors[-1]}")
            return stub(preset, precision, v, f"failed: {type(e).__name__}: {e}")
        pk = (precision, r["threads"])
        if pk not in peaks:
            peaks[pk] = matmul_peak(device, precision, n_peak, r["threads"], rounds=3 if args.quick else 5)
        peak = peaks[pk]["gflops"]
        achieved = r["flops_per_step"] / (r["step_ms"] / 1000) / 1e9 if r["flops_per_step"] else None
        r["gflop_per_step"] = r.pop("flops_per_step") / 1e9
        r["achieved_gflops"], r["matmul_peak_gflops"] = achieved, peak
        r["fraction_of_matmul_peak"] = achieved / peak if achieved else None
        if achieved is None:
            why = "FlopCounterMode saw no FLOPs in the step"
            r["achieved_gflops_why"] = r["fraction_of_matmul_peak_why"] = why
        say(
            f"  {r['step_ms']:.2f} ms/step ({r['flow_steps_per_batch']:.1f} flow steps), "
            f"{r['host_syncs_per_step']:.1f} host syncs, {r['ops_per_step']:.0f} ops, "
            f"{(achieved or 0):.1f} GFLOP/s of {peak:.1f} peak; {r['seconds']:.1f} s"
        )
        return {"preset": preset, "precision": precision, **v, **r}

    for preset in presets:
        for precision in asked:
            for v in to_run + not_here:
                runs[preset, precision, v["label"]] = entry = case(preset, precision, v)
                out_runs.append(entry)
    res["runs"] = out_runs
    res["ratios"] = ratios(runs, presets, asked, labels)
    res["matmul_peak"] = [{"precision": p, **v} for (p, _), v in peaks.items()]
    for p in asked:
        if p not in precisions:
            res[f"matmul_peak_{p}"] = None
            res[f"matmul_peak_{p}_why"] = WHY_PRECISION[p]
    res["errors"] = errors
    res.update(machine())
    res["bench_seconds"] = time.perf_counter() - t_start
    if cuda:
        res["gpu_model"] = res["device_name"]
    res.update(headline(res, cuda))
    res = finite(res)
    results.finish("gpu", res, args.save, argv)
    if errors:
        sys.exit(1)
    return res


if __name__ == "__main__":
    main()
