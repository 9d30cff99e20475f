"""Tracking benchmark: what MLflow logging costs a training run, per step and once per run, for
each way of logging, measured in this one run. The last stdout line is one JSON object; progress
lines go to stderr.

Arms (each a full training run on the same synthetic data and seed; `--arms` picks them):
- off: tracking off (the reference).
- stage: what the train stage does. tracking.mlflow_run with the whole config as params, and
  every telemetry row through pipeline.tracking.metric_buffer.MetricBuffer: rows held for 0.5 s,
  then one log_batch through MLflow's asynchronous queue (its futures kept, for the outage
  guarantee), and MLflow's system-metrics collectors sampled from a thread every
  train.system_metrics_every_s.
- mlflow_async: MLflow's own asynchronous logging as it comes: mlflow.start_run with
  log_system_metrics=True (MLflow's sampler thread, its interval set to
  train.system_metrics_every_s), the same tags and params, and each row sent by
  mlflow.log_metrics(..., synchronous=False) from the trainer's on_log, MLflow's queue batching
  a second of rows into one write (MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1); the run ends with
  mlflow.flush_async_logging() and end_run, so every value is stored inside the timed span.
- server (not in the default `--arms`; `--arms off,stage,server`): the stage arm with the team
  stack's MLflow server as the store instead of a SQLite file: PostgreSQL and `mlflow server` on
  it with proxied artifacts, as `./dev team up` runs them (tools/team/standalone.py), started on
  loopback in a temporary folder for the benchmark. Its CPU figures count this process only: the
  server's and the database's work is theirs (on a team's machine, not the researcher's).
  metrics_logged_per_s_server: the throughput figure below, into that server;
  server_over_sqlite_per_step_cpu: the server arm's overhead_per_step_cpu over the stage arm's.

Figures, for each tracked arm against off (goals: per step <= 1.03; fixed <= 2 % of the default
run):
- overhead_per_step[arm]: wall time per step while rows are handed to the logger over the same
  while they are not, inside each tracked run: the run sends its rows in alternate segments of
  `--segment-s` seconds and at least 4 rows (on, off, on, ...), each sent segment is set against
  each unsent neighbour, and the figure is the median over all such pairs of all runs (from the
  row at `--skip` of a run on; per-run medians in overhead_per_step_runs). Everything the loop does
  between steps counts: handing rows over, a writer competing for the cores or the interpreter.
  The sampler of system metrics runs in both halves, so its cost is in neither (it is small: a
  sample every train.system_metrics_every_s). An A/B seconds apart sees the same machine: other
  processes' load, which moves over seconds to minutes, hits both sides.
  overhead_per_step_cpu[arm], the figure: the same A/B in this process's CPU seconds per step
  (bench/clock.py): the work logging adds to a step, MLflow's threads in this process included,
  which another process's load does not move (the wall-time figure above does: a writer thread
  that waits for a core while the machine is busy). It is an upper bound on the wall cost
  where a spare core runs the writer beside the training.
  overhead_per_step_across_runs[arm]: the sent segments' step time against the off runs' (probe-
  normalised, see below; context: runs tens of seconds apart meet different loads).
- fixed_cost_s[arm]: what a run pays once: its whole span (run start to the last value stored
  and the run ended) over the off run's of the same round, less what its sent rows cost step by
  step (sent steps x off's step time x (overhead_per_step - 1)); the median over rounds (each
  in fixed_cost_s_rounds). A writer that starts in the background slows the first seconds of a
  run, every step of it, rows or not: that is here. fixed_cost_s_in_run[arm]: each run's span
  beyond its steps at its own steady rate, against off's (no load difference between runs in
  it, but blind to a start that slows every step). cpu_cost_s[arm]: a run's CPU seconds over
  off's (this process's, MLflow's threads included, and its children's).
- fixed_fraction_of_default_run[arm]: fixed_cost_s over the default preset's run length
  (steps from metrics/train.json's train/planned_steps, times off's steady step time) when the
  preset is `default`; overhead_default_run[arm]: the whole default run's overhead the two make.

Across runs: arms run in rotating order (each round holds every arm once, ABBA across rounds),
and a fixed matmul probe (bench/probe.py) is timed before each run and about once a second inside
it (between telemetry rows, before the row is handed to the logger; its time is taken off every
span). A run's spans are divided by its probes' median and multiplied by the median of all
probes, so a run that met a busy moment is judged at the machine's usual speed; the `*_raw`
figures are the same without that. Every run also records its CPU seconds: this
process's (MLflow's threads included) and its children's; cpu_cost_s[arm] is a
run's CPU seconds over off's (less sensitive to other processes than wall time, but blind to
waiting: a lock or the interpreter's GIL held by a writer thread costs wall time, not CPU).

- metrics_logged_per_s: the stage's path's throughput: rows of 35 metrics pushed through
  MetricBuffer into a SQLite store and waited for, metric values per second
  (metrics_logged_per_s_mlflow_async: the same through mlflow.log_metrics(synchronous=False)).

figures (--save also writes them to bench/results/tracking.json): overhead_per_step_cpu and
cpu_cost_s per tracked arm; each is null (every arm of it), with the reason in `unreliable`,
when an arm's spread within this run is wider than two runs are held to (bench/clock.py's
AGREEMENT): overhead_per_step_cpu by the range of its runs' own medians
(overhead_per_step_cpu_runs, _spread: a run's segments share its moment, so they spread less
than runs do; the pooled median's 95 % interval is in overhead_per_step_cpu_half_width),
cpu_cost_s by the range of its rounds' differences (cpu_cost_s_rounds, cpu_cost_s_spread).
No GPU needed. A missed goal is reported in goals_met, not as an exit status; an error exits
non-zero. Never touches the project's mlflow.db.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from bench import clock, results
from bench.clock import cpu_with_children
from bench.probe import Probe, RowProbe, machine, normaliser
from bench.workloads import config, synthetic, temporary_store, workload_threads
from pipeline.core.config import flatten
from pipeline.core.environment import temporary_env
from pipeline.core.paths import REPO_ROOT
from pipeline.tracking.metric_buffer import MetricBuffer
from pipeline.tracking.metric_names import route
from pipeline.tracking.provenance import provenance
from pipeline.train.loop import train_model

GOALS = {"overhead_per_step": 1.03, "fixed_fraction_of_default_run": 0.02}
ARMS = ("off", "stage", "mlflow_async")
SERVER_ARM = "server"  # the stage's path into the team server (main starts one when it is asked for)
EXPERIMENT = "bench-tracking"
say = functools.partial(results.say, "tracking")


def default_run_steps() -> tuple[Optional[int], str]:
    """Optimizer steps of the default preset's run on the shipped data: train/planned_steps of
    the run recorded in metrics/train.json (params.yaml says which preset made it)."""
    metrics, params = REPO_ROOT / "metrics" / "train.json", REPO_ROOT / "params.yaml"
    try:
        from omegaconf import OmegaConf

        preset = OmegaConf.load(params).run.preset
        steps = json.loads(metrics.read_text())["train/planned_steps"]
    except (OSError, ValueError, KeyError, AttributeError):
        return None, "metrics/train.json or params.yaml unreadable"
    if preset != "default":
        return None, f"metrics/train.json is a {preset!r} run, not the default preset's"
    return int(steps), "metrics/train.json train/planned_steps (params.yaml run.preset=default)"


MLFLOW_ASYNC_BUFFERING_S = 1  # MLflow's own batching of queued rows: one log_batch a second


@contextlib.contextmanager
def mlflow_async_run(name: str, cfg) -> Iterator[Callable[[dict, int], None]]:
    """A run logged the way MLflow offers on its own: its system-metrics sampler thread and
    its asynchronous queue, in this process, the queue batching what arrives within
    MLFLOW_ASYNC_BUFFERING_S into one log_batch (MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS).
    Yields the on_log that sends a row."""
    import mlflow
    from mlflow.environment_variables import MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS

    from pipeline.tracking import store as tracking

    mlflow.set_tracking_uri(tracking.tracking_uri())
    tracking._set_experiment(EXPERIMENT)
    mlflow.set_system_metrics_sampling_interval(cfg.train.system_metrics_every_s)
    with temporary_env({MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS.name: str(MLFLOW_ASYNC_BUFFERING_S)}):
        try:
            mlflow.start_run(run_name=name, log_system_metrics=True)
            status = "FAILED"
            try:
                prov, _ = provenance(cfg.run.preset)
                mlflow.set_tags(prov)
                tracking.log_params(flatten(cfg))
                yield lambda metrics, step: tracking.log_metrics(metrics, step=step)
                status = "FINISHED"
            finally:
                mlflow.flush_async_logging()
                mlflow.end_run(status=status)  # stops the sampler (it logs its last sample) and ends the run
        finally:
            mlflow.set_system_metrics_sampling_interval(None)


SEGMENT_S = 2.0  # the in-run A/B's segments: a few buffer flushes (every 0.5 s) and MLflow batches (1 s) each


def arm_run(
    arm: str, cfg, x, y, probe: Probe, name: str, skip: float, before: int = 2, segment_s: float = SEGMENT_S
) -> dict:
    """One training run of `arm`; its phases' wall seconds (probes taken out), its steady step
    time, its in-run A/B (rows sent in alternate `segment_s` segments), CPU seconds, probes."""
    from pipeline.tracking import store as tracking

    probes_before = probe.take(before)
    clock = RowProbe(probe, segment_s=segment_s)
    cpu0 = cpu_with_children()
    t0 = clock.clock()
    sent = 0
    if arm == "off":
        t_setup = clock.clock()
        res = train_model(cfg, x, y, on_log=clock, progress=False)
        t_train = t_end = clock.clock()
    elif arm == "stage":
        with tracking.mlflow_run(name, cfg.run.preset, experiment=EXPERIMENT) as run:
            tracking.log_params(flatten(cfg))
            sampling = cfg.train.system_metrics_every_s
            with MetricBuffer(run.info.run_id, system_metrics_s=sampling) as buf:
                clock.inner = buf
                t_setup = clock.clock()
                res = train_model(cfg, x, y, on_log=clock, progress=False)
                t_train = clock.clock()
            tracking.log_metrics(res.summary, step=int(res.summary["train/steps"]))
            sent = buf.sent
        t_end = clock.clock()
    elif arm == "mlflow_async":
        with mlflow_async_run(name, cfg) as send:
            clock.inner = send
            t_setup = clock.clock()
            res = train_model(cfg, x, y, on_log=clock, progress=False)
            t_train = clock.clock()
            tracking.log_metrics(res.summary, step=int(res.summary["train/steps"]))
        t_end = clock.clock()
        # What reaches MLflow of each row sent (the table leaves bookkeeping columns out).
        sent = sum(len(route(r)[0]) for r, s in zip(res.rows, clock.sent) if s)
    else:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    cpu1 = cpu_with_children()
    return clock.record(
        arm,
        skip,
        probes_before,
        (t0, t_setup, t_train, t_end),
        int(res.summary["train/steps"]),
        row_ms=float(np.median([r["perf/step_ms"] for r in res.rows[2:]])),
        cpu_self_s=cpu1[0] - cpu0[0],
        cpu_children_s=cpu1[1] - cpu0[1],
        flow_steps=[r["flow/flow_steps"] for r in res.rows],
        metrics_logged=sent,
        segment_ratios=clock.segment_ratios(skip),
        segment_ratios_cpu=clock.segment_ratios(skip, cpu=True),
        sent_ms=clock.sent_ms(skip),
    )


def server_arm(uri: str, segment_s: float, cfg, x, y, probe: Probe, name: str, skip: float) -> dict:
    """The stage arm with MLFLOW_TRACKING_URI at the team server `uri` for the run (tracking_uri()
    reads the variable on every call, MetricBuffer's client when it opens)."""
    with temporary_env({"MLFLOW_TRACKING_URI": uri}):
        out = arm_run("stage", cfg, x, y, probe, name, skip, segment_s=segment_s)
    return {**out, "arm": SERVER_ARM}


def compare_arms(
    preset: str,
    arms: tuple[str, ...],
    rounds: int,
    steps: int,
    *overrides: str,
    skip: float = 0.2,
    probe: Optional[Probe] = None,
    extra_arms: Optional[dict[str, Callable]] = None,
    segment_s: float = SEGMENT_S,
    log: Callable[[str], None] = say,
) -> dict:
    """`rounds` rounds of every arm on the `preset` model, `steps` optimizer steps a run; every
    figure per arm, against the first arm (the reference, normally off). `extra_arms` adds arms
    of the caller's: name -> fn(cfg, x, y, probe, name, skip) returning arm_run's keys."""
    extra_arms = extra_arms or {}

    def one(arm: str, cfg, x, y, name: str, before: int = 2) -> dict:
        if arm in extra_arms:
            return extra_arms[arm](cfg, x, y, probe, name, skip)
        return arm_run(arm, cfg, x, y, probe, name, skip, before, segment_s)

    cfg, n = config(preset, steps, "train.device=cpu", "train.checkpoint_every=0", *overrides)
    x, y = synthetic(n)
    probe = probe or Probe(threads=workload_threads(cfg))
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    with temporary_store():
        # Untimed warm-up of every arm: torch's allocator and threads, MLflow's imports, the store.
        wcfg, wn = config(preset, 20, "train.device=cpu", "train.checkpoint_every=0", *overrides)
        for arm in arms:
            one(arm, wcfg, *synthetic(wn), "warm-up", before=1)
        for i in range(rounds):
            # Rotate, and reverse every other round: each arm meets each position and neighbour.
            order = arms[i % len(arms) :] + arms[: i % len(arms)]
            order = order[::-1] if i % 2 else order
            for arm in order:
                runs[arm].append(one(arm, cfg, x, y, f"{arm}-{i}"))
            ref = runs[arms[0]][-1]
            log(
                f"{preset} round {i + 1}/{rounds} (raw): "
                + ", ".join(
                    f"{a} {np.median(r[-1].get('segment_ratios') or [np.nan]):.3f}/step "
                    f"in-run, {r[-1]['steady_ms'] / ref['steady_ms']:.3f} across runs, "
                    f"{r[-1]['fixed_s'] - ref['fixed_s']:+.2f} s once"
                    for a, r in runs.items()
                    if a != arms[0]
                )
            )
    # Every run at the machine's median speed over the whole comparison.
    reference = float(np.median([p for rs in runs.values() for r in rs for p in r["probes"]]))
    for rs in runs.values():
        for r in rs:
            r["norm"] = normaliser(r["probes"], reference)

    def med(arm: str, key: str, norm: bool = True) -> float:
        return float(np.median([r[key] * (r["norm"] if norm else 1.0) for r in runs[arm]]))

    base = arms[0]
    out: dict = {
        "preset": preset,
        "arms": list(arms),
        "reference_arm": base,
        "rounds": rounds,
        "steps_per_run": steps,
        "steady_skip_fraction": skip,
        "log_every": cfg.train.log_every,
        "system_metrics_every_s": cfg.train.system_metrics_every_s,
        "threads": workload_threads(cfg),
        "mlflow_async_buffering_s": MLFLOW_ASYNC_BUFFERING_S,
        "probe_reference_ms": 1000 * reference,
        # Same seed, same data: every arm must have run the same flows, step for step.
        "arms_same_work": all(
            r["flow_steps"] == runs[base][0]["flow_steps"]
            for rs in runs.values()
            for r in rs
            if r["flow_steps"] is not None
        ),
        "load_avg_before_after": [load_before, os.getloadavg()[0]],
        "compare_seconds": time.perf_counter() - t_start,
        "segment_s": segment_s,
        # Filled in arm by arm below.
        **{f"overhead_per_step{s}": {} for s in ("", "_cpu", "_runs", "_segments", "_across_runs", "_across_runs_raw")},
        **{f"fixed_cost_s{s}": {} for s in ("", "_raw", "_rounds", "_in_run")},
        **{f"cpu_cost_s{s}": {} for s in ("", "_rounds", "_spread")},
        **{f"overhead_per_step_cpu{s}": {} for s in ("_half_width", "_runs", "_spread")},
        "per_arm": {},
    }
    cpu = lambda a: float(np.median([r["cpu_self_s"] + r["cpu_children_s"] for r in runs[a]]))  # noqa: E731
    for arm in arms:
        out["per_arm"][arm] = {
            "steady_step_ms": med(arm, "steady_ms"),
            "steady_step_ms_raw": med(arm, "steady_ms", False),
            # The span beyond the steps at the run's own steady rate: setup, teardown, the first rows.
            "in_run_fixed_s": med(arm, "fixed_s"),
            **{k: med(arm, k) for k in ("wall_s", "setup_s", "train_s", "teardown_s")},
            "row_step_ms": med(arm, "row_ms"),
            **{k: med(arm, k, False) for k in ("cpu_self_s", "cpu_children_s")},
            "probe_ms_median": 1000 * float(np.median([p for r in runs[arm] for p in r["probes"]])),
            "metrics_logged_per_run": med(arm, "metrics_logged", False),
            "rows_per_run": med(arm, "rows", False),
            "rows_sent_per_run": med(arm, "rows_sent", False),
        }
        if arm == base:
            continue
        # Per step: the runs' own A/B, every sent segment against its unsent neighbours (pooled
        # over runs); an arm without one (an extra arm) falls back to steady rates across runs.
        ratios = [q for r in runs[arm] for q in r.get("segment_ratios") or []]
        sent = [r for r in runs[arm] if r.get("sent_ms")]
        sent_ms = (
            (lambda norm: float(np.median([r["sent_ms"] * (r["norm"] if norm else 1.0) for r in sent])))
            if sent
            else (lambda norm: med(arm, "steady_ms", norm))
        )
        out["overhead_per_step_across_runs"][arm] = sent_ms(True) / med(base, "steady_ms")
        out["overhead_per_step_across_runs_raw"][arm] = sent_ms(False) / med(base, "steady_ms", False)
        out["overhead_per_step"][arm] = (
            float(np.median(ratios)) if ratios else out["overhead_per_step_across_runs"][arm]
        )
        cpu_ratios = [q for r in runs[arm] for q in r.get("segment_ratios_cpu") or []]
        out["overhead_per_step_cpu"][arm] = float(np.median(cpu_ratios)) if cpu_ratios else None
        out["overhead_per_step_cpu_half_width"][arm] = clock.median_half_width(cpu_ratios)
        # Segments of one run share its moment, so runs spread wider than segments: their range.
        per_run = [float(np.median(r["segment_ratios_cpu"])) for r in runs[arm] if r.get("segment_ratios_cpu")]
        out["overhead_per_step_cpu_runs"][arm] = per_run
        out["overhead_per_step_cpu_spread"][arm] = float(np.ptp(per_run)) if len(per_run) > 1 else None
        out["overhead_per_step_runs"][arm] = [
            float(np.median(r["segment_ratios"])) if r.get("segment_ratios") else None for r in runs[arm]
        ]
        out["overhead_per_step_segments"][arm] = len(ratios)

        # Once per run: the run's whole span over off's in the same round, less what its sent rows cost
        # step by step (the sent fraction of its steps at off's steady rate times the per-step
        # overhead). Not against the run's own steady rate: a writer starting up in the background
        # slows every step of a short run, sent or not, and that is a cost of the run, not of its rows.
        def fixed(a: dict, b: dict, norm: bool) -> float:
            na, nb = (a["norm"], b["norm"]) if norm else (1.0, 1.0)
            per_step = out["overhead_per_step"][arm] - 1.0
            sent_fraction = a["rows_sent"] / max(a["rows"], 1)
            return (
                a["wall_s"] * na - b["wall_s"] * nb - sent_fraction * a["steps"] * b["steady_ms"] * nb / 1000 * per_step
            )

        pairs = list(zip(runs[arm], runs[base]))
        out["fixed_cost_s_rounds"][arm] = [fixed(a, b, True) for a, b in pairs]
        out["fixed_cost_s"][arm] = float(np.median(out["fixed_cost_s_rounds"][arm]))
        out["fixed_cost_s_raw"][arm] = float(np.median([fixed(a, b, False) for a, b in pairs]))
        out["fixed_cost_s_in_run"][arm] = med(arm, "fixed_s") - med(base, "fixed_s")
        out["cpu_cost_s"][arm] = cpu(arm) - cpu(base)
        # A difference of two noisy run totals: each round's, and how far they spread.
        run_cpu = lambda r: r["cpu_self_s"] + r["cpu_children_s"]  # noqa: E731
        out["cpu_cost_s_rounds"][arm] = [run_cpu(a) - run_cpu(b) for a, b in pairs]
        out["cpu_cost_s_spread"][arm] = float(np.ptp(out["cpu_cost_s_rounds"][arm])) if len(pairs) > 1 else None
    # What a run pays once, against the length of the default preset's run.
    steps_default, source = default_run_steps()
    out["default_run_steps"], out["default_run_steps_source"] = steps_default, source
    if preset == "default" and steps_default:
        run_s = steps_default * out["per_arm"][base]["steady_step_ms"] / 1000
        out["default_run_s"] = run_s
        out["default_run_s_how"] = f"default_run_steps x {base}'s steady step time (probe-normalised) in this run"
        out["fixed_fraction_of_default_run"] = {a: f / run_s for a, f in out["fixed_cost_s"].items()}
        # The default run's whole-run overhead these two parts make: every step's, plus the fixed part.
        out["overhead_default_run"] = {
            a: out["overhead_per_step"][a] + f / run_s for a, f in out["fixed_cost_s"].items()
        }
    return out


def buffer_throughput(rows: int, keys: list[str], run_name: str) -> tuple[int, float]:
    """Rows pushed through MetricBuffer (flushing as the train stage does) into the store
    MLFLOW_TRACKING_URI names, and waited for: (values sent, seconds)."""
    from pipeline.tracking import store as tracking

    with tracking.mlflow_run(run_name, "smoke", experiment=EXPERIMENT) as run:
        with MetricBuffer(run.info.run_id, flush_seconds=0.5) as warm:
            warm({k: 0.0 for k in keys}, 0)  # the store's first write and the queue's threads
        t0 = time.perf_counter()
        with MetricBuffer(run.info.run_id, flush_seconds=0.5) as buf:
            for step in range(1, rows + 1):
                buf({k: step * 1e-3 for k in keys}, step)
        return buf.sent, time.perf_counter() - t0


def logging_throughput(rows: int, metrics_per_row: int = 35, server_uri: Optional[str] = None) -> dict:
    """buffer_throughput into a SQLite store; the same through MLflow's asynchronous queue,
    flushed and waited for; and, given `server_uri`, buffer_throughput into that server."""
    import mlflow

    from pipeline.tracking import store as tracking

    keys = [f"bench/metric_{i}" for i in range(metrics_per_row)]
    with temporary_store():
        sent, seconds = buffer_throughput(rows, keys, "throughput")
        with tracking.mlflow_run("throughput-async", "smoke", experiment=EXPERIMENT):
            tracking.log_metrics({k: 0.0 for k in keys}, step=0)
            mlflow.flush_async_logging()
            t0 = time.perf_counter()
            for step in range(1, rows + 1):
                tracking.log_metrics({k: step * 1e-3 for k in keys}, step=step)
            mlflow.flush_async_logging()
            async_seconds = time.perf_counter() - t0
        out = {
            "metrics_logged_per_s": sent / seconds,
            "throughput_metrics": sent,
            "throughput_seconds": seconds,
            "metrics_logged_per_s_mlflow_async": rows * metrics_per_row / async_seconds,
        }
        if server_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = server_uri  # temporary_store puts the caller's back
            sent, seconds = buffer_throughput(rows, keys, "throughput-server")
            out["metrics_logged_per_s_server"] = sent / seconds
    return out


def main(argv=None) -> dict:
    ap = results.parser("tracking", __doc__)
    ap.add_argument(
        "--preset",
        default="smoke",
        help="model the arms train (default smoke: a row of ~35 metrics every 2 short steps, the "
        "highest logging rate of any preset; `default` is the train stage's main job)",
    )
    ap.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated, the first is the reference (default {','.join(ARMS)})"
    )
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every arm (default 5)")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default: 1000 for smoke, 200 otherwise)")
    ap.add_argument("--skip", type=float, default=0.2, help="fraction of a run's rows before the steady part")
    ap.add_argument(
        "--segment-s",
        type=float,
        default=SEGMENT_S,
        help=f"seconds per segment of the in-run A/B (default {SEGMENT_S:g}; 0: every row sent, and "
        "overhead_per_step is across runs)",
    )
    ap.add_argument("--rows", type=int, default=2000, help="rows of 35 metrics for metrics_logged_per_s")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke check of the benchmark itself: 1 round of 80 steps, 0.05 s segments",
    )
    ap.add_argument("overrides", nargs="*", help="config overrides for every arm, e.g. train.log_every=5")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    import mlflow  # noqa: F401 - first: on import it sets its loggers' levels, which this overrides

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Creating initial tables", "Started monitoring"
    if args.quick:
        args.rounds, args.steps, args.rows, args.segment_s = 1, 80, 200, 0.05
    steps = args.steps or (1000 if args.preset == "smoke" else 200)
    arms = tuple(a for a in args.arms.split(",") if a)
    t0 = time.perf_counter()
    probe = Probe(threads=workload_threads(config(args.preset, 1, *args.overrides)[0]))
    res: dict = {"device": "cpu", "torch": torch.__version__, "goals": GOALS}
    with contextlib.ExitStack() as servers:
        server_uri, extra = None, {}
        if SERVER_ARM in arms:
            from tools.team.standalone import mlflow_on_postgres

            folder = servers.enter_context(tempfile.TemporaryDirectory(prefix="bench-team-"))
            server_uri = servers.enter_context(mlflow_on_postgres(Path(folder)))
            extra = {SERVER_ARM: functools.partial(server_arm, server_uri, args.segment_s)}
            say(f"team server (PostgreSQL) for the {SERVER_ARM} arm: {server_uri}")
        res.update(logging_throughput(args.rows, server_uri=server_uri))
        say(
            f"throughput: {res['metrics_logged_per_s']:.0f} metrics/s (stage), "
            f"{res['metrics_logged_per_s_mlflow_async']:.0f} (mlflow async)"
            + (f", {res['metrics_logged_per_s_server']:.0f} (team server)" if server_uri else "")
        )
        res.update(
            compare_arms(
                args.preset,
                arms,
                args.rounds,
                steps,
                *args.overrides,
                skip=args.skip,
                probe=probe,
                extra_arms=extra,
                segment_s=args.segment_s,
            )
        )
    if SERVER_ARM in arms and "stage" in arms:
        # The server against the SQLite file, both in this run: per step, the CPU the loop pays.
        server, sqlite = res["overhead_per_step_cpu"][SERVER_ARM], res["overhead_per_step_cpu"]["stage"]
        res["server_over_sqlite_per_step_cpu"] = server / sqlite if server and sqlite else None
    res["goals_met"] = {
        f"overhead_per_step/{a}": v <= GOALS["overhead_per_step"] for a, v in res["overhead_per_step"].items()
    }
    for a, v in res.get("fixed_fraction_of_default_run", {}).items():
        res["goals_met"][f"fixed_fraction_of_default_run/{a}"] = v <= GOALS["fixed_fraction_of_default_run"]
    res.update(machine(probe))
    res["bench_seconds"] = time.perf_counter() - t0
    res.update(headline(res))
    return results.finish("tracking", res, args.save, argv)


def headline(res: dict) -> dict:
    """overhead_per_step_cpu and cpu_cost_s per tracked arm, each null where its spread within
    this run says another run would not reproduce it: the per-step ratio by the range of its runs'
    medians, the per-run cost (a difference of two run totals) by its rounds' range. One arm that
    cannot holds back the figure's every arm: a figure is null or reported whole."""
    how = {
        "overhead_per_step_cpu": ("overhead_per_step_cpu_spread", "its runs' medians' max - min"),
        "cpu_cost_s": ("cpu_cost_s_spread", "the rounds' max - min"),
    }
    why = {}
    for key, (spread, what) in how.items():
        arms = {arm: clock.spread_unreliable(v, res[spread][arm], what) for arm, v in res[key].items()}
        why[key] = "; ".join(f"{arm}: {reason}" for arm, reason in arms.items() if reason) or None
    return results.figures({k: res[k] for k in how}, why)


if __name__ == "__main__":
    main()
