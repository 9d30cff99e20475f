"""A sequential decision between two arms (`./dev decide`): seed pairs of A and B trained through
DVC's queue (replicates.py), a look after each pair at the level its alpha-spending plan gives
(decision.SequentialPlan), and a stop at the first look that is not inconclusive."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from pipeline.core.arm import SEED_KEY
from pipeline.core.errors import PipelineError
from pipeline.stats.compare import flipped, with_verdicts
from pipeline.stats.decision import CONFIDENCE, ArmRuns, SequentialPlan, compare_arms, look
from pipeline.stats.item_sources import predictor_table, shared_values
from pipeline.stats.metrics import LOWER_IS_BETTER, METRICS
from pipeline.stats.replicates import config_digest, run_replicates
from pipeline.stats.replicates import plan as plan_replicates
from pipeline.stats.seed_variance import load_references
from pipeline.stats.seed_variance import matching_references as seed_references

AA_SEED_OFFSET = 1000  # B's first seed when B is the same arm as A (an A/A comparison)
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
    tables = {k: [predictor_table(r.source()) for r in state.results[k]] for k in ("A", "B")}
    ids, values = shared_values(list(tables.values()))
    a, b = (ArmRuns(k, [r.replicate.seed for r in state.results[k]], v) for k, v in zip(tables, values))
    return a, b, ids, tables["A"][0]


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
    metrics = with_verdicts(decisions, "A", "B", luck.covers_seeds)
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
        f"round {plan.looks.first_look}; each look's level: "
        + ", ".join(f"round {k} {v * 100:.2f} %" for k, v in plan.looks.levels.items())
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
            "(pipeline/stats/decision.py)",
            "sequential": "alpha spent over the planned looks, alpha * ln(1 + (e - 1) t) by fraction t "
            "(decision.alpha_spending)",
            "alpha": round(1 - CONFIDENCE, 6),
            "first_look": plan.looks.first_look,
            "levels": {str(k): round(v, 6) for k, v in plan.looks.levels.items()},
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


def say(text: str) -> None:
    print(f"[decide] {text}" if not text.startswith("[decide]") else text, file=sys.stderr, flush=True)
