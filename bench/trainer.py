"""Trainer benchmark: what the training loop costs around the model, measured in this one run.
The last stdout line is one JSON object; progress lines go to stderr.

- The train stage's logging, split in two (bench.tracking's `stage` arm against `off`, on the
  `default` preset: tracking.mlflow_run, the config as params, the metric buffer with its
  system metrics, a row every train.log_every = 5 steps, the final wait for the store included;
  see bench.tracking for the method):
  telemetry_overhead_per_step (goal <= 1.03): wall time per step while rows are sent over the
  same while they are not, inside each tracked run (alternate 2 s segments: an A/B seconds apart,
  so other processes' load hits both sides). telemetry_overhead_per_step_across_runs: the same
  against the off runs, probe-normalised (context: it carries the load differences of runs
  tens of seconds apart). telemetry_overhead_per_step_cpu, the figure: the same in-run A/B in
  this process's CPU seconds per step (bench.tracking's overhead_per_step_cpu).
  telemetry_fixed_s: what a tracked run pays once (its whole span over the off run's of the same
  round, less what its sent rows cost step by step; the median over rounds, each in
  telemetry_fixed_s_rounds), and telemetry_fixed_fraction_of_default_run (goal <= 0.02):
  that over the default run's length, default_run_steps (metrics/train.json's
  train/planned_steps, the default preset on the shipped data) x off's steady step time.
  telemetry_overhead (context): a whole default run's overhead from the two, per step + fixed
  over the run's length. telemetry_cpu_s_per_run: the CPU seconds a tracked run adds (this
  process's, MLflow's threads included); null, with the reason in `unreliable`, when its
  rounds spread wider than two runs are held to (telemetry_cpu_s_per_run_rounds, _spread).
  Arms rotate within each round on the same data and seed; spans across runs are divided by the
  median of the reference probes (bench/probe.py) taken before and inside each run and
  multiplied by the median of all (the `*_raw` figures are without that).
  gradient_health_overhead (context, no goal): the trainer with tracking off over a bare loop of
  the same model, data and optimizer (forward, backward, clip_grad_norm_, AdamW, LR schedule),
  the third arm of the same rounds.
- host_syncs_per_step (goal <= 1): every host read (a call that needs a tensor's values on the
  host: .item(), .tolist(), bool(t), a boolean-mask index, nonzero, ...; on a GPU each one makes
  the host wait for the device), from every source (the model's flow loop, the training loop,
  the optimizer, logging), per optimizer step of a whole `smoke` run of --sync-steps steps (log
  steps and the last step's summary included; log_every 2, and 5 as a second figure). Counted by
  pipeline/train/step_counters.count_host, the counter the trainer's own telemetry uses; only the
  optimizer's host-resident step counters (optimizer_host_tensors: AdamW's per-parameter step
  count, kept on the CPU unless capturable) are left out. host_sync_sites: the run's reads by
  site ("dir/file.py:line function op"); ops_per_step: aten ops dispatched.
  The figure is for the flow loop the trainer picks on this device (train.flow_loop=auto; named
  in host_syncs_flow_loop). On a CPU that is the compacting loop, which reads the live-flow count
  once per flow step: the count is 1 + flow steps per batch (flow_loop_iterations_per_step),
  4.0 on the smoke model (3 flow steps a batch), so a CPU run misses the goal; the one read the
  training loop itself makes is StepHealth.step_readout's. host_syncs_per_step_masked: the same
  count with train.flow_loop=masked (no read per flow step: the loop the goal is set for; 1.0 on
  the smoke model, goal met).
- step_time_drift (goal <= 1.05): median step time of steps 400-500 over steps 20-120 of a
  500-step `smoke` run on synthetic data (one intra-op thread, a fresh process), each window's
  over the median of the probes taken in it (a probe every 10 rows, between windows, on the
  run's thread); the median of five such runs. step_time_drift_raw: without the probes.
  step_time_drift_cpu, the figure: the same windows in the run's own CPU seconds per step (the
  probes' taken out), which other processes' load does not move (bench/clock.py).
- rss_growth_mb_per_1k_steps (goal < 5): least-squares slope of mem/rss_mb against step over the
  same runs' rows after step 100 (their median). rss_growth_mb_per_1k_steps_leak: the same with
  fault=leak (every step's autograd graph kept alive) over 250 steps, which must be large: it
  proves the slope can see a leak.

`figures` (--save also writes them to bench/results/trainer.json): the CPU-second figures above,
the host-read counts and the RSS slopes. The JSON names the CPU (cpu_model) and the probes'
spread (probe: the overhead rounds'; drift_probe: the drift runs'): a spread well above 1 says
other processes shared the machine. No GPU needed (train.device=cpu). A missed goal is
reported in goals_met, not as an exit status (the machine is shared and noisy); an error exits
non-zero.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import numpy as np
import torch

from bench import clock, results
from bench.clock import stage_threads
from bench.model import DIM
from bench.probe import Probe, RowProbe, machine, spread
from bench.tracking import SEGMENT_S, compare_arms
from bench.workloads import config, synthetic, workload_threads
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.loop import Trainer, train_model
from pipeline.train.optimizer import loss_weights, lr_lambda
from pipeline.train.step_counters import count_host, optimizer_host_tensors

GOALS = {
    "telemetry_overhead_per_step": 1.03,
    "telemetry_fixed_fraction_of_default_run": 0.02,
    "host_syncs_per_step": 1.0,
    "step_time_drift": 1.05,
    "rss_growth_mb_per_1k_steps": 5.0,
}
PARTS = ("host_reads", "drift", "leak", "overhead")
FIGURES = (
    "telemetry_overhead_per_step_cpu",
    "telemetry_cpu_s_per_run",
    "host_syncs_per_step",
    "host_syncs_per_step_masked",
    "step_time_drift_cpu",
    "rss_growth_mb_per_1k_steps",
    "rss_growth_mb_per_1k_steps_leak",
)


say = functools.partial(results.say, "trainer")


# ---------------------------------------------------------------------------- host reads
def prime_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Make the state an optimizer creates at its first step (AdamW: a step counter and two
    moments per parameter) now, exactly as that step would leave it before updating: one step at
    lr 0 on zero gradients, then every state tensor zeroed (a fresh state's values) and the
    parameters, gradients and learning rates as they were. The training that follows is the one
    it would have been; the host-resident step counters (optimizer_host_tensors) exist before it
    starts, so count_host can leave them out from its first step on."""
    params = [p for group in opt.param_groups for p in group["params"]]
    grads = [p.grad for p in params]
    lrs = [group["lr"] for group in opt.param_groups]
    before = [p.detach().clone() for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for group in opt.param_groups:
            group["lr"] = 0.0
        opt.step()
    finally:
        for group, lr in zip(opt.param_groups, lrs):
            group["lr"] = lr
        for p, g in zip(params, grads):
            p.grad = g
    with torch.no_grad():
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.zero_()
    if not all(torch.equal(p.detach(), b) for p, b in zip(params, before)):
        raise RuntimeError("priming the optimizer's state moved a parameter: a step at lr 0 should not")


def host_syncs(steps: int = 40, log_every: Optional[int] = None, *overrides: str) -> dict:
    """host_syncs_per_step (the module docstring) of a `smoke` run of `steps` optimizer steps (its
    log_every is 2 unless given). The optimizer's host-resident step counters, left out, are made
    before the run (prime_optimizer_state) so they are known from step 1."""
    cfg, n = config("smoke", steps, *([f"train.log_every={log_every}"] if log_every else []), *overrides)
    x, y = synthetic(n)
    trainer = Trainer(cfg, x, y, progress=False)
    prime_optimizer_state(trainer.opt)
    excluded = optimizer_host_tensors(trainer.opt)
    with count_host(excluded) as sample:
        res = trainer.run()
    done = res.summary["train/steps"]
    # The compacting flow loop reads once per flow step; rows hold steps_used per batch, averaged
    # over their window.
    prev, flow_loops = 0, 0.0
    for r in res.rows:
        flow_loops += r["flow/steps_used"] * (r["step"] - prev) * cfg.train.grad_accum
        prev = r["step"]
    return {
        "host_syncs_per_step": sample.host_syncs / done,
        "ops_per_step": sample.ops / done,
        "steps": done,
        "log_every": cfg.train.log_every,
        "flow_loop": "masked" if trainer.masked else "compact",
        "flow_loop_iterations_per_step": flow_loops / done,
        "optimizer_host_tensors_excluded": len(excluded),
        "sites": sample.read_sites,
    }


# ---------------------------------------------------------------------------- telemetry overhead
def bare_run(cfg, x, y, probe, name: str = "", skip: float = 0.2) -> dict:
    """A loop with no health, telemetry or skip logic (forward, backward, clip_grad_norm_, AdamW,
    LR schedule) over the same model, data and steps as a trainer run, in bench.tracking's run
    shape: a stamp every log_every steps (probes ~once a second, their time taken out)."""

    t = cfg.train
    clock = RowProbe(probe)
    probes_before = probe.take(2)
    threads = torch.get_num_threads()
    torch.set_num_threads(workload_threads(cfg))
    try:
        t0 = clock.clock()
        torch.manual_seed(cfg.run.seed)
        model = EnergyFlowModel.from_config(cfg.model, DIM)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
        loader = BatchLoader(x, y, t.batch_size, shuffle=True, seed=cfg.run.seed, drop_last=True)
        total = t.epochs * len(loader)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, total))
        step = 0
        for epoch in range(t.epochs):
            loader.set_epoch(epoch)
            for xb, yb in loader.batches():
                energy_flow_loss(model(xb).pred, yb, **loss_weights(t)).backward()
                torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step % t.log_every == 0 or step == total:
                    clock({}, step)
        t_end = clock.clock()
    finally:
        torch.set_num_threads(threads)
    extra = {"row_ms": clock.steady_ms(skip), "cpu_self_s": 0.0, "cpu_children_s": 0.0, "metrics_logged": 0}
    return clock.record("bare", skip, probes_before, (t0, t0, t_end, t_end), step, flow_steps=None, **extra)


