"""`./dev ask`'s time to its answer: one question asked by `python -m tools.ask` in a fresh process,
from the start of the interpreter to its exit, as a user runs it. The last stdout line is one
JSON object; progress lines go to stderr.

Measured per run (--runs, one after the other): the process's CPU seconds (user + system, its
rusage), the headline figure, since a busy machine delays a run but does not add to its work;
and its wall seconds, context only (on a shared machine it says as much about the neighbours).
One more run under `python -X importtime` gives what the imports cost, cumulatively, for the
packages that make most of it (torch, transformers, sentence-transformers, scikit-learn, pandas,
MLflow; 0 where the run did not import one): the tracing inflates them, so they are shares of
the run, not seconds to add up. `path` says which way the model was loaded: "local" (the model's
directory, without MLflow: pipeline/serve/local_model.py) or "mlflow".

The model: --model, as ./dev ask takes it; by default the last train run's (runs/train.json),
which ./dev ask loads from the directory the evaluate stage recorded when its code is this
checkout's. Needs a trained and evaluated model (./dev repro); no GPU."""

from __future__ import annotations

import argparse
import functools
import os
import re
import resource
import statistics
import subprocess
import sys
import time

from bench import results
from pipeline.core.paths import REPO_ROOT

QUESTION = "Who wrote 1984?"
PACKAGES = ("torch", "transformers", "sentence_transformers", "sklearn", "pandas", "mlflow")
IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)")


say = functools.partial(results.say, "ask_start")


def ask_once(args: list[str], env: dict, python_flags: tuple[str, ...] = ()) -> dict:
    """One `python -m tools.ask` run: its CPU and wall seconds, stdout and stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, *python_flags, "-m", "tools.ask", *args]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or f"Q: {QUESTION}" not in proc.stdout:
        raise SystemExit(f"./dev ask failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "stderr": proc.stderr}


def import_seconds(trace: str) -> dict[str, float]:
    """Cumulative seconds of each of PACKAGES where `-X importtime`'s trace first imports it."""
    found: dict[str, float] = {}
    for line in trace.splitlines():
        m = IMPORT_LINE.match(line)
        if m and m.group(3) in PACKAGES and m.group(3) not in found:
            found[m.group(3)] = int(m.group(1)) / 1e6
    return {p: round(found.get(p, 0.0), 3) for p in PACKAGES}


def measure(model: str | None, runs: int) -> dict:
    args = [QUESTION, "-k", "3"] + (["--model", model] if model else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    spans = []
    for i in range(runs):
        spans.append(ask_once(args, env))
        say(f"run {i + 1}/{runs}: {spans[-1]['cpu_s']:.2f} s CPU, {spans[-1]['wall_s']:.2f} s wall")
    traced = ask_once(args, env, ("-X", "importtime"))
    loading = [line for line in spans[0]["stderr"].splitlines() if line.startswith("[ask] loading")]
    cpu, wall = [s["cpu_s"] for s in spans], [s["wall_s"] for s in spans]
    return {
        "question": QUESTION,
        "runs": runs,
        "path": "mlflow" if any("through MLflow" in line for line in loading) else "local",
        "loading": loading[0] if loading else None,
        "cpu_s_runs": [round(c, 3) for c in cpu],
        "wall_s_runs": [round(w, 3) for w in wall],
        "cpu_s": round(statistics.median(cpu), 3),
        "context": {"wall_s": round(statistics.median(wall), 3), "load_avg_1min": round(os.getloadavg()[0], 2)},
        "imports_traced_s": import_seconds(traced["stderr"]),
        **results.figures({"cpu_s": round(statistics.median(cpu), 3)}),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.ask_start", description=__doc__)
    ap.add_argument("--model", metavar="URI", help="as ./dev ask takes it (default: the last train run's model)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs (default 5; their median is the figure)")
    ap.add_argument("--quick", action="store_true", help="2 runs: a check that the bench works")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: expected 1 or more")
    res = measure(args.model, 2 if args.quick else args.runs)
    return results.finish("ask_start", res, args.save, argv)


if __name__ == "__main__":
    main()
