"""The fault matrix: proof that the stability report diagnoses each failure mode from evidence.

Runs the whole smoke pipeline (`dvc exp run`: embed -> train -> evaluate -> report) in a scratch
copy of the project, once clean and once per fault preset, plus the prototype's fp16 settings, and
compares each run's report with what its fault must trip:

    python -m tools.fault_matrix [--out reports/fault_matrix] [--case smoke:leak ...]

Prints one line per run (verdict, failed checks, the evidence figure that points at the fault),
writes each run's stability.md/.html and a summary.json under --out, and exits 1 when any run's
report disagrees with its expectation. The user's workspace, its outputs and MLflow store are not
touched: the runs happen in the copy.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from pipeline.core.paths import REPO_ROOT, REPORTS_DIR
from pipeline.report.checks import WALL_CLOCK_CHECKS


@dataclass(frozen=True)
class Case:
    preset: str
    fault: str
    # Exactly these checks must fail (None: only the verdict is asserted), apart from may_fail.
    fails: tuple[str, ...] | None
    verdict: str
    # (description, predicate on reports/stability_evidence.json): the evidence points at the fault.
    evidence: tuple[tuple[str, Callable[[dict], bool]], ...] = field(default=())
    overrides: tuple[str, ...] = ()  # more `-S key=value` for dvc exp run
    diverges: bool = False  # the train stage must stop (TrainingDiverged) and still write the report
    label: str = ""  # tells apart two cases of one preset and fault
    # Checks that may fail as well, as consequences of the fault rather than its signature (a x100
    # learning rate wrecks the model, so the learning check may fail after the loss spike).
    may_fail: tuple[str, ...] = ()
    # Checks that must warn: a fault whose diagnosis is a warning (a loss regression the run
    # recovered from), which `fails` cannot say.
    warns: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.preset}:{self.fault}" + (f":{self.label}" if self.label else "")


# The report's full evidence, time and memory included (metrics/stability.json leaves those out:
# it is a DVC metric and must be the same bits on every run).
EVIDENCE = "reports/stability_evidence.json"
REPORT_FILES = ("reports/stability.md", "reports/stability.html", "metrics/stability.json", EVIDENCE)
FAULT_STEP = 15  # conf/fault/*.yaml
# A wall-clock check failing where its case does not expect it is reported under "noise", not as
# a problem: the matrix proves diagnoses, not the machine's quiet (see WALL_CLOCK_CHECKS).
LEAK_MB = 8.0  # conf/fault/leak.yaml
SYNC_READS = 40  # conf/fault/sync_bound.yaml: host reads added per step (factor)


@functools.cache
def _has_cuda() -> bool:
    """Does this machine train on CUDA (the smoke preset's train.device is auto)? Only then are a
    run's device figures measured rather than the sync_bound fault's synthetic ones."""
    import torch

    return torch.cuda.is_available()


def nonfinite_at_fault_step(count: int) -> tuple[tuple[str, Callable[[dict], bool]], ...]:
    """Evidence: the first non-finite step is the fault's, and there were `count` of them."""
    return (
        (f"nonfinite.first_step == {FAULT_STEP}", lambda m: m["nonfinite"]["first_step"] == FAULT_STEP),
        (f"nonfinite.count == {count}", lambda m: m["nonfinite"]["count"] == count),
    )


SPIKE_OVER_FAIL_FACTOR = (
    "loss_spikes.max_ratio >= fail factor",
    lambda m: m["loss_spikes"]["max_ratio"] >= m["loss_spikes"]["fail_factor"],
)


def _near(value, target: float, rel: float) -> bool:
    return isinstance(value, (int, float)) and abs(value - target) <= rel * abs(target)


CASES: tuple[Case, ...] = (
    # Clean. Without a GPU there are no device figures: device_utilisation does not apply (n/a,
    # which needs the trainer to log perf/gpu_busy as NaN there, not leave the column out).
    Case(
        "smoke",
        "none",
        (),
        "stable",
        (
            (
                "device_utilisation n/a on a machine without a GPU",
                lambda m: _has_cuda() or m["device_utilisation"]["status"] == "n/a",
            ),
        ),
    ),
    Case("smoke", "nan_loss", ("nonfinite",), "unstable", nonfinite_at_fault_step(1)),
    Case("smoke", "inf_grad", ("nonfinite",), "unstable", nonfinite_at_fault_step(1)),
    Case(
        "smoke",
        "loss_spike",
        ("loss_spikes",),
        "unstable",
        (
            (f"loss_spikes.first_step == {FAULT_STEP}", lambda m: m["loss_spikes"]["first_step"] == FAULT_STEP),
            (f"loss_spikes.max_ratio_step == {FAULT_STEP}", lambda m: m["loss_spikes"]["max_ratio_step"] == FAULT_STEP),
            SPIKE_OVER_FAIL_FACTOR,
        ),
    ),
    # The LR is x100 for steps 15-19; the loss jumps on the steps after the first bad update. The
    # updates of those steps can also trip grad_norm and leave a model worse than the baselines
    # (learning): consequences, allowed but not required. So can they wreck it for good: the smoke
    # model's loss went from 0.65 to 2.0-2.3 and stayed there to the end, a regression that never
    # recovered (loss_regression fails, rightly; allowed, as it depends on how the model breaks).
    Case(
        "smoke",
        "lr_spike",
        ("loss_spikes",),
        "unstable",
        (
            (
                f"{FAULT_STEP} < loss_spikes.first_step <= {FAULT_STEP + 6}",
                lambda m: FAULT_STEP < m["loss_spikes"]["first_step"] <= FAULT_STEP + 6,
            ),
            SPIKE_OVER_FAIL_FACTOR,
        ),
        may_fail=("grad_norm", "learning", "loss_regression"),
    ),
    # The LR x60 for steps 15-22: the loss climbs and stays up while it is high, then comes back, so
    # loss_regression warns (recovered) and nothing fails (loss_spikes may warn: a milder, recovered
    # spike). Six epochs: the schedule's LR at steps 15-22 is then still high enough for x60 to be a
    # real jump, and there are steps left at a sane LR for the loss to come back. The evidence asks
    # for the start within 6 steps of the fault and more than twice report.regression_rise at the
    # peak (what this run gave: loss_regression in reports/fault_matrix/smoke-lr_jump/stability.json).
    Case(
        "smoke",
        "lr_jump",
        (),
        "stable",
        (
            (
                f"{FAULT_STEP} < loss_regression.start_step <= {FAULT_STEP + 6}",
                lambda m: FAULT_STEP < m["loss_regression"]["start_step"] <= FAULT_STEP + 6,
            ),
            ("loss_regression.recovered", lambda m: m["loss_regression"]["recovered"] is True),
            (
                "loss_regression.peak_rise > 2 x limit_rise",
                lambda m: m["loss_regression"]["peak_rise"] > 2 * m["loss_regression"]["limit_rise"],
            ),
        ),
        overrides=("train.epochs=6",),
        warns=("loss_regression",),
    ),
    Case(
        "smoke",
        "leak",
        ("memory_growth",),
        "unstable",
        (
            (
                f"memory slope within 25 % of {LEAK_MB:g} MB per step",
                lambda m: _near(m["memory_growth"]["slope_mb_per_1k_steps"], 1000 * LEAK_MB, 0.25),
            ),
        ),
    ),
    # 40 host reads added to every step from step 1: device_utilisation fails and names the syncs.
    # On a machine without a GPU the trainer fills in a sync-bound GPU's figures (busy 5 % of the
    # step), marked synthetic, and the report says so; the host syncs are counted either way. The
    # reads run from step 1, so early and steady steps carry them alike (no step-time trend).
    Case(
        "smoke",
        "sync_bound",
        ("device_utilisation",),
        "unstable",
        (
            ("device_utilisation.sync_bound (a named cause)", lambda m: m["device_utilisation"]["sync_bound"] is True),
            (
                f"device_utilisation.host_syncs_per_step >= {SYNC_READS}",
                lambda m: m["device_utilisation"]["host_syncs_per_step"] >= SYNC_READS,
            ),
            (
                "device_utilisation.synthetic exactly when the machine has no GPU",
                lambda m: m["device_utilisation"]["synthetic"] is not _has_cuda(),
            ),
        ),
    ),
    # The prototype's settings: fp16, GradScaler 2**16 / 2.0 / 100, LR 0.3, no clipping (blows up)...
    Case(
        "fp16_unstable",
        "none",
        None,
        "unstable",
        (
            ("scaler fails", lambda m: m["scaler"]["status"] == "fail"),
            ("scaler.backoffs >= 3", lambda m: m["scaler"]["backoffs"] >= 3),
        ),
    ),
    # ...and the prototype's fix: 2**10 / 1.5 / 200, LR 3e-3, clipping at 1.0.
    Case("fp16_fixed", "none", (), "stable", (("scaler.backoffs == 0", lambda m: m["scaler"]["backoffs"] == 0),)),
    # NaN on every step from 15: the run stops after 5 skips in a row; the train stage fails but
    # the report is written from the partial run (no evaluation: learning is skipped).
    Case(
        "smoke",
        "nan_loss",
        ("nonfinite",),
        "unstable",
        (*nonfinite_at_fault_step(5), ("learning skipped", lambda m: m["learning"]["status"] == "skip")),
        overrides=("fault.steps=100", "train.max_consecutive_skips=5"),
        diverges=True,
        label="diverged",
    ),
)


def project_copy(dest: Path, src: Path = REPO_ROOT) -> Path:
    """What `git clone` would give, plus uncommitted work, as a fresh one-commit repository:
    tracked and untracked-but-not-ignored files, no outputs, no store."""
    listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    files = subprocess.run(listing, cwd=src, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)
    env = clean_env()
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=dest, env=env, check=True, capture_output=True)
    return dest


