"""Is B better than A? Two evaluated models, or two sets of replicates, compared item by item with
intervals that cover the luck of the test items and of the training seeds.

    ./dev compare A B [--margin METRIC=VALUE ...] [--show N] [--json]
    ./dev compare A --baseline ridge      # A's model(s) against a baseline scored beside them
    ./dev compare --sweep NAME [--metric group_top1] [--json]   # rank a sweep's arms (tools/sweep.py)
    python -m tools.compare A B           # the same, with the environment already active

A and B each name one run or a set of replicates of one arm (tools/item_sources.py): a run id, a
DVC experiment, a git revision (`main`), `workspace`, an item-table file; several of these joined
by commas; a glob of DVC experiment names (`'rep-8cb0c8f0-s*'`); or `arm:KEY`, every evaluated run
of an arm in the MLflow store. Runs of one arm differ only in their seed (pipeline/core/arm.py).

For each metric (cosine, mse, top1, top5, group_top1, group_top5, mrr), over the items both sides
hold (matched by id), it prints A's and B's means, the difference B - A with its 95 % interval,
the probability that B beats A (the share of the interval's draws where it does), and one of four
outcomes (pipeline/evaluate/decision.py):

- better / worse: the interval excludes 0;
- equivalent: the interval lies inside +-margin (defaults per metric: decision.MARGINS; set
  with --margin cosine=0.005);
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

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.evaluate.decision import CONFIDENCE, MARGINS, ArmRuns, compare_arms, format_metric
from pipeline.evaluate.retrieval import METRICS
from tools.bootstrap_options import MIN_RESAMPLES, add_bootstrap_options, fill_bootstrap_defaults
from tools.item_sources import (
    ITEMS_PATH,
    CompareError,
    Side,
    Source,
    load,
    load_side,
    predictor_table,
    runs_values,
    shared_ids,
)

__all__ = ["ITEMS_PATH", "CompareError", "Source", "load", "compare", "main"]

DEFAULT_SHOW = 10
FLIP_METRIC = "group_top1"


# --------------------------------------------------------------------------- comparing


def arm_runs(side: Side, ids: list[str], tables: list) -> ArmRuns:
    return ArmRuns(
        side.label,
        [s.seed for s in side.sources],
        runs_values(tables, ids),
        deterministic=side.predictor != "model",
    )


def references_for(*sides: Side) -> list:
    """The committed seed-variance references that match a trained side's preset and data."""
    from pipeline.evaluate.seed_variance import matching_references

    return matching_references(m for side in sides if side.predictor == "model" for m in side.metas)


def compare(
    a: Side,
    b: Side,
    resamples: int,
    seed: int,
    show: int = DEFAULT_SHOW,
    margins: dict[str, float] | None = None,
    level: float = CONFIDENCE,
    references: list | None = None,
) -> dict:
    """Everything the command prints, as one JSON-able dict."""
    a.check("A")
    b.check("B")
    tables_a = [predictor_table(s, a.predictor) for s in a.sources]
    tables_b = [predictor_table(s, b.predictor) for s in b.sources]
    ids = shared_ids(tables_a + tables_b)
    warnings_ = [*a.warnings, *b.warnings]
    if not ids:
        raise CompareError(
            f"{a.label} and {b.label} share no item id: they were evaluated on different test splits (dataset, "
            "split salt or fractions), so there is nothing to pair"
        )
    sizes = {len(t) for t in tables_a + tables_b}
    if sizes != {len(ids)}:
        warnings_.append(
            f"{a.label} holds {len(tables_a[0])} items and {b.label} {len(tables_b[0])}, of which {len(ids)} are "
            f"shared (different test splits?): the comparison is over the {len(ids)} shared items only"
        )
    arm_a, arm_b = arm_runs(a, ids, tables_a), arm_runs(b, ids, tables_b)
    refs = references_for(a, b) if references is None else references
    decisions, luck = compare_arms(arm_a, arm_b, refs, level, margins, METRICS, resamples=resamples, seed=seed)
    same_arm = a.predictor == b.predictor == "model" and a.arm_digest is not None and a.arm_digest == b.arm_digest
    if same_arm:
        warnings_.append(
            f"A and B are runs of one arm ({a.arm_name} [{a.arm_digest}]), differing only in their seeds: any "
            "difference between them is luck"
        )
    metrics = {}
    for m, d in decisions.items():
        metrics[m] = {**d.as_dict(), "verdict": verdict_line(d, a.label, b.label, luck.covers_seeds)}
    return {
        "a": describe(a, len(tables_a[0])),
        "b": describe(b, len(tables_b[0])),
        "same_arm": same_arm,
        "shared_items": len(ids),
        "luck": {
            "covers_seeds": luck.covers_seeds,
            "covers": luck.describe(),
            "sources": luck.sources,
            "references": [r.shown_path for r in refs],
        },
        "level": level,
        "resamples": resamples,
        "seed": seed,
        "difference": "b - a",
        "warnings": warnings_,
        "metrics": metrics,
        "flipped": flipped(arm_a, arm_b, ids, tables_a[0], show),
    }