def telemetry_overhead(
    pairs: int = 4,
    steps: int = 200,
    bare: bool = True,
    log_every: Optional[int] = None,
    probe: Optional[Probe] = None,
    segment_s: Optional[float] = None,
) -> dict:
    """The train stage's logging against tracking off, on the `default` preset: the module
    docstring's telemetry_* figures (bench.tracking measures them)."""

    arms = ("off", "stage") + (("bare",) if bare else ())
    res = compare_arms(
        "default",
        arms,
        pairs,
        steps,
        *([f"train.log_every={log_every}"] if log_every else []),
        probe=probe,
        extra_arms={"bare": bare_run},
        log=say,
        segment_s=SEGMENT_S if segment_s is None else segment_s,
    )
    # The stage arm's figures, renamed: overhead_per_step* -> telemetry_overhead_per_step*,
    # fixed_cost_s* -> telemetry_fixed_s*, cpu_cost_s* -> telemetry_cpu_s_per_run*.
    per_step = ("", "_cpu", "_runs", "_segments", "_across_runs", "_across_runs_raw")
    out = {
        **{f"telemetry_overhead_per_step{s}": res[f"overhead_per_step{s}"]["stage"] for s in per_step},
        **{f"telemetry_fixed_s{s}": res[f"fixed_cost_s{s}"]["stage"] for s in ("", "_raw", "_rounds", "_in_run")},
        **{f"telemetry_cpu_s_per_run{s}": res[f"cpu_cost_s{s}"]["stage"] for s in ("", "_rounds", "_spread")},
        "telemetry_fixed_fraction_of_default_run": res.get("fixed_fraction_of_default_run", {}).get("stage"),
        # A whole default run's overhead as the two parts make it (context, no goal of its own).
        "telemetry_overhead": res.get("overhead_default_run", {}).get("stage"),
        **{f"default_run_{k}": res.get(f"default_run_{k}") for k in ("steps", "steps_source", "s", "s_how")},
        "overhead_pairs": pairs,
        "overhead_steps_per_run": steps,
        **{
            f"overhead_{k}": res[k]
            for k in ("log_every", "segment_s", "system_metrics_every_s", "arms_same_work", "threads", "per_arm")
        },
        "overhead_probe_reference_ms": res["probe_reference_ms"],
        # The 1-minute load average: above the core count, other processes shared the run.
        "load_avg_before_after": res["load_avg_before_after"],
    }
    if bare:  # (across runs: the bare loop has no logger to switch on and off)
        out["bare_loop_step_ms"] = res["per_arm"]["bare"]["steady_step_ms"]
        out["gradient_health_overhead"] = 1 / res["overhead_per_step"]["bare"]
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


