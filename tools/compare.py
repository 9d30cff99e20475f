"""Is B better than A? Two evaluated models, or two sets of replicates, compared item by item with
intervals that cover the luck of the test items and of the training seeds.

    ./dev compare A B [--margin METRIC=VALUE ...] [--show N] [--json]
    ./dev compare A --baseline ridge      # A's model(s) against a baseline scored beside them
    ./dev compare A --baseline mlp        # ... against the MLP of the model's size (its replicates' seeds)
    ./dev compare --sweep NAME [--metric group_top1] [--json]   # rank a sweep's arms (pipeline/stats/sweep.py)
    python -m tools.compare A B           # the same, with the environment already active

A and B each name one run or a set of replicates of one arm (pipeline/stats/item_sources.py): a run id, a
DVC experiment, a git revision (`main`), `workspace`, an item-table file; several of these joined
by commas; a glob of DVC experiment names (`'rep-8cb0c8f0-s*'`); or `arm:KEY`, every evaluated run
of an arm in the MLflow store. Runs of one arm differ only in their seed (pipeline/core/arm.py).

For each metric (cosine, mse, top1, top5, group_top1, group_top5, mrr), over the items both sides
hold (matched by id), it prints A's and B's means, the difference B - A with its 95 % interval,
the probability that B beats A (the share of the interval's draws where it does), and one of four
outcomes (pipeline/stats/decision.py):

- better / worse: the interval excludes 0;
- equivalent: the interval lies inside +-margin (defaults per metric: the sides' preset's, from
  its seed-variance reference and test set, else generic: pipeline/stats/defaults.py; set with
  --margin cosine=0.005);
- inconclusive: neither; with about how many seeds per arm would settle it.

The interval covers the test items (a paired bootstrap) and the training seeds: the seeds'
spread is measured from the replicates of each side that has several, and from the committed
seed-variance reference of the preset (reference/seed_variance/<preset>.json, `./dev seeds`) when
the runs' preset and data match it. With one run per side and no matching reference, training
luck is not covered: the output says so and every outcome is inconclusive, since a difference
inside the seed noise must never read as "better".

Then come the items whose group top-1 flipped (hit by the majority of A's runs and missed by B's,
and the other way), to read what changed. --json prints the same as one JSON object (warnings go
to stderr). Two sides from different test splits are compared over their shared items, with a
warning; with none shared it refuses (exit 2).

Examples:

    ./dev compare main workspace                         # your change against the committed run
    ./dev compare rep-8cb0c8f0-s0 rep-8cb0c8f0-s1        # two seeds of one arm: luck, not a change
    ./dev compare 'rep-8cb0c8f0-s*' 'rep-3e1d95aa-s*'    # 5 seeds each of two arms
    ./dev compare arm:default arm:3e1d95aa --margin group_top1=0.02
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from pipeline.core.errors import PipelineError
from pipeline.stats import sweep
from pipeline.stats.compare import DEFAULT_SHOW, compare
from pipeline.stats.decision import MARGINS
from pipeline.stats.item_sources import TRAINED_BASELINES, Side, baseline_replicates, load_side
from pipeline.stats.metrics import METRICS, format_interval, format_metric
from tools.options import add_bootstrap_options, fill_bootstrap_defaults


def _short(text: str, width: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _side_line(key: str, s: dict) -> str:
    runs = s["runs"]
    arm = f" (arm {s['arm']['name']} [{s['arm']['digest']}])" if s["arm"] else " (arm unknown: no metadata)"
    base = "" if s["predictor"] == "model" else f", baseline {s['predictor']}"
    if len(runs) == 1:
        seed = f", seed {runs[0]['seed']}" if runs[0]["seed"] is not None else ""
        return f"{key} = {s['label']}{arm}: {runs[0]['source']}{seed}{base}; {s['items']} items"
    seeds = ", ".join(str(r["seed"]) for r in runs)
    return f"{key} = {s['label']}{arm}: {len(runs)} runs (seeds {seeds}): " + ", ".join(r["label"] for r in runs) + base


def table_head(interval: str) -> str:
    return f"{'metric':<12} {'A':>9} {'B':>9} {'B - A':>10}   {interval:<24} {'P(B>A)':>7}  outcome"


def metric_row(m: str, r: dict, outcome: str) -> str:
    """Metric `m`'s line of the table under table_head: the means, B - A, its interval, P(B>A), `outcome`."""
    ci = format_interval(r["ci_low"], r["ci_high"], m, True)
    return (
        f"{m:<12} {format_metric(r['a'], m):>9} {format_metric(r['b'], m):>9} "
        f"{format_metric(r['difference'], m, True):>10}   {ci:<24} {r['prob_b_better']:>7.2f}  {outcome}"
    )


