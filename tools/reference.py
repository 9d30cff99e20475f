"""The smoke run's committed reference, and the check that a smoke run still matches it.

tests/smoke_reference.json holds what `dvc exp run -S preset=smoke` on the shipped data gives:
the training loss at every logged step, the evaluate stage's point metrics, and each shard file's
sha256 (with, for the vector files, two sums that survive a last-bit change). The default suite
runs that experiment once anyway (tests/conftest.py, `smoke_workspace`) and compares it here.

Tolerances, from `./dev reference` runs of the smoke experiment under each setting below (AMD EPYC,
torch 2.13.0); re-run it the same way to check them on another machine:
- Noise that must pass. Against the portable setting on one thread, two threads
  (OMP_NUM_THREADS=2, train.threads=2), the native setting, ATen's scalar kernels
  (ATEN_CPU_CAPABILITY=default) and MKL's own path (MKL_CBWR=AUTO) moved the logged loss and the
  eval metrics only in their last digits (the metrics' rounding), and changed the bits of some of
  the vector files (their sums move by < 1e-6 relative when the values move by their last bits:
  tests/test_smoke_reference.py).
- A change that must fail. AdamW's eps 1e-8 -> 1e-7 (`eps=1e-7` passed to the AdamW built in
  pipeline/train/optimizer.py), a real numerics change of the kind a refactor makes by accident, moved
  the loss by 1.7e-5 relative at the 4th logged step and by up to 2.2e-3 later, and val group
  top-5 by -0.016 (one item).
So the loss and the vector files' sums must agree to 1e-5 relative (well above the noise), the metrics to
1e-4 (a fraction of one test item: any flipped retrieval fails), and text files (Parquet) bit for
bit. A vector file whose sha256 differs but whose sums agree passes, with a note.

Refresh it on purpose, after a change whose effect on the numbers is intended:
    ./dev reference --refresh      (runs the smoke experiment in a copy of the project, ~1 min)
It also writes the run's item table to reference/smoke_items.parquet, what CI's smoke verdict
compares a smoke run with item by item (`./dev verdict`, pipeline/stats/reference_verdict.py).
`./dev reference` alone runs it and prints the comparison.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_path, write_text
from pipeline.core.paths import REPO_ROOT

REFERENCE = REPO_ROOT / "tests" / "smoke_reference.json"
LOSS_RTOL = 1e-5
METRIC_ATOL = 1e-4
VECTOR_RTOL = 1e-5
PREDICTORS = ("model", "identity", "ridge", "nearest", "model_vs_identity", "model_vs_ridge", "model_vs_nearest")
EXACT = ("eval/bank_size", "eval/test/items", "eval/val/items")
REFRESH_HINT = "if the change is intended, refresh the reference: ./dev reference --refresh (and commit it)"


def _headline(key: str) -> bool:
    """eval/<split>/<predictor>/<metric>: a point value, not its CI or p-value (which follow from
    the items and the seeded bootstrap)."""
    parts = key.split("/")
    return len(parts) == 4 and parts[0] == "eval" and parts[2] in PREDICTORS


def _vector_sums(path: Path) -> dict[str, float]:
    """Two sums of a vector file that a change of the last bits leaves within ~1e-7 relative but
    any real change moves: of |x|, and of |x . r| over rows for a fixed random direction r (the
    vectors are unit length, so a plain sum of squares would not move)."""
    x = np.load(path, mmap_mode="r").astype(np.float64)
    r = np.random.default_rng(0).standard_normal(x.shape[1])
    return {"abs_sum": float(np.abs(x).sum()), "projection_abs_sum": float(np.abs(x @ r).sum())}


def collect(root: Path) -> dict:
    """The reference's content, read from a smoke run's workspace at `root`."""
    with open(root / "telemetry/train_steps.csv", newline="") as f:
        loss = [[int(row["step"]), float(row["train/loss"])] for row in csv.DictReader(f)]
    metrics = json.loads((root / "metrics/eval.json").read_text())
    manifest = json.loads((root / "data/shards/manifest.json").read_text())
    shards = {}
    for name, info in sorted(manifest["files"].items()):
        shards[name] = {"sha256": info["sha256"]}
        if name.endswith(".npy"):
            shards[name].update(_vector_sums(root / "data/shards" / name))
    return {
        "loss": loss,
        "eval": {k: v for k, v in sorted(metrics.items()) if _headline(k) or k in EXACT},
        "shards": shards,
    }


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(reference: dict, run: dict) -> tuple[list[str], list[str]]:
    """(problems, notes): every difference beyond the tolerances, and the bit-level differences
    within them."""
    problems, notes = [], []
    ref_steps, run_steps = dict(map(tuple, reference["loss"])), dict(map(tuple, run["loss"]))
    if sorted(ref_steps) != sorted(run_steps):
        problems.append(f"logged steps differ: reference {sorted(ref_steps)}, run {sorted(run_steps)}")
    off = [
        (s, run_steps[s], v)
        for s, v in sorted(ref_steps.items())
        if s in run_steps and not (_rel(run_steps[s], v) <= LOSS_RTOL)
    ]
    for step, got, want in off[:3]:
        problems.append(
            f"train/loss at step {step}: {got:.9g}, reference {want:.9g} "
            f"(relative difference {_rel(got, want):.1e} > {LOSS_RTOL:g})"
        )
    if len(off) > 3:
        problems.append(f"... and at {len(off) - 3} more of the {len(ref_steps)} logged steps")
    for key, want in reference["eval"].items():
        got = run["eval"].get(key)
        if got is None:
            problems.append(f"{key}: missing from the run's metrics/eval.json (reference {want})")
        elif key in EXACT and got != want:
            problems.append(f"{key}: {got}, reference {want}")
        elif not (abs(got - want) <= METRIC_ATOL) and not (math.isnan(got) and math.isnan(want)):
            problems.append(
                f"{key}: {got:.6f}, reference {want:.6f} (difference {got - want:+.2e}, tolerance {METRIC_ATOL:g})"
            )
    for name, want in reference["shards"].items():
        got = run["shards"].get(name)
        if got is None:
            problems.append(f"shard file {name}: missing from the run's manifest")
        elif got["sha256"] == want["sha256"]:
            continue
        elif "abs_sum" not in want:
            problems.append(
                f"shard file {name}: sha256 {got['sha256'][:12]}, reference {want['sha256'][:12]} "
                "(a text file: it must be the same bits)"
            )
        else:
            bad = [k for k in ("abs_sum", "projection_abs_sum") if not (_rel(got[k], want[k]) <= VECTOR_RTOL)]
            if bad:
                problems.append(
                    f"shard file {name}: "
                    + ", ".join(
                        f"{k} {got[k]:.9g}, reference {want[k]:.9g} (relative {_rel(got[k], want[k]):.1e} > "
                        f"{VECTOR_RTOL:g})"
                        for k in bad
                    )
                )
            else:
                notes.append(
                    f"shard file {name}: other bits (sha256 {got['sha256'][:12]}), sums within "
                    f"{VECTOR_RTOL:g}: thread-count or CPU-path noise"
                )
    extra = sorted(set(run["shards"]) - set(reference["shards"]))
    if extra:
        problems.append(f"shard files not in the reference: {', '.join(extra)}")
    return problems, notes


def load() -> dict:
    return json.loads(REFERENCE.read_text())


def write(content: dict, path: Path = REFERENCE) -> None:
    write_text(path, json.dumps(content, indent=1) + "\n")


def reference_env() -> dict[str, str]:
    """The environment the smoke experiment runs in, for the reference and for the test suite's
    `smoke_experiments`: the stages' clean environment less any numerics override of the caller
    (ENERGY_FLOW_NUMERICS, MKL_CBWR, OMP_NUM_THREADS, ...): the reference is the default, portable
    setting."""
    from pipeline.core.numerics import MODE_VAR, PORTABLE
    from tools.fault_matrix import clean_env

    return {k: v for k, v in clean_env().items() if k != MODE_VAR and k not in PORTABLE}


def smoke_run(workdir: Path, items_to: Path | None = None) -> dict:
    """`dvc exp run -S preset=smoke` in a fresh copy of the project (what the test suite runs),
    collected; its item table copied to `items_to` when given."""
    from tools.fault_matrix import exp_run, project_copy

    (workdir / "project").mkdir()
    root = project_copy(workdir / "project")
    proc = exp_run(root, ["preset=smoke"], reference_env(), 1200)
    if proc.returncode != 0:
        raise SystemExit(
            f"the smoke experiment failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    if items_to is not None:
        with atomic_path(items_to) as tmp:
            shutil.copyfile(root / "reports" / "eval_items.parquet", tmp)  # the evaluate stage's output
    return collect(root)


def main(argv: list[str] | None = None) -> int:
    from pipeline.stats.reference_verdict import REFERENCE_ITEMS  # (the statistics: only when run)

    parser = argparse.ArgumentParser(
        prog="./dev reference",
        description="Run the smoke experiment in a copy of the project and compare it with the committed "
        f"reference ({REFERENCE.relative_to(REPO_ROOT)}): loss at every logged step "
        f"(relative {LOSS_RTOL:g}), eval point metrics ({METRIC_ATOL:g}), shard files (sha256; "
        f"vector files' sums at {VECTOR_RTOL:g}). Exit 1 when they differ.",
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="write the run as the new reference (after a change whose effect is intended), "
        f"printing what changed against the old one; its item table goes to {REFERENCE_ITEMS.relative_to(REPO_ROOT)}",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="smoke-reference-") as tmp:
        run = smoke_run(Path(tmp), REFERENCE_ITEMS if args.refresh else None)
    old = load() if REFERENCE.is_file() else None
    problems, notes = compare(old, run) if old else ([f"no reference at {REFERENCE}"], [])
    for line in notes:
        print(f"note: {line}")
    if args.refresh:
        write(run)
        print("\n".join(f"changed: {p}" for p in problems) or "unchanged within the tolerances")
        print(f"wrote {REFERENCE} and {REFERENCE_ITEMS}: commit them")
        return 0
    if problems:
        print("\n".join(problems) + f"\n{REFRESH_HINT}")
        return 1
    print(
        f"the smoke run matches {REFERENCE.name} ({len(run['loss'])} logged steps, {len(run['eval'])} metrics, "
        f"{len(run['shards'])} shard files)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