def median_between(rows: list[dict], key: str, lo: int, hi: int, what: str = "rows") -> float:
    vals = [r[key] for r in rows if lo <= r["step"] <= hi]
    if not vals:
        raise ValueError(f"no {what} between steps {lo} and {hi}")
    return float(np.median(vals))


def smoke_run(steps: int, *overrides: str, probe_every: int = 0) -> dict:
    """A `smoke` run on synthetic data: its rows, and with `probe_every` a probe (bench/probe.py)
    every that many rows, taken between windows (on_log runs outside a row's timed span) with the
    trainer's own thread count: [step, seconds] each."""
    cfg, n = config("smoke", steps, *overrides)
    probes: list[list] = []
    cpu: list[list] = []  # [step, this process's CPU seconds, the probes' taken out] at each row
    probe = Probe() if probe_every else None
    probe_cpu = [0.0]

    def on_log(metrics: dict, step: int) -> None:
        if "perf/step_ms" not in metrics:
            return
        cpu.append([step, time.process_time() - probe_cpu[0]])
        if probe and len(cpu) % probe_every == 0:  # every probe_every rows
            c0 = time.process_time()
            probes.append([step, probe()])
            probe_cpu[0] += time.process_time() - c0

    rows = train_model(cfg, *synthetic(n), on_log=on_log, progress=False).rows
    return {"rows": rows, "probes": probes, "cpu": cpu, "probe_threads": sorted(probe.threads) if probe else []}