def flipped(a: ArmRuns, b: ArmRuns, ids: list[str], texts, show: int) -> dict:
    """Items whose group top-1 flipped: hit by most of A's runs and missed by most of B's, and the
    other way (one run a side: hit by one, missed by the other)."""
    hit_a = a.values[FLIP_METRIC].mean(axis=0)
    hit_b = b.values[FLIP_METRIC].mean(axis=0)
    by_id = texts.set_index("id")
    out: dict = {"metric": FLIP_METRIC}
    for key, mask in (("a_only", (hit_a > 0.5) & (hit_b < 0.5)), ("b_only", (hit_a < 0.5) & (hit_b > 0.5))):
        where = np.flatnonzero(mask)
        out[key] = int(len(where))
        out[f"{key}_items"] = [
            {
                "id": ids[i],
                "input": str(by_id.at[ids[i], "input"]),
                "target": str(by_id.at[ids[i], "target"]),
                "a_hit_rate": _r(hit_a[i]),
                "b_hit_rate": _r(hit_b[i]),
            }
            for i in where[: max(show, 0)]
        ]
    return out


def describe(side: Side, items: int) -> dict:
    return {
        "name": side.spec,
        "label": side.label,
        "predictor": side.predictor,
        "arm": {"digest": side.arm_digest, "name": side.arm_name} if side.arm_digest else None,
        "preset": side.preset,
        "data": side.data,
        "runs": [{"label": s.label, "kind": s.kind, "source": s.description, "seed": s.seed} for s in side.sources],
        "items": items,
    }


def _r(x) -> float:
    return round(float(x), 6)


def verdict_line(d, name_a: str, name_b: str, covered: bool = True) -> str:
    """The decision in words: "B is better than A on cosine: +0.012 [+0.004, +0.020], P(B better)
    0.99", "... equivalent ...", or "inconclusive on ...: <why>; <what would settle it>"."""
    m = d.metric
    what = m if d.higher_is_better else f"{m} (lower is better)"
    numbers = (
        f"{format_metric(d.difference, m, True)} [{format_metric(d.low, m, True)}, {format_metric(d.high, m, True)}], "
        f"P({name_b} better) {d.prob_b_better:.2f}"
    )
    if d.outcome in ("better", "worse"):
        return f"{name_b} is {d.outcome} than {name_a} on {what}: {numbers}"
    if d.outcome == "equivalent":
        return f"{name_b} and {name_a} are equivalent on {what} (within +-{d.margin:g}): {numbers}"
    if not covered:
        return f"inconclusive on {what}: {numbers} (training luck not covered)"
    more = (
        f"about {d.seeds_needed} seeds per arm would likely settle it (./dev decide)"
        if d.seeds_needed
        else "more seeds will not settle it: the test items alone leave it open (more test items, or a wider margin)"
    )
    return f"inconclusive on {what}: {numbers}; {d.why}: {more}"


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


