"""Trainer benchmark: what the training loop costs around the model, measured in this one run.
The last stdout line is one JSON object; progress lines go to stderr.

- telemetry_overhead (goal <= 1.03): wall time of a `default`-preset run with full gradient
  health and MLflow logging as the train stage does it (tracking.MetricBuffer inside
  tracking.mlflow_run, on a temporary SQLite store, a row every train.log_every = 5 steps, the
  final flush included) over the same run with tracking off. Runs of both arms alternate (ABBA
  order) on the same synthetic data, so they see the same machine noise; the ratio is of the
  median run times. telemetry_overhead_step_ms is the same from the rows' perf/step_ms, which
  leaves out the time between windows.
  gradient_health_overhead (context, no goal): the trainer with tracking off over a bare loop of
  the same model, data and optimizer (forward, backward, clip_grad_norm_, AdamW, LR schedule).
- host_syncs_per_step (goal <= 1): host reads (Tensor.item / tolist / cpu / numpy / nonzero /
  __bool__ / __float__ / __int__, torch.nonzero) made from pipeline/ code outside the model, per
  optimizer step of a `smoke` run (log_every 2, and log_every 5 as a second figure).
  model_syncs_per_step: the same made from pipeline/model/ (the flow loop's one read per flow
  step). Reads inside torch itself are listed for context but not counted (see HostReads).
- step_time_drift (goal <= 1.05): median step time of steps 400-500 over steps 20-120 of a
  500-step `smoke` run on synthetic data (one intra-op thread, a fresh process; the median of
  three such runs).
- rss_growth_mb_per_1k_steps (goal < 5): least-squares slope of mem/rss_mb against step over the
  same runs' rows after step 100 (their median). rss_growth_mb_per_1k_steps_leak: the same with
  fault=leak (every step's autograd graph kept alive) over 250 steps, which must be large: it
  proves the slope can see a leak.

No GPU needed (train.device=cpu). A missed goal is reported in goals_met, not as an exit status
(the machine is shared and noisy); an error exits non-zero.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from bench.model import DIM, timed
from pipeline.core.config import load_config
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.core.paths import REPO_ROOT
from pipeline.train.loop import lr_lambda, train_model

GOALS = {"telemetry_overhead": 1.03, "host_syncs_per_step": 1.0, "step_time_drift": 1.05,
         "rss_growth_mb_per_1k_steps": 5.0}
PIPELINE_DIR = Path(os.path.realpath(REPO_ROOT / "pipeline"))
MODEL_DIR = PIPELINE_DIR / "model"
TORCH_DIR = Path(os.path.realpath(os.path.dirname(torch.__file__)))
BASE = ["train.device=cpu", "train.checkpoint_every=0"]


def say(msg: str) -> None:
    print(f"[bench.trainer] {msg}", file=sys.stderr, flush=True)


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 384-d task in place of the embed stage: y = x @ W, rows scaled to unit norm
    (the teacher's embeddings are normalised too)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    y = x @ (rng.normal(size=(DIM, DIM)) / np.sqrt(DIM))
    return x, (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)


def config(preset: str, steps: int, *overrides: str):
    """`preset` for at least `steps` optimizer steps on synthetic data: returns (cfg, rows).
    An epoch is at most 250 steps (8000 rows of batch 32, 12 MB per array); longer runs take
    more epochs over the same rows, rounded up to whole epochs."""
    epochs = -(-steps // 250)
    cfg = load_config([f"preset={preset}", *BASE, f"train.epochs={epochs}", *overrides])
    return cfg, -(-steps // epochs) * cfg.train.batch_size


# ---------------------------------------------------------------------------- host reads
_TENSOR_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__")


class HostReads:
    """Counts, while active, the calls that read a tensor's value back to the host, by who made
    them (the caller's file, from sys._getframe):

    - loop: pipeline/ outside pipeline/model/ (training loop, step_health, faults, telemetry,
      loader). These are the syncs the trainer rations: the design allows one per step.
    - model: pipeline/model/ (the flow loop reads how many flows are still alive, once per flow
      step; that is the model's cost, measured by bench.model, not the loop's).
    - torch: torch's own code. On this CPU run these are AdamW's `_get_value(step)` (`.item()` on
      each parameter's step counter): with capturable=False that counter is a CPU tensor on CUDA
      too, so reading it never waits for the GPU. Not ours, not counted in the per-step figures.
    - other: anything else (this benchmark, MLflow, numpy); ignored.

    Only the wrapped entry points are seen: a read torch makes on our behalf in C++ (e.g. a
    boolean mask index) is not. The patches are undone on exit, whatever happens inside."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()  # kind -> calls
        self.sites: collections.Counter = collections.Counter()  # "kind file:line function op" -> calls
        self._kinds: dict[str, tuple[str, str]] = {}  # co_filename -> (kind, short name)
        self._saved: dict[str, object] = {}

    def _classify(self, filename: str) -> tuple[str, str]:
        hit = self._kinds.get(filename)
        if hit is None:
            path = Path(os.path.realpath(os.path.abspath(filename)))
            if path.is_relative_to(MODEL_DIR):
                hit = ("model", str(path.relative_to(PIPELINE_DIR.parent)))
            elif path.is_relative_to(PIPELINE_DIR):
                hit = ("loop", str(path.relative_to(PIPELINE_DIR.parent)))
            elif path.is_relative_to(TORCH_DIR):
                hit = ("torch", "torch/" + str(path.relative_to(TORCH_DIR)))
            else:
                hit = ("other", filename)
            self._kinds[filename] = hit
        return hit

    def _wrap(self, op: str, fn: Callable) -> Callable:
        def counted(*args, **kwargs):
            frame = sys._getframe(1)
            kind, name = self._classify(frame.f_code.co_filename)
            self.counts[kind] += 1
            if kind != "other":
                self.sites[f"{kind} {name}:{frame.f_lineno} {frame.f_code.co_name} {op}"] += 1
            return fn(*args, **kwargs)
        return counted

    def __enter__(self) -> "HostReads":
        for op in _TENSOR_READS:
            # None of these is defined on torch.Tensor itself (they come from torch._C.TensorBase),
            # so undoing a patch is a delattr; keep whatever is there in case a version adds one.
            self._saved[op] = torch.Tensor.__dict__.get(op)
            setattr(torch.Tensor, op, self._wrap(op, getattr(torch.Tensor, op)))
        self._saved["torch.nonzero"] = torch.nonzero
        torch.nonzero = self._wrap("torch.nonzero", torch.nonzero)
        return self

    def __exit__(self, *exc) -> None:
        torch.nonzero = self._saved.pop("torch.nonzero")
        for op in _TENSOR_READS:
            saved = self._saved.pop(op)
            if saved is None:
                delattr(torch.Tensor, op)
            else:
                setattr(torch.Tensor, op, saved)


def host_syncs(steps: int = 40, log_every: Optional[int] = None) -> dict:
    """Host reads per optimizer step of a `smoke` run (its log_every is 2 unless given), counted
    over the whole train_model call: building the trainer and summarising included."""
    cfg, n = config("smoke", steps, *([f"train.log_every={log_every}"] if log_every else []))
    x, y = synthetic(n)
    with HostReads() as reads:
        res = train_model(cfg, x, y, progress=False)
    done = res.summary["train/steps"]
    # The flow loop reads once per flow step; rows hold steps_used per step, averaged over the window.
    prev, flow_loops = 0, 0.0
    for r in res.rows:
        flow_loops += r["flow/steps_used"] * (r["step"] - prev) * cfg.train.grad_accum
        prev = r["step"]
    return {"host_syncs_per_step": reads.counts["loop"] / done, "model_syncs_per_step": reads.counts["model"] / done,
            "torch_internal_reads_per_step": reads.counts["torch"] / done, "steps": done,
            "log_every": cfg.train.log_every, "flow_loop_iterations_per_step": flow_loops / done,
            "sites": dict(reads.sites)}


# ---------------------------------------------------------------------------- telemetry overhead
@contextlib.contextmanager
def temporary_store() -> Iterator[str]:
    """MLFLOW_TRACKING_URI pointed at a fresh SQLite file for the duration (tracking_uri() reads
    the variable on every call), so the benchmark never writes to the project's mlflow.db."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "GIT_OPTIONAL_LOCKS")}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        # mlflow_run tags the run with `git status`: without optional locks it leaves .git alone.
        os.environ["GIT_OPTIONAL_LOCKS"] = "0"
        try:
            yield os.environ["MLFLOW_TRACKING_URI"]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def trainer_run(cfg, x, y, tracked: bool, name: str) -> tuple[list[dict], float]:
    """One run; returns its rows and its wall time in seconds. The tracked arm logs exactly as the
    train stage does (tracking.MetricBuffer inside tracking.mlflow_run), and its time includes the
    buffer's final flush: every row reaches the store inside the timed span."""
    from pipeline.tracking import store as tracking

    if not tracked:
        t0 = time.perf_counter()
        res = train_model(cfg, x, y, progress=False)
        return res.rows, time.perf_counter() - t0
    with tracking.mlflow_run(name, cfg.run.preset, experiment="bench-trainer") as run:
        t0 = time.perf_counter()
        with tracking.MetricBuffer(run.info.run_id) as to_mlflow:
            res = train_model(cfg, x, y, on_log=to_mlflow, progress=False)
        return res.rows, time.perf_counter() - t0


def bare_windows(cfg, x, y, windows: int) -> list[float]:
    """ms/step of a loop with no health, telemetry or skip logic, in windows of log_every steps
    (timed() adds one untimed step before each window)."""
    t = cfg.train
    torch.manual_seed(cfg.run.seed)
    model = EnergyFlowModel.from_config(cfg.model, DIM)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, windows * (t.log_every + 1)))
    loader = BatchLoader(x, y, t.batch_size, shuffle=True, seed=cfg.run.seed, drop_last=True)

    def forever():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader.batches()
            epoch += 1

    batches = forever()

    def step():
        xb, yb = next(batches)
        energy_flow_loss(model(xb).pred, yb, t.cosine_weight).backward()
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return [1000 * timed(step, t.log_every) for _ in range(windows)]