def render(result: dict) -> str:
    a, b = result["a"], result["b"]
    if result.get("identical"):
        return "\n".join([_side_line("A", a), _side_line("B", b), "", f"identical: {result['message']}"])
    level = f"{result['level'] * 100:g} %"
    lines = [
        _side_line("A", a),
        _side_line("B", b),
        f"{result['shared_items']} shared items (matched by id). B - A with its {level} interval "
        f"({result['resamples']} resamples, seed {result['seed']}); the interval covers: {result['luck']['covers']}.",
        "",
    ]
    head = table_head(level + " interval")
    lines += [head, "-" * len(head)]
    for m, r in result["metrics"].items():
        more = f" (~{r['seeds_needed']} seeds per arm)" if r["outcome"] == "inconclusive" and r["seeds_needed"] else ""
        lines.append(metric_row(m, r, r["outcome"] + more))
    margins = ", ".join(f"{m} {r['margin']:g}" for m, r in result["metrics"].items())
    lines += [
        f"(P(B>A): the share of the interval's draws where B beats A; mse: lower is better. Equivalent: the "
        f"interval inside +-margin: {margins}; margins from {result.get('margins_from', 'the defaults')}, unless "
        "--margin)",
        "",
    ]
    if not result["luck"]["covers_seeds"]:
        need = max(r["seeds_needed"] or 2 for r in result["metrics"].values())
        lines += [
            "Training luck is NOT covered: one run a side, and no seed-variance reference for this preset and data "
            "(reference/seed_variance/). Two runs of one config differ by their seeds' luck on every test set, so "
            "no difference here can be called better or worse. To cover it: run at least "
            f"{need} seeds per arm (./dev decide runs them until the answer is clear; ./dev seeds measures a "
            "preset's reference).",
            "",
        ]
    lines += [r["verdict"] for r in result["metrics"].values()]
    f = result["flipped"]
    lines += [
        "",
        f"Items whose {f['metric']} outcome flipped ({f['a_only'] + f['b_only']} of {result['shared_items']}):",
    ]
    for key, hit, miss in (("a_only", a["label"], b["label"]), ("b_only", b["label"], a["label"])):
        items = f[f"{key}_items"]
        more = f", the first {len(items)}" if 0 < len(items) < f[key] else ""
        lines.append(f"  {f[key]} hit by {hit}, missed by {miss}{more}" + (":" if items else ""))
        for it in items:
            lines.append(f"    {it['id']}  (hit rate A {it['a_hit_rate']:.2f}, B {it['b_hit_rate']:.2f})")
            lines.append(f"      input:  {_short(it['input'])}")
            lines.append(f"      target: {_short(it['target'])}")
    return "\n".join(lines)


def render_sweep(result: dict) -> str:
    m = result["metric"]
    direction = "higher is better" if result["higher_is_better"] else "lower is better"
    nruns = sum(len(a["seeds"]) for a in result["arms"])
    lines = [
        f"Sweep {result['sweep']}: {len(result['arms'])} arms ({nruns} model runs) tagged {result['tag']} in "
        f"{result['store']}, ranked by {m} ({direction}) over {result['items']} shared test items.",
        f"mean: over the arm's seeds, with its 95 % interval; vs top: the arm's mean minus the top arm's, with its "
        f"interval and P(better than the top arm). The intervals cover: {result['covers']}.",
        "",
    ]
    interval = "95 % interval"
    head = ["rank", "arm", "seeds", *result["swept_params"], m, interval, "vs top", interval, "P", "outcome"]
    body = []
    for row in result["arms"]:
        mean = row["mean"]
        if row["top"]:
            versus = ["top", "", "", "best" if row.get("best") else "top, not separated"]
        else:
            d = row["difference_from_top"]
            versus = [
                format_metric(d["difference"], m, True),
                format_interval(d["ci_low"], d["ci_high"], m, True),
                f"{d['prob_b_better']:.2f}",
                d["outcome"],
            ]
        body.append(
            [
                str(row["rank"]),
                row["arm"]["name"],
                ",".join(str(s) for s in row["seeds"]),
                *(row["params"][p] for p in result["swept_params"]),
                format_metric(mean["value"], m),
                format_interval(mean["ci_low"], mean["ci_high"], m),
                *versus,
            ]
        )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    first = 3 + len(result["swept_params"])
    numeric = {0, first, first + 2, first + 4}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines += [line(head).rstrip(), "-" * len(line(head).rstrip())]
    lines += [line(r).rstrip() for r in body]
    if any("vs_mlp" in row for row in result["arms"]):
        lines += [
            "",
            f"Against the MLP baseline of the model's size, on {m} (arm - MLP, 95 % interval over the items and both",
        ]
        lines += [
            f"sides' seeds): its own (trained beside the arm's runs) and the sweep's strongest ({result['best_mlp']}):"
        ]
        for row in result["arms"]:
            parts = []
            for key, what in (("vs_mlp", "own"), ("vs_best_mlp", "strongest")):
                d = row.get(key)
                if d:
                    iv = format_interval(d["ci_low"], d["ci_high"], m, True)
                    diff = f"{format_metric(d['difference'], m, True)} {iv}"
                    parts.append(f"{what} {format_metric(d['a'], m)}: {diff} {d['outcome']}")
            lines.append(f"  {row['arm']['name']}: " + "; ".join(parts))
    if result["best"]:
        lines.append(f"Best: {result['best']}, worse than it on {m}: every other arm (its interval excludes 0).")
    else:
        lines.append(
            f"No best arm: the top arm is not separated from {', '.join(result['not_separated_from_top'])} on {m} "
            "(an interval that holds 0): run more seeds of those arms before choosing."
        )
    return "\n".join(lines)


