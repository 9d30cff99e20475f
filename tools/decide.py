"""Did a change help? Train seed pairs of the baseline and of the change until the answer is clear.

    ./dev decide -S train.lr=1e-3 [-S KEY=VALUE ...] [--preset default] [--baseline-set KEY=VALUE ...]
                 [--metric group_top1] [--margin VALUE] [--max-seeds 5] [--first-seed 0] [-j 2]
                 [--name NAME] [--resamples N] [--seed S] [--json]

A is the preset as conf/ composes it (with --baseline-set overrides, if any); B is A with the -S
changes. Each round queues one seed of each arm through DVC's experiment queue (`dvc exp run
--queue`, `dvc queue start -j N`; tools/replicates.py), the same seed for both (`run.seed` = first
seed + round), waits for them, and looks at the difference in --metric with an interval that
covers the test items and the training seeds (pipeline/evaluate/decision.py). It stops at the
first clear answer:

- better / worse: the interval excludes 0;
- equivalent: the interval lies inside +-margin (default: the metric's, decision.MARGINS);
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
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.arm import SEED_KEY
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT, REPORTS_DIR
from pipeline.evaluate.decision import (
    CONFIDENCE,
    MARGINS,
    ArmRuns,
    SequentialPlan,
    compare_arms,
    format_metric,
    look,
)
from pipeline.evaluate.retrieval import LOWER_IS_BETTER, METRICS
from pipeline.evaluate.seed_variance import load_references
from pipeline.evaluate.seed_variance import matching_references as seed_references
from tools.bootstrap_options import MIN_RESAMPLES, add_bootstrap_options, fill_bootstrap_defaults
from tools.item_sources import predictor_table, runs_values, shared_ids
from tools.replicates import add_overrides, config_digest, run_replicates
from tools.replicates import plan as plan_replicates

DECISIONS_DIR = REPORTS_DIR / "decisions"
AA_SEED_OFFSET = 1000  # B's first seed when B is the same arm as A (an A/A comparison)
DEFAULT_MAX_SEEDS = 5
NAME_CHARS = "A-Za-z0-9._=-"  # a decision's name names its files


@dataclass
class Look:
    rounds: int  # seed pairs so far
    level: float  # this look's interval level (1 - its share of alpha)
    decision: dict  # the metric's decision.Decision.as_dict()


@dataclass
class Plan:
    a_sets: list[str]
    b_sets: list[str]
    a_seeds: list[int]
    b_seeds: list[int]
    same_arm: bool
    looks: SequentialPlan

    @property
    def first_look(self) -> int:
        return self.looks.first_look

    @property
    def levels(self) -> dict[int, float]:
        return self.looks.levels


@dataclass
class State:
    results: dict[str, list] = field(default_factory=lambda: {"A": [], "B": []})
    looks: list[Look] = field(default_factory=list)


def split_seed(sets: list[str]) -> tuple[list[str], int | None]:
    """The -S overrides without run.seed, and the run.seed given (None if none)."""
    rest, seed = [], None
    for s in sets:
        key, _, value = s.partition("=")
        if key.strip().lstrip("+~") == SEED_KEY:
            try:
                seed = int(value)
            except ValueError:
                raise PipelineError(f"-S {s}: expected an integer seed") from None
        else:
            rest.append(s)
    return rest, seed


def make_plan(args) -> Plan:
    base = [f"preset={args.preset}", *args.baseline_sets]
    change, b_first = split_seed(args.sets)
    a_sets, b_sets = base, [*base, *change]
    same = config_digest(a_sets) == config_digest(b_sets)
    if b_first is None:
        b_first = args.first_seed + (AA_SEED_OFFSET if same else 0)
    n = args.max_seeds
    # The first look: round 1 if a reference of the preset may match (checked on the data at round
    # 1), else round 2. The alpha is planned over the looks from the earliest possible one.
    first = 1 if any(r.preset == args.preset for r in load_references()) else 2
    if n < first:
        raise PipelineError(
            f"--max-seeds {n}: without a seed-variance reference for the preset {args.preset!r} the first look needs "
            "2 seeds per arm (the seed spread is measured from them)"
        )
    return Plan(
        a_sets,
        b_sets,
        list(range(args.first_seed, args.first_seed + n)),
        list(range(b_first, b_first + n)),
        same,
        SequentialPlan(n, first),
    )


def arms_so_far(state: State) -> tuple[ArmRuns, ArmRuns, list[str], list]:
    tables = {k: [predictor_table(r.source()) for r in v] for k, v in state.results.items()}
    ids = shared_ids(tables["A"] + tables["B"])
    arms = tuple(
        ArmRuns(k, [r.replicate.seed for r in state.results[k]], runs_values(tables[k], ids)) for k in ("A", "B")
    )
    return arms[0], arms[1], ids, tables["A"][0]


def matching_references(state: State) -> list:
    return seed_references(r.meta for rs in state.results.values() for r in rs)


def look_after(state: State, plan: Plan, args, rounds: int) -> Look | None:
    """The look after `rounds` seed pairs (decision.look): None when none is due."""
    a, b, _, _ = arms_so_far(state)
    d = look(
        plan.looks,
        rounds,
        a,
        b,
        args.metric,
        matching_references(state),
        args.margin,
        resamples=args.resamples,
        seed=args.seed,
    )
    return None if d is None else Look(rounds, d.level, d.as_dict())


def final_table(state: State, args, level: float) -> tuple[dict, dict]:
    a, b, ids, texts = arms_so_far(state)
    refs = matching_references(state)
    decisions, luck = compare_arms(
        a, b, refs, level, {args.metric: args.margin}, METRICS, resamples=args.resamples, seed=args.seed
    )
    from tools.compare import flipped, verdict_line

    metrics = {
        m: {**d.as_dict(), "verdict": verdict_line(d, "A", "B", luck.covers_seeds)} for m, d in decisions.items()
    }
    extra = {
        "covers": luck.describe(),
        "references": [r.shown_path for r in refs],
        "items": len(ids),
        "flipped": flipped(a, b, ids, texts, args.show),
    }
    return metrics, extra


def progress_line(lk: Look, metric: str) -> str:
    d = lk.decision
    digits = 6 if metric == "mse" else 4
    state = {"inconclusive": "go on"}.get(d["outcome"], f"stop: {d['outcome'].upper()}")
    return (
        f"[decide] look after {lk.rounds} seed pair(s), at {lk.level * 100:.2f} %: {metric} B - A = "
        f"{d['difference']:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}], "
        f"P(B better) {d['prob_b_better']:.2f} -> {state}"
    )


def run(args) -> dict:
    plan = make_plan(args)
    arm_a = plan.a_sets[0].split("=", 1)[1] + "".join(f" {s}" for s in plan.a_sets[1:])
    arm_b = " ".join(plan.b_sets[1:]) or "(no change)"
    say(
        f"A: {arm_a} | B: {arm_b} "
        + ("(the same arm: an A/A comparison, B on other seeds)" if plan.same_arm else "(a change)")
    )
    say(
        f"deciding on {args.metric} (margin +-{args.margin:g}), up to {args.max_seeds} seed pairs, first look after "
        f"round {plan.first_look}; each look's level: "
        + ", ".join(f"round {k} {v * 100:.2f} %" for k, v in plan.levels.items())
    )
    state = State()
    outcome = None
    for k in range(args.max_seeds):
        reps = [
            *plan_replicates("rep", "A", plan.a_sets, [plan.a_seeds[k]]),
            *plan_replicates("rep", "B", plan.b_sets, [plan.b_seeds[k]]),
        ]
        say(
            f"round {k + 1}/{args.max_seeds}: A seed {plan.a_seeds[k]} ({reps[0].name}), "
            f"B seed {plan.b_seeds[k]} ({reps[1].name})"
        )
        for rep, res in zip(reps, run_replicates(reps, args.jobs, label="decide")):
            state.results[rep.arm].append(res)
        lk = look_after(state, plan, args, k + 1)
        if lk is None:
            say(f"round {k + 1}: no look yet (the seed spread needs 2 seeds per arm without a matching reference)")
            continue
        state.looks.append(lk)
        say(progress_line(lk, args.metric))
        if lk.decision["outcome"] != "inconclusive":
            outcome = lk.decision["outcome"]
            break
    last = state.looks[-1] if state.looks else None
    level = last.level if last else CONFIDENCE
    metrics, extra = final_table(state, args, level)
    decided = metrics[args.metric]
    return {
        "name": args.name or default_name(plan),
        "metric": args.metric,
        "higher_is_better": args.metric not in LOWER_IS_BETTER,
        "margin": args.margin,
        "outcome": outcome or "inconclusive",
        "rounds": len(state.results["A"]),
        "max_seeds": args.max_seeds,
        "same_arm": plan.same_arm,
        "a": arm_dict("A", plan.a_sets, state.results["A"]),
        "b": arm_dict("B", plan.b_sets, state.results["B"]),
        "method": {
            "interval": "paired bootstrap over test items + t-distribution draw of the seed spread "
            "(pipeline/evaluate/decision.py)",
            "sequential": "alpha spent over the planned looks, alpha * ln(1 + (e - 1) t) by fraction t "
            "(decision.alpha_spending)",
            "alpha": round(1 - CONFIDENCE, 6),
            "first_look": plan.first_look,
            "levels": {str(k): round(v, 6) for k, v in plan.levels.items()},
            "resamples": args.resamples,
            "seed": args.seed,
        },
        "covers": extra["covers"],
        "references": extra["references"],
        "items": extra["items"],
        "looks": [{"rounds": lk.rounds, "level": round(lk.level, 6), **lk.decision} for lk in state.looks],
        "decision": decided,
        "metrics": metrics,
        "flipped": extra["flipped"],
        "curves": curves(state),
    }


def arm_dict(key: str, sets: list[str], results: list) -> dict:
    meta = next((r.meta for r in results if r.meta is not None), None)
    return {
        "label": key,
        "overrides": sets,
        "arm": {"digest": meta.arm_digest, "name": meta.arm_name} if meta else None,
        "seeds": [r.replicate.seed for r in results],
        "experiments": [r.replicate.name for r in results],
    }


def curves(state: State) -> dict:
    """Each arm's training loss per logged step, per seed (for the page's plot)."""
    out = {}
    for key, results in state.results.items():
        out[key] = {
            str(r.replicate.seed): {"step": r.steps["step"].tolist(), "loss": r.steps["train/loss"].tolist()}
            for r in results
            if r.steps is not None and {"step", "train/loss"} <= set(r.steps.columns)
        }
    return out


def default_name(plan: Plan) -> str:
    change = "-".join(s.split(".")[-1] for s in plan.b_sets[len(plan.a_sets) :]) or "same"
    base = plan.a_sets[0].split("=", 1)[1]
    return re.sub(f"[^{NAME_CHARS}]+", "_", f"{base}-{change}")[:80]


def render(result: dict) -> str:
    m = result["metric"]
    d = result["decision"]
    lines = [
        f"Decision on {m}: B is {result['outcome'].upper()}"
        + ("" if result["outcome"] != "inconclusive" else " (no clear answer)")
        + f" after {result['rounds']} seed pair(s).",
        f"A = {_arm_text(result['a'])}; B = {_arm_text(result['b'])}.",
        f"{result['items']} shared test items; intervals cover: {result['covers']}.",
        f"Looks: {len(result['looks'])}, each at its own level from a 5 % alpha-spending plan over "
        f"{len(result['method']['levels'])} planned looks; the last at {d['level'] * 100:.2f} %.",
        "",
        f"{'metric':<12} {'A':>9} {'B':>9} {'B - A':>10}   {'interval':<24} {'P(B>A)':>7}  outcome",
    ]
    for metric, r in result["metrics"].items():
        ci = f"[{format_metric(r['ci_low'], metric, True)}, {format_metric(r['ci_high'], metric, True)}]"
        mark = "  <- decides" if metric == m else ""
        lines.append(
            f"{metric:<12} {format_metric(r['a'], metric):>9} {format_metric(r['b'], metric):>9} "
            f"{format_metric(r['difference'], metric, True):>10}   {ci:<24} {r['prob_b_better']:>7.2f}  "
            f"{r['outcome']}{mark}"
        )
    lines += [
        f"(Only {m} decides; the other metrics are shown at the same level, for reading.)",
        "",
        d["verdict"],
    ]
    return "\n".join(lines)


def _arm_text(side: dict) -> str:
    name = side["arm"]["name"] if side["arm"] else "?"
    return f"{name} (seeds {', '.join(map(str, side['seeds']))})"


def write(result: dict, directory: Path = DECISIONS_DIR) -> tuple[Path, Path]:
    from pipeline.core.atomic import atomic_path, write_json
    from pipeline.report.decision_page import render_page

    directory.mkdir(parents=True, exist_ok=True)
    json_path, html_path = directory / f"{result['name']}.json", directory / f"{result['name']}.html"
    write_json(json_path, result)
    with atomic_path(html_path) as tmp:
        Path(tmp).write_text(render_page(result), encoding="utf-8")
    return json_path, html_path


def say(text: str) -> None:
    print(f"[decide] {text}" if not text.startswith("[decide]") else text, file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="./dev decide", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_overrides(
        ap, "-S", "--set", dest="sets", help="the change B makes to A (Hydra syntax, as dvc exp run -S); repeatable"
    )
    ap.add_argument("--preset", default="default", help="the preset both arms start from (default: default)")
    add_overrides(ap, "--baseline-set", dest="baseline_sets", help="an override of A (and so of B); repeatable")
    ap.add_argument(
        "--metric", default="group_top1", choices=METRICS, help="the metric that decides (default group_top1)"
    )
    ap.add_argument("--margin", type=float, help="the equivalence margin of the metric (default: decision.MARGINS)")
    ap.add_argument(
        "--max-seeds", type=int, default=DEFAULT_MAX_SEEDS, help=f"seed pairs at most (default {DEFAULT_MAX_SEEDS})"
    )
    ap.add_argument("--first-seed", type=int, default=0, help="A's first seed (default 0)")
    ap.add_argument(
        "-j", "--jobs", type=int, default=2, help="DVC queue workers (default 2: a round's two arms at once)"
    )
    ap.add_argument("--name", help="the decision's name (its files in reports/decisions/; default from the change)")
    add_bootstrap_options(ap)
    ap.add_argument("--show", type=int, default=10, help="flipped items listed each way (default 10)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if not args.sets:
        ap.error("give the change to decide on: -S KEY=VALUE (e.g. -S train.lr=1e-3)")
    if args.max_seeds < 1 or args.jobs < 1 or (args.resamples is not None and args.resamples < MIN_RESAMPLES):
        ap.error(f"--max-seeds and -j must be >= 1, --resamples >= {MIN_RESAMPLES}")
    if args.margin is None:
        args.margin = MARGINS[args.metric]
    elif args.margin < 0:
        ap.error(f"--margin {args.margin}: expected a number >= 0")
    if args.name is not None and not re.fullmatch(f"[{NAME_CHARS}]+", args.name):
        ap.error(f"--name {args.name!r}: letters, digits, '-', '_', '.', '=' only (it names files)")
    try:
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
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