def clean_env() -> dict[str, str]:
    """The environment a stage needs, without the caller's MLflow/DVC settings (the copy keeps
    its own store): this interpreter's bin first (DVC runs `python -m stages...`), offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
        GIT_AUTHOR_NAME="fault-matrix",
        GIT_AUTHOR_EMAIL="fault-matrix@localhost",
        GIT_COMMITTER_NAME="fault-matrix",
        GIT_COMMITTER_EMAIL="fault-matrix@localhost",
    )
    return env


def exp_run(project: Path, sets: Sequence[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """`dvc exp run -S SET ...` in `project`, its output captured."""
    command = [sys.executable, "-m", "dvc", "exp", "run", *(a for s in sets for a in ("-S", s))]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=timeout)


def judge(case: Case, evidence: dict) -> tuple[str, list[str], list[str], list[str]]:
    """(verdict, failed checks, noise, problems) of one run's report evidence against its case:
    a wall-clock check failing where the case does not expect it is noise, left out of the
    verdict and the failed list."""
    reported = [name for name, c in evidence.items() if isinstance(c, dict) and c.get("status") == "fail"]
    noise = [n for n in reported if n in WALL_CLOCK_CHECKS and n not in (case.fails or ())]
    failed = [n for n in reported if n not in noise]
    verdict = "unstable" if failed else ("stable" if noise else evidence["verdict"])
    problems = []
    if verdict != case.verdict:
        problems.append(f"verdict {verdict}, expected {case.verdict}")
    if case.fails is not None and sorted(set(failed) - set(case.may_fail)) != sorted(case.fails):
        allowed = f" (and may fail {list(case.may_fail)})" if case.may_fail else ""
        problems.append(f"failed {failed or 'none'}, expected {list(case.fails) or 'none'}{allowed}")
    for name in case.warns:
        status = evidence.get(name, {}).get("status") if isinstance(evidence.get(name), dict) else None
        if status != "warn":
            problems.append(f"{name} {status or 'missing'}, expected warn")
    for what, ok in case.evidence:
        try:
            good = bool(ok(evidence))
        except (KeyError, TypeError) as e:
            good, what = False, f"{what} (missing: {e})"
        if not good:
            problems.append(f"evidence: {what}")
    return verdict, failed, noise, problems


def run_case(project: Path, case: Case, out_dir: Path | None = None, timeout: int = 900) -> dict:
    """`dvc exp run -S preset=.. -S fault=..` in the copy; the run's stability metrics, the
    problems found against the expectation, and (with out_dir) its report files copied out."""
    t0 = time.perf_counter()
    sets = [f"preset={case.preset}", f"fault={case.fault}", *case.overrides]
    for stale in REPORT_FILES:
        (project / stale).unlink(missing_ok=True)  # a failed run must not be judged on the last one's report
    proc = exp_run(project, sets, clean_env(), timeout)
    seconds = time.perf_counter() - t0
    log = (proc.stdout + proc.stderr)[-4000:]
    problems = []
    if case.diverges:
        if proc.returncode == 0 or "training diverged" not in proc.stdout + proc.stderr:
            problems.append(f"expected the train stage to stop as diverged (exit {proc.returncode})")
    elif proc.returncode != 0:
        problems.append(f"dvc exp run failed ({proc.returncode})")
    if not (project / EVIDENCE).is_file():
        return {"case": case.name, "seconds": seconds, "problems": problems + ["no report written"], "log": log}
    metrics = json.loads((project / EVIDENCE).read_text())
    verdict, failed, noise, found = judge(case, metrics)
    problems += found
    if out_dir is not None:
        dest = out_dir / case.name.replace(":", "-")
        dest.mkdir(parents=True, exist_ok=True)
        for rel in REPORT_FILES:
            shutil.copy2(project / rel, dest / Path(rel).name)
    verdict_line = next(
        (line for line in (project / "reports/stability.md").read_text().splitlines() if line.startswith("**Verdict")),
        "",
    )
    return {
        "case": case.name,
        "seconds": seconds,
        "verdict": verdict,
        "failed": failed,
        "noise": noise,
        "expected_fails": None if case.fails is None else list(case.fails),
        "verdict_line": verdict_line,
        "problems": problems,
        "metrics": metrics,
        "log": log if problems else "",
    }


def run_matrix(
    project: Path, cases: Sequence[Case] = CASES, out_dir: Path | None = None, echo: Callable[[str], None] | None = None
) -> list[dict]:
    results = []
    for case in cases:
        res = run_case(project, case, out_dir)
        results.append(res)
        if echo:
            status = "ok  " if not res["problems"] else "FAIL"
            notes = (
                [f"~ failed {', '.join(res['noise'])} on this machine's timing (not judged)"]
                if res.get("noise")
                else []
            )
            notes += [f"! {p}" for p in res["problems"]]
            line = f"{status} {case.name:<22} {res['seconds']:5.0f} s  {res.get('verdict_line', '')}"
            echo(line + "".join(f"\n       {n}" for n in notes))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.fault_matrix",
        description="Run the smoke pipeline clean, with each injected fault and with the prototype's fp16 settings, "
        "in a scratch copy of this project, and check that each stability report fails exactly the "
        "check its fault must trip, with evidence at the injected step. Each run is a smoke pipeline.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPORTS_DIR / "fault_matrix",
        help="where each run's stability.md/.html/.json and summary.json go (default: %(default)s)",
    )
    parser.add_argument(
        "--case",
        action="append",
        metavar="PRESET:FAULT",
        help="run only these cases (repeatable), e.g. smoke:leak; default: all of " + ", ".join(c.name for c in CASES),
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch project and print its path")
    args = parser.parse_args(argv)
    known = {c.name: c for c in CASES}
    unknown = [n for n in args.case or () if n not in known]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}: expected PRESET:FAULT among {', '.join(known)}")
    cases = [known[n] for n in args.case] if args.case else list(CASES)
    scratch = Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    try:
        project = project_copy(scratch)
        print(f"fault matrix: {len(cases)} runs of the smoke pipeline in {project}", flush=True)
        results = run_matrix(project, cases, args.out, echo=lambda line: print(line, flush=True))
    finally:
        if args.keep:
            print(f"scratch project kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = [{k: v for k, v in r.items() if k != "metrics"} for r in results]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    bad = [r["case"] for r in results if r["problems"]]
    print(
        f"{len(results) - len(bad)}/{len(results)} runs as expected; reports in {args.out}"
        + (f"; wrong: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