def parse_margins(values: list[str], error) -> dict[str, float]:
    """--margin METRIC=VALUE, repeatable: a number >= 0 for a known metric."""
    out = {}
    for v in values:
        key, sep, raw = v.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not sep or key not in MARGINS or not math.isfinite(value) or value < 0:
            error(f"--margin {v!r}: expected METRIC=VALUE, METRIC one of {', '.join(METRICS)}, VALUE a number >= 0")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./dev compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "a", metavar="A", nargs="?", help="the reference: one run or replicates (see above); differences are B - A"
    )
    ap.add_argument("b", metavar="B", nargs="?", help="the one compared with it (same kinds)")
    ap.add_argument(
        "--baseline",
        metavar="NAME",
        help="with A alone: a baseline scored beside A's model(s) by the evaluate stage (identity, ridge, nearest, "
        "or mlp: the MLP of the model's size, its replicates with their seed luck) as A, A's model(s) as B",
    )
    ap.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="the equivalence margin of a metric (repeatable; defaults: the sides' preset's, from its seed-variance "
        "reference (pipeline/stats/defaults.py), else " + ", ".join(f"{m} {v:g}" for m, v in MARGINS.items()) + ")",
    )
    add_bootstrap_options(ap)
    ap.add_argument(
        "--show",
        type=int,
        default=DEFAULT_SHOW,
        metavar="N",
        help=f"flipped items listed each way (default {DEFAULT_SHOW}; 0: counts only)",
    )
    ap.add_argument(
        "--sweep",
        metavar="NAME",
        help="instead of A and B: rank the arms of the sweep tagged sweep.NAME (dvc exp run --queue -S run.sweep=NAME "
        "...) against the best",
    )
    ap.add_argument(
        "--metric",
        help="with --sweep: the metric to rank by (default group_top1; cosine, mse, top1, top5, group_top5, mrr)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument(
        "--no-log",
        action="store_true",
        help="a quick look: do not record the decision in MLflow (pipeline/tracking/decisions.py)",
    )
    args = ap.parse_args(argv)
    if args.show < 0:
        ap.error(f"--show {args.show}: expected 0 or more")
    margins = parse_margins(args.margin, ap.error)
    if args.sweep is not None:
        if args.a is not None or args.baseline is not None:
            ap.error("--sweep NAME ranks the sweep's own runs: give no A, B or --baseline with it")
    elif args.metric is not None:
        ap.error("--metric goes with --sweep (a comparison of A and B shows every metric)")
    elif args.a is None or (args.b is None) == (args.baseline is None):
        ap.error("give two sides (A B), one with --baseline NAME, or --sweep NAME")
    try:
        fill_bootstrap_defaults(args)
        if args.sweep is not None:
            found = sweep.find(args.sweep)
            metric = args.metric or sweep.DEFAULT_METRIC
            result = sweep.rank(found, metric, resamples=args.resamples, seed=args.seed, margins=margins)
        else:
            result = compare(*_sides(args), args.resamples, args.seed, args.show, margins)
    except PipelineError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"compare: warning: {w}", file=sys.stderr)
    text = render_sweep(result) if args.sweep is not None else render(result)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else text)
    if args.sweep is None and not args.no_log:
        from pipeline.tracking.decisions import record_decision

        if line := record_decision(result, "compare", text=text):
            print(f"compare: {line}", file=sys.stderr)
    return 0


def _sides(args) -> tuple[Side, Side]:
    a = load_side(args.a)
    if args.baseline:
        b = a
        if args.baseline in TRAINED_BASELINES:  # its replicates, a source each
            a = Side(
                a.spec, baseline_replicates(a.sources, args.baseline), args.baseline, name=f"{a.label}:{args.baseline}"
            )
        else:
            a = Side(a.spec, a.sources, args.baseline)
    else:
        b = load_side(args.b)
    if a.label == b.label:
        a.name, b.name = f"{a.label} (A)", f"{b.label} (B)"
    return a, b


if __name__ == "__main__":
    sys.exit(main())
