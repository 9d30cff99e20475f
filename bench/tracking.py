"""Tracking benchmark: what MLflow logging costs the training loop, measured in this one run.
The last stdout line is one JSON object; progress lines go to stderr.

- logging_overhead (goal <= 1.03): train step time with full MLflow logging over the same with
  tracking off, on a smoke-sized model (the `smoke` preset: 4x4x3 lattice, one intra-op thread)
  and synthetic data. "Full logging" is what the train stage does: tracking.mlflow_run with
  the whole config as params, and every telemetry row (~35 metrics every train.log_every = 2
  steps) through tracking.MetricBuffer, whose sidecar process (pipeline.tracking.metric_writer) writes
  them and samples system metrics every train.system_metrics_every_s (1 s). Step time is wall
  time per step between telemetry rows, from the row at 20 % of the run to the last: everything
  the loop does between steps counts (handing rows over, flushing), and the writes happen
  meanwhile; the sidecar's start (~2 s of MLflow imports, on the other core) is over by then.
  Runs of both arms alternate (ABBA order) on the same data and seed; the ratio is of the median
  step times.
  logging_overhead_whole_run: the same over each run's whole span, which also holds what a run
  pays once: starting the sidecar and the final wait until the store has every row
  (logging_fixed_cost_s_per_run, seconds). logging_overhead_step_ms: from the rows' own
  perf/step_ms (which leaves out the time between windows).
- metrics_logged_per_s: the logging path's throughput: rows of 35 metrics pushed through
  tracking.MetricBuffer into a SQLite store and waited for, metric values per second.
- metrics_per_s_during_training: what the tracked arm asked of that path (context: it must be
  well below metrics_logged_per_s).

No GPU needed. A missed goal is reported in goals_met, not as an exit status (the machine is
shared and noisy); an error exits non-zero. Never touches the project's mlflow.db.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np
import torch

from bench.trainer import config, synthetic, temporary_store
from pipeline.core.config import flatten
from pipeline.train.loop import train_model

GOALS = {"logging_overhead": 1.03}
EXPERIMENT = "bench-tracking"


def say(msg: str) -> None:
    print(f"[bench.tracking] {msg}", file=sys.stderr, flush=True)


class RowClock:
    """The trainer's on_log in both arms: notes when each telemetry row arrives (wall clock), and
    passes the row on to MLflow in the tracked arm. Rows arrive every log_every steps, after
    everything the loop does between steps (an in-loop logger's cost included)."""

    def __init__(self, inner=None):
        self.inner, self.stamps = inner, []

    def __call__(self, metrics: dict, step: int) -> None:
        self.stamps.append((step, time.perf_counter()))
        if self.inner is not None:
            self.inner(metrics, step)

    def steady_step_ms(self, skip: float = 0.2) -> float:
        """Wall ms per step from the row at `skip` of the run to the last: the sidecar's start
        (MLflow's import, ~2 s of the other core) is over by then."""
        (s0, t0), (s1, t1) = self.stamps[int(len(self.stamps) * skip)], self.stamps[-1]
        return 1000 * (t1 - t0) / (s1 - s0)


def timed_run(cfg, x, y, tracked: bool, name: str, flush_seconds: float | None = None) -> dict:
    """One training run: its whole training span in seconds (for the tracked arm: from starting
    the sidecar to the end of the final wait until the store has every row), its steady step
    time, its rows and the metric values logged."""
    from pipeline.tracking import store as tracking

    if not tracked:
        clock = RowClock()
        t0 = time.perf_counter()
        res = train_model(cfg, x, y, on_log=clock, progress=False)
        return {"seconds": time.perf_counter() - t0, "steady_ms": clock.steady_step_ms(),
                "steps": res.summary["train/steps"], "rows": res.rows, "metrics_logged": 0}
    with tracking.mlflow_run(name, cfg.run.preset, experiment=EXPERIMENT) as run:
        tracking.log_params(flatten(cfg))
        t0 = time.perf_counter()
        extra = {} if flush_seconds is None else {"flush_seconds": flush_seconds}
        with tracking.MetricBuffer(run.info.run_id, system_metrics_s=cfg.train.system_metrics_every_s,
                                   **extra) as to_mlflow:
            clock = RowClock(to_mlflow)
            res = train_model(cfg, x, y, on_log=clock, progress=False)
        seconds = time.perf_counter() - t0  # includes the final flush, waited for (__exit__)
        tracking.log_metrics(res.summary, step=int(res.summary["train/steps"]))
    return {"seconds": seconds, "steady_ms": clock.steady_step_ms(), "steps": res.summary["train/steps"],
            "rows": res.rows, "metrics_logged": to_mlflow.sent}


def logging_overhead(pairs: int, steps: int, *overrides: str, flush_seconds: float | None = None) -> dict:
    cfg, n = config("smoke", steps, *overrides)
    x, y = synthetic(n)
    arms = ("tracked", "untracked")
    steady = {a: [] for a in arms}  # wall ms per step, steady state
    whole = {a: [] for a in arms}  # wall ms per step over the whole span
    row_ms = {a: [] for a in arms}  # the rows' own perf/step_ms
    pair_ratios, rates, flows, fixed_s = [], [], [], []
    load_before = os.getloadavg()[0]
    with temporary_store():
        # Untimed warm-up of both arms: torch's allocator, MLflow's imports, the store's schema.
        wcfg, wn = config("smoke", 20, *overrides)
        for tracked in (True, False):
            timed_run(wcfg, *synthetic(wn), tracked, "warm-up", flush_seconds)
        for i in range(pairs):
            order = (True, False) if i % 2 == 0 else (False, True)  # ABBA
            pair = {}
            for tracked in order:
                r = timed_run(cfg, x, y, tracked, f"overhead-{i}", flush_seconds)
                arm = "tracked" if tracked else "untracked"
                steady[arm].append(r["steady_ms"])
                whole[arm].append(1000 * r["seconds"] / r["steps"])
                row_ms[arm] += [row["perf/step_ms"] for row in r["rows"][2:]]
                flows.append([row["flow/flow_steps"] for row in r["rows"]])
                pair[arm] = r
                if tracked:
                    rates.append(r["metrics_logged"] / r["seconds"])
            pair_ratios.append(pair["tracked"]["steady_ms"] / pair["untracked"]["steady_ms"])
            # What a run pays once: its whole span beyond its steps at the steady rate, over the
            # same for the untracked run of the pair.
            fixed_s.append((pair["tracked"]["seconds"] - pair["tracked"]["steady_ms"] * pair["tracked"]["steps"] / 1000)
                           - (pair["untracked"]["seconds"]
                              - pair["untracked"]["steady_ms"] * pair["untracked"]["steps"] / 1000))
            say(f"pair {i + 1}/{pairs}: tracked/untracked step time {pair_ratios[-1]:.3f}, "
                f"whole run {pair['tracked']['seconds'] / pair['untracked']['seconds']:.3f}")
    med = {k: {a: float(np.median(v[a])) for a in arms} for k, v in
           (("steady", steady), ("whole", whole), ("row", row_ms))}
    return {"logging_overhead": med["steady"]["tracked"] / med["steady"]["untracked"],
            "logging_overhead_whole_run": med["whole"]["tracked"] / med["whole"]["untracked"],
            "logging_overhead_step_ms": med["row"]["tracked"] / med["row"]["untracked"],
            "logging_fixed_cost_s_per_run": float(np.median(fixed_s)),
            "tracked_step_ms": med["steady"]["tracked"], "untracked_step_ms": med["steady"]["untracked"],
            "logging_overhead_pair_ratios": pair_ratios, "pairs": pairs, "steps_per_run": steps,
            "log_every": cfg.train.log_every, "system_metrics_every_s": cfg.train.system_metrics_every_s,
            "metrics_per_s_during_training": float(np.median(rates)),
            # Same seed, same data: both arms must have run the same flows, step for step.
            "arms_same_work": all(f == flows[0] for f in flows),
            "threads": torch.get_num_threads(), "load_avg_before_after": [load_before, os.getloadavg()[0]]}


def logging_throughput(rows: int, metrics_per_row: int = 35) -> dict:
    """Rows pushed through MetricBuffer (flushing as the train stage does) and waited for."""
    from pipeline.tracking import store as tracking

    keys = [f"bench/metric_{i}" for i in range(metrics_per_row)]
    with temporary_store():
        with tracking.mlflow_run("throughput", "smoke", experiment=EXPERIMENT) as run:
            with tracking.MetricBuffer(run.info.run_id, flush_seconds=0.5) as warm:
                warm({k: 0.0 for k in keys}, 0)  # the store's first write and the queue's threads
            t0 = time.perf_counter()
            with tracking.MetricBuffer(run.info.run_id, flush_seconds=0.5) as buf:
                for step in range(1, rows + 1):
                    buf({k: step * 1e-3 for k in keys}, step)
            seconds = time.perf_counter() - t0
    return {"metrics_logged_per_s": buf.sent / seconds, "throughput_metrics": buf.sent,
            "throughput_seconds": seconds}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.tracking", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10,
                    help="tracked/untracked run pairs (default 10: single pairs vary by +-3 %% on a shared 2-core machine)")
    ap.add_argument("--steps", type=int, default=1000,
                    help="optimizer steps per run (default 1000: ~6 s of smoke training on 1 thread, so the "
                         "10 s flush period and the final flush both fall inside the measured span)")
    ap.add_argument("--rows", type=int, default=2000, help="rows of 35 metrics for metrics_logged_per_s")
    ap.add_argument("--flush-seconds", type=float, default=None,
                    help="tracking.MetricBuffer's flush period (default: the train stage's, 0.5 s)")
    ap.add_argument("--quick", action="store_true", help="a fast smoke check of the benchmark itself")
    ap.add_argument("overrides", nargs="*", help="config overrides for both arms, e.g. train.log_every=5")
    args = ap.parse_args(argv)
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not the store's "Creating initial tables"
    if args.quick:
        args.pairs, args.steps, args.rows = 1, 40, 200
    t0 = time.perf_counter()
    res: dict = {"device": "cpu", "torch": torch.__version__, "goals": GOALS}
    res.update(logging_throughput(args.rows))
    say(f"throughput: {res['metrics_logged_per_s']:.0f} metrics/s")
    res.update(logging_overhead(args.pairs, args.steps, "train.device=cpu", "train.checkpoint_every=0",
                                *args.overrides, flush_seconds=args.flush_seconds))
    res["goals_met"] = {"logging_overhead": res["logging_overhead"] <= GOALS["logging_overhead"]}
    res["bench_seconds"] = time.perf_counter() - t0
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
