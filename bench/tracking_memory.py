"""What tracking adds to the train stage's resident memory: the figure behind the memory
estimate's constant (pipeline/train/memory_estimate.py: TRACKING_MB), re-measured.

Each round is a fresh interpreter that imports what the train stage imports, reads its RSS, then
does what rank 0 does after the memory check with tracking on: imports MLflow, opens a new local
SQLite store (its tables created, as on a fresh clone), starts a run, logs the config as params
and opens the metric buffer (MLflow's async queue and the system-metrics sampler, both threads
of the stage's process) with 200 telemetry rows sent and synced; the figure is the RSS after over
the RSS before. Prints one JSON object as its last line:
tracking_mb_rounds, tracking_mb (their median), the constant, their ratio, and the CPU model
with the core count and load (bench/probe.machine). --save also writes bench/results/tracking_memory.json.
Memory, not time: no probe is needed, and the figure does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench import results
from bench.probe import machine
from pipeline.core.paths import REPO_ROOT
from pipeline.train.memory_estimate import TRACKING_MB

ROUND = """
import json, sys
import stages.train  # noqa: F401  (the stage's imports: torch, pandas, the pipeline)
from pipeline.core.config import flatten, load_config
from pipeline.tracking import store as tracking
from pipeline.train.telemetry import rss_mb

cfg = load_config()
before = rss_mb()
from pipeline.tracking.metric_buffer import MetricBuffer

with tracking.mlflow_run("tracking-memory", cfg.run.preset, experiment="bench-tracking-memory") as run:
    tracking.log_params(flatten(cfg))
    with MetricBuffer(run.info.run_id, system_metrics_s=cfg.train.system_metrics_every_s) as buf:
        for step in range(1, 201):
            buf({f"m/{i}": step * 1e-3 for i in range(35)}, step)
        buf.sync()
        after = rss_mb()
print(json.dumps({"before_mb": before, "after_mb": after}))
"""


def one_round() -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-tracking-memory-") as tmp:
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
            "ENERGY_FLOW_RUNS_DIR": tmp,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(
            [sys.executable, "-c", ROUND], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
        )
    if proc.returncode != 0:
        raise SystemExit(f"bench.tracking_memory: a round failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="fresh interpreters to measure (default 3)")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    rounds = [one_round() for _ in range(args.rounds)]
    deltas = [r["after_mb"] - r["before_mb"] for r in rounds]
    measured = float(np.median(deltas))
    res = {
        **machine(),
        "tracking_mb": measured,
        "tracking_mb_rounds": deltas,
        "baseline_mb_rounds": [r["before_mb"] for r in rounds],
        "tracking_mb_constant": TRACKING_MB,
        "constant_over_measured": TRACKING_MB / measured if measured > 0 else None,
    }
    res.update(results.figures({"tracking_mb": measured}))
    results.finish("tracking_memory", res, args.save, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