def cpu_ms_per_step_between(cpu: list[list], lo: int, hi: int) -> float:
    """CPU ms per step from the first row at or after step `lo` to the last at or before `hi`."""
    inside = [(s, c) for s, c in cpu if lo <= s <= hi]
    if len(inside) < 2:
        raise ValueError(f"fewer than 2 rows between steps {lo} and {hi}")
    (s0, c0), (s1, c1) = inside[0], inside[-1]
    return 1000 * (c1 - c0) / (s1 - s0)


ROWS_SCRIPT = (
    "import json, sys; from bench.trainer import smoke_run; "
    "print(json.dumps(smoke_run(int(sys.argv[1]), *sys.argv[3:], probe_every=int(sys.argv[2]))))"
)


def fresh_run(steps: int, *overrides: str, probe_every: int = 0) -> dict:
    """smoke_run in a new process. In this one, memory freed by earlier runs stays in the
    allocator's free lists: a leak first refills them and the RSS slope misses it (a short
    fault=leak run right after a longer one fitted next to no slope; fresh, a steep one)."""
    return results.child_json(
        ["-c", ROWS_SCRIPT, str(steps), str(probe_every), *overrides], f"smoke run {overrides}", 600
    )


# One intra-op thread for the smoke runs. The smoke model's ops are too small to split: two
# threads step slower than one, and with another busy process on the machine far slower still
# (one waits at every parallel region for the other, descheduled), while one thread keeps its
# pace. Drift and memory growth are about the loop over time, not the thread count; one thread
# keeps other sessions' load out of them.
# (Those runs have processes of their own, so the setting never reaches the overhead runs.)
SMOKE_THREADS = "train.threads=1"


# Rows between probes: a few probes fall in each 100-step window, and the probes (taken out of the
# CPU figure) stay a small part of the run.
DRIFT_PROBE_EVERY = 10