def render(result: dict, show: int = DEFAULT_SHOW) -> str:
    a, b = result["a"], result["b"]
    level = f"{result['level'] * 100:g} %"
    lines = [
        _side_line("A", a),
        _side_line("B", b),
        f"{result['shared_items']} shared items (matched by id). B - A with its {level} interval "
        f"({result['resamples']} resamples, seed {result['seed']}); the interval covers: {result['luck']['covers']}.",
        "",
    ]
    head = f"{'metric':<12} {'A':>9} {'B':>9} {'B - A':>10}   {level + ' interval':<24} {'P(B>A)':>7}  outcome"
    lines += [head, "-" * len(head)]
    for m, r in result["metrics"].items():
        ci = f"[{format_metric(r['ci_low'], m, True)}, {format_metric(r['ci_high'], m, True)}]"
        outcome = r["outcome"]
        if outcome == "inconclusive" and r["seeds_needed"]:
            outcome += f" (~{r['seeds_needed']} seeds per arm)"
        lines.append(
            f"{m:<12} {format_metric(r['a'], m):>9} {format_metric(r['b'], m):>9} "
            f"{format_metric(r['difference'], m, True):>10}   {ci:<24} {r['prob_b_better']:>7.2f}  {outcome}"
        )
    margins = ", ".join(f"{m} {r['margin']:g}" for m, r in result["metrics"].items())
    lines += [
        f"(P(B>A): the share of the interval's draws where B beats A; mse: lower is better. Equivalent: the "
        f"interval inside +-margin: {margins})",
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


# --------------------------------------------------------------------------- command line


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


def _parser() -> argparse.ArgumentParser:
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
        help="with A alone: a baseline scored beside A's model(s) by the evaluate stage (identity, ridge, nearest) "
        "as A, A's model(s) as B",
    )
    ap.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="the equivalence margin of a metric (repeatable; defaults: "
        + ", ".join(f"{m} {v:g}" for m, v in MARGINS.items())
        + ")",
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
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.resamples is not None and args.resamples < MIN_RESAMPLES:
        ap.error(f"--resamples {args.resamples}: expected at least {MIN_RESAMPLES}")
    if args.show < 0:
        ap.error(f"--show {args.show}: expected 0 or more")
    margins = parse_margins(args.margin, ap.error)
    if args.sweep is not None:
        if args.a is not None or args.baseline is not None:
            ap.error("--sweep NAME ranks the sweep's own runs: give no A, B or --baseline with it")
        return _main_sweep(args, margins)
    if args.metric is not None:
        ap.error("--metric goes with --sweep (a comparison of A and B shows every metric)")
    if args.a is None or (args.b is None) == (args.baseline is None):
        ap.error("give two sides (A B), one with --baseline NAME, or --sweep NAME")
    try:
        fill_bootstrap_defaults(args)
        a = load_side(args.a)
        if args.baseline:
            b = a
            a = Side(a.spec, a.sources, args.baseline)
        else:
            b = load_side(args.b)
        if a.label == b.label:
            a.name, b.name = f"{a.label} (A)", f"{b.label} (B)"
        result = compare(a, b, args.resamples, args.seed, args.show, margins)
    except PipelineError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"compare: warning: {w}", file=sys.stderr)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else render(result, args.show))
    return 0


def _main_sweep(args, margins: dict[str, float]) -> int:
    from tools import sweep

    try:
        fill_bootstrap_defaults(args)
        result = sweep.rank(
            sweep.find(args.sweep),
            args.metric or sweep.DEFAULT_METRIC,
            resamples=args.resamples,
            seed=args.seed,
            margins=margins,
        )
    except PipelineError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"compare: warning: {w}", file=sys.stderr)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else sweep.render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
