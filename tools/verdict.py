"""CI's verdict on a smoke run: is it worse than the committed smoke reference?

    ./dev verdict                 # the workspace's smoke run (after dvc exp run -S preset=smoke)
    ./dev verdict NAME            # a DVC experiment, git revision, MLflow run id or item-table file
    ./dev verdict --smoke         # first run the smoke experiment (dvc exp run --temp), then judge it
    python -m tools.verdict ...   # the same, with the environment already active

The run is compared with the committed smoke run (reference/smoke_items.parquet, written with
tests/smoke_reference.json by `./dev reference --refresh`) by the rule `./dev compare` uses: a
paired bootstrap over the test items plus the training seeds' luck from
reference/seed_variance/smoke.json. It prints the verdict table per metric (reference, run,
difference, interval, outcome) and writes it as Markdown: appended to $GITHUB_STEP_SUMMARY when
that is set (GitHub Actions' job summary), else to reports/smoke_verdict.md.

Exit 0: pass (no gating metric worse; cosine and mse gate, pipeline/stats/reference_verdict.py
says why). Exit 1: a gating metric is worse than the reference: a regression. Exit 2: the run
cannot be judged (not a smoke run, other data, a missing or stale reference): the message says
what to do. docs/ci.md has the whole story.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats import reference_verdict as rv
from pipeline.stats.item_sources import WORKSPACE, load_side
from tools.options import add_bootstrap_options, fill_bootstrap_defaults


def run_smoke() -> str:
    """`dvc exp run --temp -S preset=smoke` under a fresh name: the workspace is left as it was
    (CI may run the tests after it), the experiment is kept in git refs and the store."""
    name = time.strftime("smoke-verdict-%Y%m%d-%H%M%S", time.gmtime())
    cmd = [sys.executable, "-m", "dvc", "exp", "run", "--temp", "-n", name, "-S", f"preset={rv.PRESET}"]
    print(f"verdict: running {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=sys.stderr)  # (stdout holds the verdict alone: --json)
    if proc.returncode != 0:
        raise rv.VerdictError(f"the smoke experiment failed (exit {proc.returncode}, output above): nothing to judge")
    return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./dev verdict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "run",
        nargs="?",
        default=WORKSPACE,
        help="the smoke run to judge (default: workspace); any name ./dev compare takes",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="run the smoke experiment first (dvc exp run --temp) and judge it"
    )
    ap.add_argument(
        "--reference",
        default=str(rv.REFERENCE_ITEMS),
        metavar="FILE",
        help=f"the reference run's item table (default {rv.REFERENCE_ITEMS.relative_to(REPO_ROOT)})",
    )
    add_bootstrap_options(ap)
    ap.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    args = ap.parse_args(argv)
    if args.smoke and args.run != WORKSPACE:
        ap.error("--smoke judges the experiment it runs: give no RUN with it")
    try:
        fill_bootstrap_defaults(args)
        name = run_smoke() if args.smoke else args.run
        if not Path(args.reference).is_file():
            raise rv.VerdictError(
                f"{args.reference}: no reference item table; write it with {rv.REFRESH} (runs the smoke experiment in "
                "a copy of the project) and commit it"
            )
        verdict = rv.judge(load_side(name), load_side(args.reference), resamples=args.resamples, seed=args.seed)
    except PipelineError as e:
        where = rv.publish(f"### :x: Smoke verdict\n\n**CANNOT JUDGE**: {e}\n")
        print(f"verdict: {e}\n(written to {where})", file=sys.stderr)
        return 2
    where = rv.publish(rv.render_markdown(verdict))
    print(json.dumps(verdict, indent=2, allow_nan=False) if args.json else rv.render_text(verdict))
    print(f"verdict: the table is in {where}", file=sys.stderr)
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
