"""A sequential decision between two arms (`./dev decide`): seed pairs of A and B trained through
DVC's queue (replicates.py), a look after each pair at the level its alpha-spending plan gives
(decision.SequentialPlan), and a stop at the first look that is not inconclusive. Against the MLP
baseline (`--against mlp`) only B is trained, a seed a round: A is the MLP replicates its runs'
item tables hold (each seed once), so the model against its rival is decided the same way."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from pipeline.core.arm import SEED_KEY
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats import baseline_rev, decision_log
from pipeline.stats.compare import flipped, with_verdicts
from pipeline.stats.decision import CONFIDENCE, ArmRuns, SequentialPlan, compare_arms, look
from pipeline.stats.item_sources import pooled_replicates, predictor_table, shared_values
from pipeline.stats.metrics import LOWER_IS_BETTER, METRICS
from pipeline.stats.replicates import config_digest, head, run_replicates
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
    baseline: str | None = None  # --baseline REV: the commit A is trained from (B: the workspace)
    a_prefix: str = "rep"  # A's experiment names: rep-<arm>-s<seed>, or base-<commit>-<arm>-s<seed>
    against: str | None = None  # --against mlp: A is B's runs' MLP baseline, not trained by a round of its own


@dataclass
class State:
    results: dict[str, list] = field(default_factory=lambda: {"A": [], "B": []})
    looks: list[Look] = field(default_factory=list)
    left_out: list[dict] = field(default_factory=list)  # replicates whose stability check failed
    b_code_differs: bool = False  # --baseline: B's code is not the code any reference was measured with


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
    rev = getattr(args, "baseline_rev", None)
    against = getattr(args, "against", None)
    if against:
        if rev:
            raise PipelineError("--against mlp decides B against its MLP baseline: give no --baseline REV with it")
        a_sets = b_sets  # (what A's MLP was trained beside)
    commit = baseline_rev.resolve(REPO_ROOT, rev) if rev else None
    same = config_digest(a_sets) == config_digest(b_sets) and commit is None and not against
    if b_first is None:
        b_first = args.first_seed + (AA_SEED_OFFSET if same else 0)
    n = args.max_seeds
    # The first look: round 1 if a reference of the preset was measured on both arms' configuration
    # (checked on the data at round 1), else round 2: an arm the reference was not measured on needs
    # 2 runs of its own for its seed spread. The alpha is planned over the looks from the earliest.
    refs = [r for r in load_references() if r.preset == args.preset]
    first = 1 if refs and commit is None and all(reference_arm(sets, refs) for sets in (a_sets, b_sets)) else 2
    # (--against: A, the MLP, has its replicates from B's first run; B needs the reference or 2 runs.)
    if n < first:
        why = (
            f"B ({' '.join(change)}) is another arm than the one the {args.preset} preset's seed-variance reference "
            "was measured on"
            if refs
            else f"without a seed-variance reference for the preset {args.preset!r}"
        )
        raise PipelineError(
            f"--max-seeds {n}: {why}: the first look needs 2 seeds per arm (the seed spread is measured from them)"
        )
    return Plan(
        a_sets,
        b_sets,
        list(range(args.first_seed, args.first_seed + n)),
        list(range(b_first, b_first + n)),
        same,
        SequentialPlan(n, first),
        commit,
        f"base-{commit[:8]}" if commit else "rep",
        against,
    )


def reference_arm(sets: list[str], refs: list) -> bool:
    """Whether a config composed with `sets` is the arm one of the references was measured on (its
    arm digest on the reference's data)."""
    from pipeline.core.arm import arm_digest
    from pipeline.core.config import flatten, load_config

    flat = flatten(load_config(list(sets)))
    return any(arm_digest(flat, r.data) == r.arm.get("digest") for r in refs)


def arms_so_far(state: State, against: str | None = None) -> tuple[ArmRuns, ArmRuns, list[str], list]:
    if against:
        return _against_baseline(state, against)
    tables = {k: [predictor_table(r.source()) for r in state.results[k]] for k in ("A", "B")}
    ids, values = shared_values(list(tables.values()))
    a, b = (
        ArmRuns(k, [r.replicate.seed for r in state.results[k]], v, arm=arm_of_results(state.results[k]))
        for k, v in zip(tables, values)
    )
    if state.b_code_differs and b.arm is not None:
        b.arm = f"{b.arm}@workspace"  # the same config on other code: no reference speaks for it
    return a, b, ids, tables["A"][0]


def _against_baseline(state: State, name: str) -> tuple[ArmRuns, ArmRuns, list[str], list]:
    """B's runs, and as A the trained baseline `name` their item tables hold, pooled over them."""
    tables = [predictor_table(r.source()) for r in state.results["B"]]
    ids, (values,) = shared_values([tables])
    b = ArmRuns("B", [r.replicate.seed for r in state.results["B"]], values, arm=arm_of_results(state.results["B"]))
    pooled = pooled_replicates([(r.items, r.meta) for r in state.results["B"]], ids, name)
    if len(pooled) != 1:
        raise PipelineError(
            f"B's item tables hold {'no' if not pooled else 'several'} {name} baseline(s) "
            f"({', '.join(pooled) or 'written before it'}): one is needed to decide against"
        )
    digest, (seeds, a_values) = next(iter(pooled.items()))
    return ArmRuns("A", seeds, a_values, arm=digest), b, ids, tables[0]


def arm_of_results(results: list) -> str | None:
    """The arm digest the results' item tables carry (None when they carry none, or several)."""
    found = {r.meta.arm_digest for r in results if r.meta is not None}
    return found.pop() if len(found) == 1 and all(r.meta is not None for r in results) else None


def matching_references(state: State) -> list:
    return seed_references(r.meta for rs in state.results.values() for r in rs)


def look_after(state: State, plan: Plan, args, rounds: int) -> Look | None:
    """The look after `rounds` seed pairs (decision.look): None when none is due (or an arm has no
    run left, its replicates having failed their stability check)."""
    if not ((state.results["A"] or plan.against) and state.results["B"]):
        return None
    a, b, _, _ = arms_so_far(state, plan.against)
    refs = matching_references(state)
    d = look(plan.looks, rounds, a, b, args.metric, refs, args.margin, resamples=args.resamples, seed=args.seed)
    return None if d is None else Look(rounds, d.level, d.as_dict())


def final_table(state: State, args, level: float) -> tuple[dict, dict]:
    a, b, ids, texts = arms_so_far(state, getattr(args, "against", None))
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


def train_round(reps: list, a_root, jobs: int) -> list:
    """A round's replicates: through one queue, or (--baseline) A's in the worktree of its commit
    and B's in the project, each through its own queue."""
    if a_root == REPO_ROOT:
        return run_replicates(reps, jobs, label="decide")
    a_reps, b_reps = [r for r in reps if r.arm == "A"], [r for r in reps if r.arm == "B"]
    return [*run_replicates(a_reps, jobs, root=a_root, label="decide"), *run_replicates(b_reps, jobs, label="decide")]


def unstable(result, keep: bool) -> dict | None:
    """A replicate whose stability check failed, as the result lists it (None when it passed, or
    has no check)."""
    if not result.failed_checks:
        return None
    rep = result.replicate
    return {
        "experiment": rep.name,
        "arm": rep.arm,
        "seed": rep.seed,
        "failed_checks": result.failed_checks,
        "kept": keep,
    }


def begin(args, plan: Plan) -> dict:
    """The decision's name (never one already taken), its metric fixed and recorded before the first
    run, and whether it is a second look at runs an earlier decision judged on another metric."""
    directory = getattr(args, "decisions_dir", None) or decision_log.DECISIONS_DIR
    commit = head(REPO_ROOT)
    a_exps = [] if plan.against else [r.name for r in plan_replicates(plan.a_prefix, "A", plan.a_sets, plan.a_seeds)]
    b_exps = [r.name for r in plan_replicates("rep", "B", plan.b_sets, plan.b_seeds)]
    first = decision_log.first_look(directory, commit, a_exps, b_exps)
    name = args.name or decision_log.unique_name(directory, default_name(plan))
    exploratory = first is not None and first.get("metric") != args.metric
    entry = {"name": name, "metric": args.metric, "margin": args.margin, "commit": commit}
    decision_log.record(directory, {**entry, "a_experiments": a_exps, "b_experiments": b_exps})
    if exploratory:
        say(
            f"EXPLORATORY (second look): these runs were decided on {first['metric']} first "
            f"(decision {first.get('name')!r}, {first.get('at', '')}); a look under {args.metric} is not a decision"
        )
    return {
        "name": name,
        "commit": commit,
        "exploratory": exploratory,
        "first_decision": None if first is None else {k: first.get(k) for k in ("name", "metric", "at")},
    }


def run(args) -> dict:
    plan = make_plan(args)
    arm_a = plan.a_sets[0].split("=", 1)[1] + "".join(f" {s}" for s in plan.a_sets[1:])
    arm_b = " ".join(plan.b_sets[1:]) or "(no change)"
    if plan.baseline is not None:
        arm_a, arm_b = f"{arm_a} at commit {plan.baseline[:12]}", f"{arm_b} in the workspace"
    if plan.against:
        arm_a, arm_b = f"the {plan.against} baseline beside B's runs", f"{arm_a} {' '.join(args.sets)}".strip()
    start = begin(args, plan)
    say(
        f"A: {arm_a} | B: {arm_b} "
        + (
            "(the model against its rival: only B is trained)"
            if plan.against
            else "(the same arm: an A/A comparison, B on other seeds)"
            if plan.same_arm
            else "(other code)"
            if plan.baseline is not None and plan.a_sets == plan.b_sets
            else "(a change)"
        )
    )
    say(
        f"deciding on {args.metric} (margin +-{args.margin:g}), up to {args.max_seeds} seed pairs, first look after "
        f"round {plan.looks.first_look}; each look's level: "
        + ", ".join(f"round {k} {v * 100:.2f} %" for k, v in plan.looks.levels.items())
    )
    for note in getattr(args, "notes", []):
        say(note)
    state = State(b_code_differs=plan.baseline is not None)
    outcome, rounds = None, 0
    a_root = REPO_ROOT
    if plan.baseline is not None:
        a_root, _ = baseline_rev.worktree(REPO_ROOT, plan.baseline)
        say(f"A is trained from commit {plan.baseline[:12]} (git worktree {a_root}); B from the workspace")
    for k in range(args.max_seeds):
        reps = [
            *([] if plan.against else plan_replicates(plan.a_prefix, "A", plan.a_sets, [plan.a_seeds[k]])),
            *plan_replicates("rep", "B", plan.b_sets, [plan.b_seeds[k]]),
        ]
        shown = [f"{r.arm} seed {r.seed} ({r.name})" for r in reps]
        say(f"round {k + 1}/{args.max_seeds}: " + ", ".join(shown))
        keep = bool(getattr(args, "keep_unstable", False))
        rounds = k + 1
        for rep, res in zip(reps, train_round(reps, a_root, args.jobs)):
            if res.meta is not None and res.meta.arm_digest not in rep.name:
                say(f"warning: {rep.name} carries the arm id {res.meta.arm_digest} (its data is not the reference's)")
            bad = unstable(res, keep)
            if bad is not None:
                state.left_out.append(bad)
                say(
                    f"{rep.name} (arm {rep.arm}, seed {rep.seed}) failed its stability check "
                    f"({', '.join(bad['failed_checks'])}): " + ("kept (--keep-unstable)" if keep else "left out")
                )
                if not keep:
                    continue
            state.results[rep.arm].append(res)
        lk = look_after(state, plan, args, k + 1)
        if lk is None:
            say(
                f"round {k + 1}: no look yet (the seed spread needs 2 seeds of each arm that the preset's "
                "reference was not measured on)"
            )
            continue
        state.looks.append(lk)
        say(progress_line(lk, args.metric))
        if lk.decision["outcome"] != "inconclusive":
            outcome = lk.decision["outcome"]
            break
    if not ((state.results["A"] or plan.against) and state.results["B"]):
        raise PipelineError(
            "every replicate of an arm failed its stability check and was left out: "
            + ", ".join(x["experiment"] for x in state.left_out)
            + " (reports/stability.md in each experiment says why; --keep-unstable uses them anyway)"
        )
    last = state.looks[-1] if state.looks else None
    level = last.level if last else CONFIDENCE
    metrics, extra = final_table(state, args, level)
    decided = metrics[args.metric]
    return {
        "name": start["name"],
        "metric": args.metric,
        "metric_chosen": getattr(args, "metric_chosen", "given"),
        "higher_is_better": args.metric not in LOWER_IS_BETTER,
        "margin": args.margin,
        "margin_why": getattr(args, "margin_why", "given"),
        "notes": list(getattr(args, "notes", [])),
        "exploratory": start["exploratory"],
        "first_decision": start["first_decision"],
        "commit": start["commit"],
        "change": [s for s in plan.b_sets if s not in plan.a_sets]
        or ([f"against {plan.against}"] if plan.against else []),
        "against": plan.against,
        "baseline_commit": plan.baseline,
        "outcome": outcome or "inconclusive",
        "outcome_at_last_look": (last.decision["outcome"] if last else "inconclusive"),
        "rounds": rounds,  # seed pairs trained (a replicate left out still counts its round)
        "max_seeds": args.max_seeds,
        "same_arm": plan.same_arm,
        "a": against_dict(plan, state) if plan.against else arm_dict("A", plan.a_sets, state.results["A"]),
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
        "left_out": state.left_out,
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
        "commits": [r.rev for r in results],  # each replicate's DVC experiment commit
    }


def against_dict(plan: Plan, state: State) -> dict:
    """A when it is B's runs' baseline: its arm and seeds, and the runs that hold it."""
    a, _, _, _ = _against_baseline(state, plan.against)
    meta = next(r.meta for r in state.results["B"] if r.meta is not None)
    return {
        "label": "A",
        "overrides": plan.b_sets,
        "arm": {"digest": a.arm, "name": meta.baselines[plan.against]["name"]},
        "seeds": a.seeds,
        "experiments": [r.replicate.name for r in state.results["B"]],
        "commits": [r.rev for r in state.results["B"]],
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
    changed = [s.partition("=") for s in plan.b_sets[len(plan.a_sets) :]]
    change = "-".join(f"{key.split('.')[-1]}={value}" for key, _, value in changed) or "same"
    base = plan.a_sets[0].split("=", 1)[1]
    against = f"-vs-{plan.baseline[:8]}" if plan.baseline else f"-vs-{plan.against}" if plan.against else ""
    return re.sub(f"[^{NAME_CHARS}]+", "_", f"{base}-{change}{against}")[:80]


def say(text: str) -> None:
    print(f"[decide] {text}" if not text.startswith("[decide]") else text, file=sys.stderr, flush=True)