def drift_and_rss(steps: int = 500, repeats: int = 5, rss_after: int = 100) -> dict:
    """The module docstring's step_time_drift and RSS slope of `repeats` clean `smoke` runs, each in
    a fresh process. The probes are there because the machine is shared: other sessions' load during
    one 100-step window and not the other moves the raw ratio (with two threads, runs here read
    0.19, 63 and 0.016 while other sessions ran tests)."""
    if steps < 500:
        raise ValueError(f"steps={steps}: the drift compares steps 400-500, so expected >= 500")
    runs, all_probes, threads = [], [], set()
    windows = {"early": (20, 120), "late": (400, 500)}
    for i in range(repeats):
        run = fresh_run(steps, SMOKE_THREADS, probe_every=DRIFT_PROBE_EVERY)
        rows, probes = run["rows"], run["probes"]
        all_probes += [p for _, p in probes]
        threads.update(run.get("probe_threads", []))
        ms = {w: median_between(rows, "perf/step_ms", *lh) for w, lh in windows.items()}
        probe_rows = [{"step": s, "s": p} for s, p in probes]
        probe_ms = {w: 1000 * median_between(probe_rows, "s", *lh, what="probe") for w, lh in windows.items()}
        raw = ms["late"] / ms["early"]
        cpu_ms = {w: cpu_ms_per_step_between(run["cpu"], *lh) for w, lh in windows.items()} if run.get("cpu") else None
        runs.append(
            {
                "ratio": raw / (probe_ms["late"] / probe_ms["early"]),
                "cpu": cpu_ms["late"] / cpu_ms["early"] if cpu_ms else None,
                "raw": raw,
                "early_ms": ms["early"],
                "late_ms": ms["late"],
                "probe_early_ms": probe_ms["early"],
                "probe_late_ms": probe_ms["late"],
                # The flow loop stops when flows arrive: if training changed how many flow steps
                # a batch takes, the step time would move for a reason that is not drift.
                "flow_steps": tuple(median_between(rows, "flow/flow_steps", *lh) for lh in windows.values()),
                "rss": rss_slope_per_1k(rows, rss_after),
                "rss_end": rows[-1]["mem/rss_mb"],
                "steps": rows[-1]["step"],
            }
        )
        r = runs[-1]
        say(
            f"drift run {i + 1}/{repeats}: {r['early_ms']:.2f} -> {r['late_ms']:.2f} ms/step (raw {raw:.3f}), probe "
            f"{r['probe_early_ms']:.2f} -> {r['probe_late_ms']:.2f} ms, drift {r['ratio']:.3f}; "
            f"RSS {r['rss']:.2f} MB/1k steps"
        )
    mid = lambda k: float(np.median([r[k] for r in runs]))  # noqa: E731
    return {
        "step_time_drift": mid("ratio"),
        "step_time_drift_runs": [r["ratio"] for r in runs],
        # (None where a run kept no CPU stamps)
        "step_time_drift_cpu": mid("cpu") if all(r["cpu"] for r in runs) else None,
        "step_time_drift_cpu_runs": [r["cpu"] for r in runs],
        "step_time_drift_raw": mid("raw"),
        "step_time_drift_raw_runs": [r["raw"] for r in runs],
        "drift_early_step_ms": mid("early_ms"),
        "drift_late_step_ms": mid("late_ms"),
        "drift_probe_early_ms": mid("probe_early_ms"),
        "drift_probe_late_ms": mid("probe_late_ms"),
        "drift_probe": {**spread(all_probes), "probe_threads": sorted(threads)},
        "drift_probe_every_rows": DRIFT_PROBE_EVERY,
        "drift_flow_steps_early_late": runs[0]["flow_steps"],
        "drift_steps": runs[0]["steps"],
        "rss_growth_mb_per_1k_steps": mid("rss"),
        "rss_growth_runs": [r["rss"] for r in runs],
        "rss_fit_after_step": rss_after,
        "rss_mb_end": runs[0]["rss_end"],
    }


def leak_rss(steps: int = 250, after: int = 100) -> dict:
    """The same slope with fault=leak from step 1: each step's loss, with its graph, is kept
    (fault.leak_mb=0: the graph alone, the subtle leak; the fault preset adds 8 MB a step)."""
    rows = fresh_run(steps, SMOKE_THREADS, "fault=leak", "fault.step=1", "fault.leak_mb=0")["rows"]
    return {
        "rss_growth_mb_per_1k_steps_leak": rss_slope_per_1k(rows, after),
        "leak_steps": rows[-1]["step"],
        "leak_fit_after_step": after,
        "leak_rss_mb_end": rows[-1]["mem/rss_mb"],
    }


