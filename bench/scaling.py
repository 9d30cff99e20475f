"""Scaling benchmark: training throughput with 1 and 2 DistributedDataParallel processes on this
machine, launched by the real `torchrun`. The last stdout line is one JSON object; progress lines
go to stderr.

- samples_per_s_1 / samples_per_s_2: training samples per second over all processes, the median
  of the telemetry windows after the first 20 % of a run (start-up, process-group set-up and
  warm-up left out), the median over --repeats runs of each arm in ABBA order (the arms see the
  same machine noise). Each process trains train.batch_size rows a micro-batch, so 2 processes
  train twice the rows a step.
- ratio: samples_per_s_2 / samples_per_s_1. threads_per_process_1 / _2 say how the cores were
  shared: by default every arm uses all cores (1 x N threads against 2 x N/2), so on a 2-core
  machine the ratio shows DDP's overhead (gradient all-reduce over gloo, the agreed skip flags,
  the loss all-reduce), not a speedup. With --threads T both arms use T threads a process.
- device: cpu (gloo); --device cuda runs nccl with one GPU a process where there are two.

figure: ratio, or null where it cannot be trusted: a ratio across processes is wall time against
wall time (CPU seconds would hide what the processes wait for each other), so it holds only when
the arms had the cores they use to themselves and the probes saw a quiet machine; else
`unreliable` says why (bench/clock.py). No goal: a 2-core machine cannot show a speedup. --save
also writes bench/results/scaling.json. An error exits non-zero.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench import clock, results
from bench.workloads import synthetic
from pipeline.core import distributed
from pipeline.core.config import load_config
from pipeline.core.paths import REPO_ROOT
from pipeline.train.loop import train_model

say = functools.partial(results.say, "scaling")


def worker(out: str, preset: str, steps: int, threads: int, device: str) -> None:
    """One rank (under torchrun): `steps` optimizer steps of `preset` on synthetic data; rank 0
    writes the arm's figures to `out`."""
    place = distributed.from_env()
    overrides = [
        f"preset={preset}",
        f"train.device={device}",
        "train.checkpoint_every=0",
        "train.epochs=1",
        f"train.threads={threads}",
        "train.log_every=5",
    ]
    cfg = load_config(overrides)
    x, y = synthetic(steps * cfg.train.batch_size * cfg.train.grad_accum * place.world_size)
    with distributed.process_group(torch.device(device)) as place:
        result = train_model(cfg, x, y, progress=False, place=place)
    if place.is_main:
        rows = result.rows[len(result.rows) // 5 :]
        figures = {
            "samples_per_s": float(np.median([r["perf/samples_per_s"] for r in rows])),
            "step_ms": float(np.median([r["perf/step_ms"] for r in rows])),
            "steps": result.summary["train/steps"],
            "processes": place.world_size,
            "threads_per_process": distributed.threads_per_process(threads, place),
            "backend": place.backend or "none",
        }
        Path(out).write_text(json.dumps(figures))


def run_arm(nproc: int, preset: str, steps: int, threads: int, device: str) -> dict:
    torchrun = Path(sys.executable).parent / "torchrun"
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        out = Path(tmp) / "arm.json"
        cmd = [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "bench.scaling",
            "--worker",
            str(out),
            "--preset",
            preset,
            "--steps",
            str(steps),
            "--threads",
            str(threads),
            "--device",
            device,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env.pop("OMP_NUM_THREADS", None)  # torchrun would pin it to 1; train.threads decides here
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(
                f"[bench.scaling] {nproc}-process arm failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        figures = json.loads(out.read_text())
    figures["launch_to_exit_s"] = time.perf_counter() - t0
    say(
        f"{nproc} process(es) x {figures['threads_per_process']} thread(s): {figures['samples_per_s']:.0f} "
        f"samples/s, {figures['step_ms']:.1f} ms/step ({figures['launch_to_exit_s']:.1f} s with start-up)"
    )
    return figures


def main(argv=None) -> dict:
    ap = results.parser("scaling", __doc__)
    ap.add_argument("--preset", default="default", help="the model and batch to train (default: default)")
    ap.add_argument(
        "--steps",
        type=int,
        default=120,
        help="optimizer steps per run (default 120, the first 20 %% not counted: a short run, as the "
        "figure holds only on a quiet machine anyway)",
    )
    ap.add_argument("--repeats", type=int, default=2, help="ABBA repeats of the two arms (default 2)")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads a process (default 0: the machine's cores shared out among the processes)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU a process)")
    ap.add_argument("--quick", action="store_true", help="a fast smoke check of the benchmark itself")
    results.add_save_flag(ap)
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)  # one rank, started by torchrun
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.preset, args.steps, args.threads, args.device)
        return {}
    if args.quick:
        args.preset, args.steps, args.repeats = "smoke", 30, 1
    t0 = time.perf_counter()
    from bench.probe import Probe, machine, normaliser

    # Probes (bench/probe.py) in this process, which waits while an arm runs: 3 before and 3 after
    # each arm. samples_per_s_*_probe_normalised puts each arm at the machine's median speed.
    probe = Probe()
    arms: dict[int, list[dict]] = {1: [], 2: []}
    for rep in range(args.repeats):
        for n in (1, 2) if rep % 2 == 0 else (2, 1):
            around = probe.take(3)
            arms[n].append(run_arm(n, args.preset, args.steps, args.threads, args.device))
            arms[n][-1]["probes"] = around + probe.take(3)
    med = {n: float(np.median([a["samples_per_s"] for a in runs])) for n, runs in arms.items()}
    reference = probe.median()
    # A run on a slow (busy) machine made fewer samples/s: bring it to the reference speed.
    norm = {
        n: float(np.median([a["samples_per_s"] / normaliser(a["probes"], reference) for a in runs]))
        for n, runs in arms.items()
    }
    res = {
        "device": args.device,
        "torch": torch.__version__,
        "preset": args.preset,
        "steps": args.steps,
        "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "samples_per_s_1": med[1],
        "samples_per_s_2": med[2],
        "ratio": med[2] / med[1],
        "threads_per_process_1": arms[1][0]["threads_per_process"],
        "threads_per_process_2": arms[2][0]["threads_per_process"],
        "backend_2": arms[2][0]["backend"],
        "step_ms_1": float(np.median([a["step_ms"] for a in arms[1]])),
        "step_ms_2": float(np.median([a["step_ms"] for a in arms[2]])),
        "launch_to_exit_s_1": float(np.median([a["launch_to_exit_s"] for a in arms[1]])),
        "launch_to_exit_s_2": float(np.median([a["launch_to_exit_s"] for a in arms[2]])),
        "samples_per_s_1_probe_normalised": norm[1],
        "samples_per_s_2_probe_normalised": norm[2],
        "ratio_probe_normalised": norm[2] / norm[1],
        **machine(probe),
        "bench_seconds": time.perf_counter() - t0,
    }
    needs = 2 * res["threads_per_process_2"]
    res.update(results.figures({"ratio": res["ratio"]}, {"ratio": clock.wall_ratio_unreliable(res.get("busy"), needs)}))
    res["figure"] = res["figures"]["ratio"]
    return results.finish("scaling", res, args.save, argv)


if __name__ == "__main__":
    main()