def telemetry_overhead(pairs: int = 6, steps: int = 100, bare: bool = True,
                       log_every: Optional[int] = None) -> dict:
    """Tracked over untracked wall time of whole runs (default preset, ~58 ms steps on 2 cores).

    Why whole runs: the logging's cost is partly outside perf/step_ms (the on_log call and the
    final flush happen between windows) and partly inside it (a writer competing for the two
    cores). Sent row by row, a 34-metric row costs MLflow's SQLite store ~7-9 ms of CPU and the
    overhead was 4.8 %; tracking.MetricBuffer sends ~10 s of rows per log_batch."""
    cfg, n = config("default", steps, *([f"train.log_every={log_every}"] if log_every else []))
    x, y = synthetic(n)
    seconds: dict[str, list[float]] = {"tracked": [], "untracked": []}
    step_ms: dict[str, list[float]] = {"tracked": [], "untracked": []}
    flow_steps: list[list[float]] = []
    bare_ms: list[float] = []
    pair_ratios: list[float] = []
    load_before = os.getloadavg()[0]
    with temporary_store():
        # Untimed warm-up of both arms: torch's allocator and thread pool, MLflow's import and the
        # store's schema migration all start here, not in a timed run.
        wcfg, wn = config("default", 10)
        for tracked in (True, False):
            trainer_run(wcfg, *synthetic(wn), tracked, "warm-up")
        for i in range(pairs):
            # ABBA: a load that rises or falls steadily over the benchmark hits both arms alike.
            order = (True, False) if i % 2 == 0 else (False, True)
            pair = {}
            for tracked in order:
                rows, wall = trainer_run(cfg, x, y, tracked, f"overhead-{i}")
                arm = "tracked" if tracked else "untracked"
                seconds[arm].append(wall)
                step_ms[arm] += [r["perf/step_ms"] for r in rows[2:]]
                flow_steps.append([r["flow/flow_steps"] for r in rows])
                pair[tracked] = wall
            pair_ratios.append(pair[True] / pair[False])
            if bare:
                bare_ms += bare_windows(cfg, x, y, steps // (cfg.train.log_every + 1))[2:]
            say(f"overhead pair {i + 1}/{pairs}: tracked/untracked {pair_ratios[-1]:.3f}")
    med = {a: float(np.median(v)) for a, v in seconds.items()}
    med_step = {a: float(np.median(v)) for a, v in step_ms.items()}
    out = {"telemetry_overhead": med["tracked"] / med["untracked"],
           "telemetry_overhead_step_ms": med_step["tracked"] / med_step["untracked"],
           "tracked_run_s": med["tracked"], "untracked_run_s": med["untracked"],
           "tracked_step_ms": med_step["tracked"], "untracked_step_ms": med_step["untracked"],
           "telemetry_overhead_pair_ratios": pair_ratios, "overhead_pairs": pairs,
           "overhead_steps_per_run": steps, "overhead_log_every": cfg.train.log_every,
           # Same seed, same data: both arms must have run the same flows, step for step.
           "overhead_arms_same_work": all(f == flow_steps[0] for f in flow_steps),
           "overhead_threads": torch.get_num_threads(),
           # The 1-minute load average: above the core count, other processes shared the run.
           "load_avg_before_after": [load_before, os.getloadavg()[0]]}
    if bare:
        out.update({"bare_loop_step_ms": float(np.median(bare_ms)),
                    "gradient_health_overhead": med_step["untracked"] / float(np.median(bare_ms))})
    return out


# ---------------------------------------------------------------------------- drift and memory
def rss_slope_per_1k(rows: list[dict], after: int) -> float:
    """Least-squares slope of mem/rss_mb against step over rows after step `after`, in MB per
    1000 steps."""
    pts = [(r["step"], r["mem/rss_mb"]) for r in rows if r["step"] > after]
    if len(pts) < 3:
        raise ValueError(f"{len(pts)} rows after step {after}: expected at least 3 to fit a slope")
    s, m = np.array(pts, dtype=np.float64).T
    return 1000 * float(np.polyfit(s, m, 1)[0])


def median_between(rows: list[dict], key: str, lo: int, hi: int) -> float:
    vals = [r[key] for r in rows if lo <= r["step"] <= hi]
    if not vals:
        raise ValueError(f"no rows between steps {lo} and {hi}")
    return float(np.median(vals))


def smoke_run(steps: int, *overrides: str) -> list[dict]:
    cfg, n = config("smoke", steps, *overrides)
    return train_model(cfg, *synthetic(n), progress=False).rows


ROWS_SCRIPT = ("import json, sys; from bench.trainer import smoke_run; "
               "print(json.dumps(smoke_run(int(sys.argv[1]), *sys.argv[2:])))")


def fresh_rows(steps: int, *overrides: str) -> list[dict]:
    """smoke_run in a new process. In this one, memory freed by earlier runs stays in the
    allocator's free lists: a leak first refills them and the RSS slope misses it (a 100-step
    fault=leak run right after a 250-step one fitted 0.3 MB per 1k steps; fresh, ~200)."""
    proc = subprocess.run([sys.executable, "-c", ROWS_SCRIPT, str(steps), *overrides], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"smoke run {overrides} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# One intra-op thread for the smoke runs. The smoke model's ops are too small to split: on this
# 2-core machine it stepped in 5.7 ms on one thread, 14.6 ms on torch's default two; and with one
# other busy process on the machine, two threads took 56 ms (one waits at every parallel region
# for the other, descheduled) while one thread still took 5.8. Drift and memory growth are about
# the loop over time, not the thread count; one thread keeps other sessions' load out of them.
# (Those runs have processes of their own, so the setting never reaches the overhead runs.)
SMOKE_THREADS = "train.threads=1"


def drift_and_rss(steps: int = 500, repeats: int = 3, rss_after: int = 100) -> dict:
    """Step-time drift and RSS slope of clean `smoke` runs (log_every 2: a row per 2 steps), each
    in a fresh process. One run's ratio is at the mercy of whatever else the shared machine did
    during its two 100-step windows (with two threads, runs here read 0.19, 63 and 0.016 while
    other sessions ran tests), so the figure is the median over `repeats` runs, each listed."""
    if steps < 500:
        raise ValueError(f"steps={steps}: the drift compares steps 400-500, so expected >= 500")
    runs = []
    for i in range(repeats):
        rows = fresh_rows(steps, SMOKE_THREADS)
        early = median_between(rows, "perf/step_ms", 20, 120)
        late = median_between(rows, "perf/step_ms", 400, 500)
        runs.append({"ratio": late / early, "early_ms": early, "late_ms": late,
                     # The flow loop stops when flows arrive: if training changed how many flow steps
                     # a batch takes, the step time would move for a reason that is not drift.
                     "flow_steps": (median_between(rows, "flow/flow_steps", 20, 120),
                                    median_between(rows, "flow/flow_steps", 400, 500)),
                     "rss": rss_slope_per_1k(rows, rss_after), "rss_end": rows[-1]["mem/rss_mb"],
                     "steps": rows[-1]["step"]})
        say(f"drift run {i + 1}/{repeats}: {early:.2f} -> {late:.2f} ms/step, RSS {runs[-1]['rss']:.2f} MB/1k steps")
    mid = lambda k: float(np.median([r[k] for r in runs]))  # noqa: E731
    return {"step_time_drift": mid("ratio"), "step_time_drift_runs": [r["ratio"] for r in runs],
            "drift_early_step_ms": mid("early_ms"), "drift_late_step_ms": mid("late_ms"),
            "drift_flow_steps_early_late": runs[0]["flow_steps"], "drift_steps": runs[0]["steps"],
            "rss_growth_mb_per_1k_steps": mid("rss"), "rss_growth_runs": [r["rss"] for r in runs],
            "rss_fit_after_step": rss_after, "rss_mb_end": runs[0]["rss_end"]}


def leak_rss(steps: int = 250, after: int = 100) -> dict:
    """The same slope with fault=leak from step 1: each step's loss, with its graph, is kept
    (fault.leak_mb=0: the graph alone, the subtle leak; the fault preset adds 8 MB a step)."""
    rows = fresh_rows(steps, SMOKE_THREADS, "fault=leak", "fault.step=1", "fault.leak_mb=0")
    return {"rss_growth_mb_per_1k_steps_leak": rss_slope_per_1k(rows, after), "leak_steps": rows[-1]["step"],
            "leak_fit_after_step": after, "leak_rss_mb_end": rows[-1]["mem/rss_mb"]}


# ---------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6,
                    help="tracked/untracked run pairs for telemetry_overhead (default 6; ~16 s a pair on 2 cores, "
                         "with the bare-loop arm)")
    ap.add_argument("--steps", type=int, default=100,
                    help="optimizer steps per overhead run, default-preset model (default 100 = 20 rows)")
    ap.add_argument("--log-every", type=int, default=None,
                    help="train.log_every of the overhead runs (default: the preset's, 5)")
    ap.add_argument("--sync-steps", type=int, default=40, help="smoke steps the host reads are counted over")
    ap.add_argument("--drift-steps", type=int, default=500, help="steps of the clean smoke run (>= 500)")
    ap.add_argument("--drift-repeats", type=int, default=3, help="clean smoke runs; the drift is their median")
    ap.add_argument("--leak-steps", type=int, default=250, help="steps of the fault=leak smoke run")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-loop arm (gradient_health_overhead)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res: dict = {"device": f"cpu ({torch.get_num_threads()} threads)", "threads": torch.get_num_threads(),
                 "torch": torch.__version__, "goals": GOALS}
    syncs: dict = {}

    def host_reads() -> dict:
        for le in (None, 5):
            syncs[le] = host_syncs(args.sync_steps, le)
        a, b = syncs[None], syncs[5]
        return {"host_syncs_per_step": a["host_syncs_per_step"], "model_syncs_per_step": a["model_syncs_per_step"],
                "torch_internal_reads_per_step": a["torch_internal_reads_per_step"],
                "flow_loop_iterations_per_step": a["flow_loop_iterations_per_step"],
                "sync_steps": a["steps"], "sync_log_every": a["log_every"],
                "host_syncs_per_step_log_every_5": b["host_syncs_per_step"],
                "host_sync_sites": {k: v for k, v in a["sites"].items() if not k.startswith("torch ")},
                "torch_internal_read_sites": {k: v for k, v in a["sites"].items() if k.startswith("torch ")}}

    parts = [("host reads", host_reads),
             ("drift and rss", lambda: drift_and_rss(args.drift_steps, args.drift_repeats)),
             ("leak rss", lambda: leak_rss(args.leak_steps)),
             ("telemetry overhead", lambda: telemetry_overhead(args.pairs, args.steps, bare=not args.no_bare,
                                                               log_every=args.log_every))]
    for name, fn in parts:
        t = time.perf_counter()
        res.update(fn())
        say(f"{name}: {time.perf_counter() - t:.1f} s")
    res["goals_met"] = {
        "telemetry_overhead": res["telemetry_overhead"] <= GOALS["telemetry_overhead"],
        "host_syncs_per_step": res["host_syncs_per_step"] <= GOALS["host_syncs_per_step"],
        "step_time_drift": res["step_time_drift"] <= GOALS["step_time_drift"],
        "rss_growth_mb_per_1k_steps": res["rss_growth_mb_per_1k_steps"] < GOALS["rss_growth_mb_per_1k_steps"],
        # Not a speed goal: the slope must see a real leak, or a small clean slope proves nothing.
        "leak_detected": res["rss_growth_mb_per_1k_steps_leak"] > 10 * max(res["rss_growth_mb_per_1k_steps"], 5.0),
    }
    res["bench_seconds"] = time.perf_counter() - t0
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