# ---------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = results.parser("trainer", __doc__)
    ap.add_argument(
        "--pairs",
        type=int,
        default=4,
        help="rounds of the off / stage / bare arms for the telemetry figures (default 4)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=200,
        help="optimizer steps per overhead run, default-preset model (default 200 = 40 rows)",
    )
    ap.add_argument("--log-every", type=int, help="train.log_every of the overhead runs (default: the preset's, 5)")
    ap.add_argument("--sync-steps", type=int, default=40, help="smoke steps the host reads are counted over")
    ap.add_argument("--drift-steps", type=int, default=500, help="steps of the clean smoke run (>= 500)")
    ap.add_argument(
        "--drift-repeats",
        type=int,
        default=5,
        help="clean smoke runs; the drift is their median (default 5: one run alone moves with a busy machine)",
    )
    ap.add_argument("--leak-steps", type=int, default=250, help="steps of the fault=leak smoke run")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-loop arm (gradient_health_overhead)")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"which figures to measure (default all: {','.join(PARTS)}); goals_met covers those",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a fast check of the benchmark itself: 1 round of 60 steps (0.5 s segments), 1 drift run, 150 leak steps",
    )
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    segment_s = None
    if args.quick:
        args.pairs, args.steps, args.drift_repeats, args.leak_steps, args.sync_steps = 1, 60, 1, 150, 12
        segment_s = 0.5
    wanted = [p for p in args.parts.split(",") if p]
    if set(wanted) - set(PARTS):
        ap.error(f"--parts: unknown {sorted(set(wanted) - set(PARTS))}; expected some of {','.join(PARTS)}")
    t0 = time.perf_counter()
    threads = stage_threads() or torch.get_num_threads()  # the overhead runs' (the stage's) thread count
    probe = Probe(threads=threads)
    res: dict = {"device": f"cpu ({threads} threads)", "threads": threads, "torch": torch.__version__, "goals": GOALS}

    def host_reads() -> dict:
        a, b = host_syncs(args.sync_steps), host_syncs(args.sync_steps, 5)
        out = {
            # The loop the trainer picks on this device (train.flow_loop=auto: compact on a CPU).
            "host_syncs_per_step": a["host_syncs_per_step"],
            "host_syncs_flow_loop": a["flow_loop"],
            "flow_loop_iterations_per_step": a["flow_loop_iterations_per_step"],
            "ops_per_step": a["ops_per_step"],
            "sync_steps": a["steps"],
            "sync_log_every": a["log_every"],
            "host_syncs_per_step_log_every_5": b["host_syncs_per_step"],
            # Reads over the whole run by site ("dir/file.py:line function op"), for context.
            "host_sync_sites": a["sites"],
            "host_syncs_excluded": (
                f"the optimizer's host-resident step counters ({a['optimizer_host_tensors_excluded']} tensors, "
                "optimizer_host_tensors): reading them never waits for a device"
            ),
        }
        m = host_syncs(args.sync_steps, None, "train.flow_loop=masked")
        out.update({"host_syncs_per_step_masked": m["host_syncs_per_step"], "host_sync_sites_masked": m["sites"]})
        return out

    parts = {
        "host_reads": host_reads,
        "drift": lambda: drift_and_rss(args.drift_steps, args.drift_repeats),
        "leak": lambda: leak_rss(args.leak_steps),
        "overhead": lambda: telemetry_overhead(
            args.pairs, args.steps, bare=not args.no_bare, log_every=args.log_every, probe=probe, segment_s=segment_s
        ),
    }
    for name in wanted:
        t = time.perf_counter()
        res.update(parts[name]())
        say(f"{name}: {time.perf_counter() - t:.1f} s")
    checks = {
        "telemetry_overhead_per_step": lambda v: v <= GOALS["telemetry_overhead_per_step"],
        "telemetry_fixed_fraction_of_default_run": lambda v: v <= GOALS["telemetry_fixed_fraction_of_default_run"],
        "host_syncs_per_step": lambda v: v <= GOALS["host_syncs_per_step"],
        "host_syncs_per_step_masked": lambda v: v <= GOALS["host_syncs_per_step"],
        "step_time_drift": lambda v: v <= GOALS["step_time_drift"],
        "rss_growth_mb_per_1k_steps": lambda v: v < GOALS["rss_growth_mb_per_1k_steps"],
    }
    res["goals_met"] = {k: bool(ok(res[k])) for k, ok in checks.items() if res.get(k) is not None}
    if "rss_growth_mb_per_1k_steps_leak" in res and "rss_growth_mb_per_1k_steps" in res:
        # Not a speed goal: the slope must see a real leak, or a small clean slope proves nothing.
        res["goals_met"]["leak_detected"] = bool(
            res["rss_growth_mb_per_1k_steps_leak"] > 10 * max(res["rss_growth_mb_per_1k_steps"], 5.0)
        )
    if probe.times:
        res.update(machine(probe))
    else:
        res.update(machine())
        res["probe"] = res.get("drift_probe", {})
    res["bench_seconds"] = time.perf_counter() - t0
    res.update(results.figures({k: res.get(k) for k in FIGURES}, {"telemetry_cpu_s_per_run": per_run_unreliable(res)}))
    return results.finish("trainer", res, args.save, argv)


def per_run_unreliable(res: dict) -> Optional[str]:
    """Why telemetry_cpu_s_per_run cannot be reported (None: it can): a difference of two noisy
    run totals, it stands only when its rounds agree with each other."""
    if "telemetry_cpu_s_per_run" not in res:
        return None
    spread = res["telemetry_cpu_s_per_run_spread"]
    return clock.spread_unreliable(res["telemetry_cpu_s_per_run"], spread, "the rounds' max - min")


if __name__ == "__main__":
    main()
