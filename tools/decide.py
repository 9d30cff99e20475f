"""Did a change help? Train seed pairs of the baseline and of the change until the answer is clear.

    ./dev decide -S train.lr=1e-3 [-S KEY=VALUE ...] [--preset default] [--baseline-set KEY=VALUE ...]
    ./dev decide --against mlp [-S KEY=VALUE ...]   # the model (with the changes) against its MLP baseline
                 [--metric METRIC] [--margin VALUE] [--max-seeds 5] [--first-seed 0] [-j 2]
                 [--name NAME] [--keep-unstable] [--baseline REV] [--resamples N] [--seed S] [--json]

A is the preset as conf/ composes it (with --baseline-set overrides, if any); B is A with the -S
changes. With --baseline REV, A is trained from the code of git revision REV (a git worktree of it:
pipeline/stats/baseline_rev.py) and B from the workspace. With --against mlp, A is the MLP baseline
of B's own runs (pipeline/baselines/) and only B is trained. Each round queues one seed of each arm
through DVC's experiment queue (`dvc exp run --queue`, `dvc queue start -j N`;
pipeline/stats/replicates.py), the same seed for both
(`run.seed` = first seed + round), waits for them, and looks at the difference in --metric with an
interval that covers the test items and the training seeds (pipeline/stats/decision.py). It stops
at the first clear answer:

- better / worse: the interval excludes 0;
- equivalent: the interval lies inside +-margin (default: the preset's, pipeline/stats/defaults.py);
- inconclusive: --max-seeds rounds and neither (with an estimate of the seeds it would take).

Looking after every round and stopping early must not make a false "better" likelier: each look's
interval is taken at its own level from an alpha-spending plan over the planned looks
(decision.alpha_spending: a little more of it at the early looks; the looks' error rates add up to
5 %), so the chance that any look errs is at most 5 %. The first look comes after round 1 when
the preset has a committed seed-variance reference (reference/seed_variance/<preset>.json) for
the data the runs are scored on, else after round 2 (each arm's own two seeds give the first
estimate of the seed spread).

A change that leaves the arm as it is (`-S run.seed=100`, `-S train.log_every=10`: pipeline/core/
arm.py) is an A/A comparison: B's seeds then start at 1000 (or the -S run.seed given), so that the
two arms are other runs of one config, and the answer should be "equivalent" or "inconclusive".

Experiments are named `rep-<arm>-s<seed>`: one already made from this commit (an earlier decide,
`./dev seeds`) is read back instead of trained again. Progress goes to the terminal; the result is
printed as a table, and written as reports/decisions/<name>.json and .html (both arms' loss
curves with their seed spread, each metric's interval, the looks, the items that flipped).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.decision_log import DECISIONS_DIR, name_taken
from pipeline.stats.defaults import below_floor, preset_defaults
from pipeline.stats.metrics import METRICS
from pipeline.stats.sequential import NAME_CHARS, run, say
from tools.compare import metric_row, table_head
from tools.options import add_bootstrap_options, add_overrides, fill_bootstrap_defaults

DEFAULT_MAX_SEEDS = 5


def render(result: dict) -> str:
    m = result["metric"]
    d = result["decision"]
    second = result.get("first_decision") or {}
    lines = []
    if result.get("exploratory"):
        lines.append(
            f"EXPLORATORY (second look): these runs were decided on {second.get('metric')} first "
            f"(decision {second.get('name')!r}); what follows under {m} is not a decision."
        )
    lines += [
        f"Decision on {m}: B is {result['outcome'].upper()}"
        + ("" if result["outcome"] != "inconclusive" else " (no clear answer)")
        + f" after {result['rounds']} seed pair(s).",
        f"A = {_arm_text(result['a'])}; B = {_arm_text(result['b'])}.",
        f"{result['items']} shared test items; intervals cover: {result['covers']}.",
        f"Decided metric {m} ({result.get('metric_chosen', 'given')}); margin +-{result['margin']:g} "
        f"({result.get('margin_why', 'given')}).",
        *(
            f"Left out: {x['experiment']} (arm {x['arm']}, seed {x['seed']}): stability check failed "
            f"({', '.join(x['failed_checks'])})" + (" (kept: --keep-unstable)" if x["kept"] else "")
            for x in result.get("left_out", [])
        ),
        *(f"Note: {n}" for n in result.get("notes", [])),
        f"Looks: {len(result['looks'])}, each at its own level from a 5 % alpha-spending plan over "
        f"{len(result['method']['levels'])} planned looks; the last at {d['level'] * 100:.2f} %.",
        "",
        table_head("interval"),
        *(metric_row(k, r, r["outcome"] + ("  <- decides" if k == m else "")) for k, r in result["metrics"].items()),
        f"(Only {m} decides; the other metrics are shown at the same level, for reading.)",
        "",
        d["verdict"],
    ]
    return "\n".join(lines)


def _arm_text(side: dict) -> str:
    name = side["arm"]["name"] if side["arm"] else "?"
    return f"{name} (seeds {', '.join(map(str, side['seeds']))})"


def write(result: dict, directory: Path = DECISIONS_DIR) -> tuple[Path, Path]:
    from pipeline.core.atomic import write_json, write_text
    from pipeline.report.decision_page import render_page

    json_path, html_path = directory / f"{result['name']}.json", directory / f"{result['name']}.html"
    write_json(json_path, result)
    write_text(html_path, render_page(result))
    return json_path, html_path


def fill_defaults(args) -> None:
    """The preset's decided metric and margin (pipeline/stats/defaults.py) where not given, with
    how they were chosen; a margin given below the preset's floors is kept and said to be below."""
    from pipeline.stats.seed_variance import load_references

    refs = load_references()
    chosen = preset_defaults(args.preset, refs)
    args.metric_chosen = "given" if args.metric else f"the {args.preset} preset's default: {chosen.metric_why}"
    args.metric = args.metric or chosen.metric
    args.margin_why = "given" if args.margin is not None else chosen.why[args.metric]
    args.margin = chosen.margins[args.metric] if args.margin is None else args.margin
    ref = next((r for r in refs if r.preset == args.preset), None)
    low = below_floor(ref, args.metric, args.margin)
    args.notes = [low] if low else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./dev decide", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_overrides(
        ap, "-S", "--set", dest="sets", help="the change B makes to A (Hydra syntax, as dvc exp run -S); repeatable"
    )
    ap.add_argument("--preset", default="default", help="the preset both arms start from (default: default)")
    add_overrides(ap, "--baseline-set", dest="baseline_sets", help="an override of A (and so of B); repeatable")
    ap.add_argument(
        "--baseline",
        dest="baseline_rev",
        metavar="REV",
        help="train A from the code of git revision REV (a git worktree of it, its own DVC queue) and B from the "
        "workspace: did my code change help? -S is then optional",
    )
    ap.add_argument(
        "--against",
        choices=("mlp",),
        help="decide B (the preset, with -S changes if any) against its MLP baseline: only B is trained, a seed a "
        "round; A is the MLP of the model's size its runs hold (baseline.mlp_seeds replicates each)",
    )
    ap.add_argument(
        "--metric",
        choices=METRICS,
        help="the metric that decides (default: the preset's, pipeline/stats/defaults.py: group_top1 on default, "
        "cosine on smoke where group top-1 sits at its floor)",
    )
    ap.add_argument(
        "--margin",
        type=float,
        help="the equivalence margin of the metric (default: the preset's, from its seed-variance reference and test "
        "set: pipeline/stats/defaults.py)",
    )
    ap.add_argument(
        "--max-seeds", type=int, default=DEFAULT_MAX_SEEDS, help=f"seed pairs at most (default {DEFAULT_MAX_SEEDS})"
    )
    ap.add_argument("--first-seed", type=int, default=0, help="A's first seed (default 0)")
    ap.add_argument(
        "-j", "--jobs", type=int, default=2, help="DVC queue workers (default 2: a round's two arms at once)"
    )
    ap.add_argument(
        "--name",
        help="the decision's name (its files in reports/decisions/; default from the change, made unique: a page "
        "never overwrites another)",
    )
    ap.add_argument(
        "--keep-unstable",
        action="store_true",
        help="use replicates whose stability check failed (default: named and left out)",
    )
    add_bootstrap_options(ap)
    ap.add_argument("--show", type=int, default=10, help="flipped items listed each way (default 10)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument("--no-log", action="store_true", help="do not record the decision in MLflow")
    args = ap.parse_args(argv)
    if not args.sets and not args.baseline_rev and not args.against:
        ap.error("give the change to decide on: -S KEY=VALUE (e.g. -S train.lr=1e-3), --baseline REV, or --against mlp")
    if args.max_seeds < 1 or args.jobs < 1:
        ap.error("--max-seeds and -j must be >= 1")
    if args.margin is not None and args.margin < 0:
        ap.error(f"--margin {args.margin}: expected a number >= 0")
    if args.name is not None and not re.fullmatch(f"[{NAME_CHARS}]+", args.name):
        ap.error(f"--name {args.name!r}: letters, digits, '-', '_', '.', '=' only (it names files)")
    if args.name is not None and name_taken(DECISIONS_DIR, args.name):
        ap.error(f"--name {args.name!r}: reports/decisions/ already holds a decision of that name; pick another")
    try:
        fill_defaults(args)
        fill_bootstrap_defaults(args)
        result = run(args)
    except PipelineError as e:
        print(f"decide: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("decide: interrupted; the queued experiments were stopped", file=sys.stderr)
        return 130
    json_path, html_path = write(result)
    say(f"wrote {json_path.relative_to(REPO_ROOT)} and {html_path.relative_to(REPO_ROOT)}")
    if not args.no_log:
        from pipeline.tracking.decisions import record_decision

        if line := record_decision(result, "decide", files=(json_path, html_path)):
            say(line)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
