"""Is arm B better than arm A? An interval that covers both kinds of luck, and a decision from it.

Each arm is one or more runs (replicates: the same arm, other seeds) scored on the same test
items, or a baseline (the same for every seed). The difference of the arms' means gets an interval
over the test items (a paired bootstrap, bootstrap.resample_means) and the training seeds (a
stratified t draw of the run-mean spread, seed_variance.SeedVar); the outcome is better, worse,
equivalent (inside +-margin) or inconclusive, with the guards for one run a side. The method, its
assumptions and its tests: docs/decisions.md. `alpha_spending` plans the levels of sequential looks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as sps

from pipeline.stats.bootstrap import p_value, resample_means
from pipeline.stats.defaults import GENERIC_MARGINS
from pipeline.stats.metrics import LOWER_IS_BETTER, METRICS, round6
from pipeline.stats.seed_variance import SeedVar, components, pool, with_seed_luck

CONFIDENCE = 0.95
# The generic equivalence margin of each metric, in its own units (pipeline/stats/defaults.py: a
# preset with a reference gets its own, never below one test item or two run SDs). Set per metric
# with --margin METRIC=VALUE.
MARGINS: dict[str, float] = GENERIC_MARGINS
# One run a side on a metric whose reference seeds split into modes is not called better or worse
# (single_run_verdict) unless its difference is more than this many times the widest gap between
# two reference seeds: no seed of the other mode could make that.
GUARD_MULTIPLE = 3.0
MIN_SHARE_RUNS = 3  # an arm other than the reference's shares its spread only after a test on this many runs
SHARE_ALPHA = 0.05  # the test's level (spread_shared)
MAX_SEEDS_ESTIMATE = 100  # "more than this many seeds" is said as "more seeds will not settle it"


@dataclass
class ArmRuns:
    """One side of a comparison: runs x items values per metric, on items shared with the other."""

    label: str
    seeds: list[int | None]
    values: dict[str, np.ndarray]  # metric -> (runs, items)
    deterministic: bool = False  # a baseline: no training, no seed luck
    arm: str | None = None  # the arm's digest when known: a reference covers only its own arm (luck_for)

    @property
    def runs(self) -> int:
        return len(self.seeds)


@dataclass
class Luck:
    """What an interval covers: the items always; the seeds when `seed` is known."""

    seed: dict[str, SeedVar] = field(default_factory=dict)  # per metric; empty: not covered
    sources: list[str] = field(default_factory=list)  # where the seed variance came from, in words
    needs_seeds: bool = True  # False when neither side was trained (baseline against baseline)
    # Per metric, the widest gap between two seeds' run means in the references: (gap, low, high)
    # with the two run means. A side of one run can be that far off by luck alone (SINGLE_RUN_GUARD).
    seed_gap: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    # Per metric, why its seeds are not bell-shaped (a reference's outlier seeds), in words: one
    # run a side is then never called better or worse (single_run_verdict).
    irregular: dict[str, str] = field(default_factory=dict)
    # Why a reference was not borrowed for an arm, and what that arm needs (replicates of its own).
    notes: list[str] = field(default_factory=list)

    @property
    def covers_seeds(self) -> bool:
        return bool(self.seed) or not self.needs_seeds

    def describe(self) -> str:
        if not self.needs_seeds:
            return "test items (neither side has training luck)"
        if not self.seed:
            return "test items only: training (seed) luck NOT covered" + "".join(f"; {n}" for n in self.notes)
        df = next(iter(self.seed.values())).df
        return f"test items and training seeds (seed variance from {'; '.join(self.sources)}; {df} degrees of freedom)"


def spread_shared(x: ArmRuns, ref, metric: str) -> tuple[bool, str]:
    """Whether the arm `x` may borrow the reference's seed spread on `metric`, and why in words:
    yes when it is the reference's arm (or its arm is not known: the caller vouches), or when
    MIN_SHARE_RUNS runs or more of its own do not differ in spread from the reference's by a
    two-sided F test at SHARE_ALPHA. Otherwise it needs replicates of its own."""
    digest = ref.arm.get("digest")
    if x.deterministic or x.arm is None or x.arm == digest:
        return True, ""
    theirs = f"the {ref.preset} reference's arm ({ref.arm.get('name')} [{digest}])"
    if x.runs >= MIN_SHARE_RUNS and metric in x.values and metric in ref.metrics:
        own, theirs_var = components(x.values[metric]), ref.metrics[metric]
        their = theirs_var.run_var_at(own.items)
        if own.run_var <= 0 or their <= 0:
            return False, (
                f"{x.label} is another arm than {theirs}, and the spread of its {x.runs} runs on {metric} cannot be "
                "tested against the reference's (one of them is 0): its own runs only"
            )
        f = own.run_var / their
        p = min(1.0, 2 * float(min(sps.f.cdf(f, own.df, theirs_var.df), sps.f.sf(f, own.df, theirs_var.df))))
        if p >= SHARE_ALPHA:
            return True, ""
        return False, (
            f"{x.label} is another arm than {theirs}, and its {x.runs} runs' spread on {metric} differs from the "
            f"reference's (run SD {own.run_sd:.3g} vs {math.sqrt(their):.3g}, F test p {p:.3f}): its own runs only"
        )
    return False, (
        f"{x.label} is another arm than {theirs}: it borrows no seed spread and needs replicates of its own, at "
        f"least 2 runs ({MIN_SHARE_RUNS} to test whether it shares the reference's spread); it has {x.runs}"
    )


def luck_for(*arms: ArmRuns, references: Sequence = ()) -> Luck:
    """The seed luck each metric's comparison of the arms uses. The arms a reference covers
    (spread_shared) share one spread: their own replicates pooled with those references, over the
    items the arms share. An arm no reference covers has only its own replicates (with one run its
    seed luck is not covered). Separate groups' shares add up (combine)."""
    trained = [x for x in arms if not x.deterministic]
    if not trained:
        return Luck(needs_seeds=False)
    gaps, irregular, notes, seed, used = {}, {}, [], {}, []
    speaks_for: dict[int, list[str]] = {}  # a reference's id -> the labels of the arms it covers
    for m in METRICS:
        groups: dict[tuple, list[ArmRuns]] = {}
        covering: dict[tuple, list] = {}
        for k, x in enumerate(trained):
            refs = []
            for ref in references:
                ok, why = spread_shared(x, ref, m)
                if ok:
                    refs.append(ref)
                elif why not in notes:
                    notes.append(why)
            key = tuple(id(r) for r in refs) if refs else ("own", k)
            groups.setdefault(key, []).append(x)
            covering[key] = refs
        applicable = [r for refs in covering.values() for r in refs]
        means = [v for ref in applicable for v in ref.per_seed.get(m, [])]
        if len(means) >= 2:
            gaps[m] = (max(means) - min(means), min(means), max(means))
        for ref in applicable:
            out = ref.outliers(m)
            if out:
                listed = ", ".join(f"seed {s} at {v:.4g} ({z:.1f} robust SDs out)" for s, v, z in out)
                irregular[m] = (
                    f"the {ref.preset} preset's seeds are not bell-shaped on {m}: {listed} of "
                    f"{len(ref.seeds)} seeds in its reference"
                )
        items = next((x.values[m].shape[1] for x in arms if m in x.values), 0)
        parts = []
        for key, members in groups.items():
            own = [components(x.values[m]) for x in members if x.runs >= 2 and m in x.values]
            pooled = pool([*own, *(ref.metrics.get(m) for ref in covering[key])], items)
            if pooled is None or (not covering[key] and any(x.runs < 2 for x in members)):
                parts = None  # an arm of one run and nothing that may speak for its spread
                break
            parts.append((pooled, sum(1.0 / x.runs for x in members)))
            used += [ref for ref in covering[key] if ref not in used and ref.metrics.get(m) is not None]
            for ref in covering[key]:
                speaks_for.setdefault(id(ref), [])
                speaks_for[id(ref)] += [x.label for x in members if x.label not in speaks_for[id(ref)]]
        if parts:
            seed[m] = combine(parts, items)
    sources = [f"{x.runs} runs of {x.label}" for x in trained if x.runs >= 2]
    every = [x.label for x in trained]
    sources += [
        ref.describe() + ("" if speaks_for.get(id(ref)) == every else f", for {', '.join(speaks_for.get(id(ref), []))}")
        for ref in used
    ]
    return Luck(seed, sources if seed else [], seed_gap=gaps, irregular=irregular, notes=notes)


def combine(parts: Sequence[tuple[SeedVar, float]], items: int) -> SeedVar:
    """One SeedVar for a difference whose arms' seed spreads come from separate estimates: parts
    are (estimate, sum of 1 / runs of the arms it speaks for). Its run_var times the arms' total
    weight is the difference's seed variance; its degrees of freedom are Welch-Satterthwaite's.
    One part is returned as it is."""
    if len(parts) == 1:
        return parts[0][0]
    shares = [(v.run_var_at(items) * w, v.df) for v, w in parts]
    total = sum(s for s, _ in shares)
    weight = sum(w for _, w in parts)
    denom = sum(s * s / df for s, df in shares)
    df = max(1, int(total * total / denom)) if denom > 0 else min(v.df for v, _ in parts)
    return SeedVar(total / weight, df, sum(v.interaction * w for v, w in parts) / weight, items)


@dataclass
class Decision:
    metric: str
    higher_is_better: bool
    a: float
    b: float
    difference: float  # b - a
    low: float
    high: float
    level: float  # of the interval
    p_value: float
    prob_b_better: float  # share of draws where B beats A
    outcome: str
    margin: float
    why: str  # the outcome in words
    seeds_needed: int | None = None  # per arm, to settle an inconclusive one (None: more seeds will not)
    covers_seeds: bool = True

    def as_dict(self) -> dict:
        """The fields in their order, low and high as ci_low and ci_high, the estimates to 6 decimals."""
        estimates = {"a", "b", "difference", "low", "high", "p_value", "prob_b_better"}
        names = {"low": "ci_low", "high": "ci_high"}
        return {names.get(k, k): round6(v) if k in estimates else v for k, v in vars(self).items()}


def _arm_mean(x: ArmRuns, metric: str) -> np.ndarray:
    return np.asarray(x.values[metric], dtype=np.float64).mean(axis=0)  # per item, over runs


def _weight(*arms: ArmRuns) -> float:
    """sum of 1 / runs over the trained arms: how much of one run's luck their means carry."""
    return sum(1.0 / x.runs for x in arms if not x.deterministic)


def draws(per_item: np.ndarray, var: SeedVar | None, arms: Sequence[ArmRuns], resamples: int, seed: int) -> np.ndarray:
    """Resampled values of mean(per_item), with the luck of the `arms`' seeds when `var` is given
    (see the module doc)."""
    out = resample_means(per_item, resamples, seed)[:, 0]
    return with_seed_luck(out, float(np.mean(per_item)), len(per_item), var, _weight(*arms), seed)


def compare_metric(
    a: ArmRuns,
    b: ArmRuns,
    metric: str,
    luck: Luck,
    level: float = CONFIDENCE,
    margin: float | None = None,
    *,
    resamples: int,
    seed: int,
) -> Decision:
    higher = metric not in LOWER_IS_BETTER
    margin = MARGINS[metric] if margin is None else float(margin)
    ma, mb = _arm_mean(a, metric), _arm_mean(b, metric)
    d = mb - ma
    var = luck.seed.get(metric)
    covered = var is not None or not luck.needs_seeds
    sample = draws(d, var, (a, b), resamples, seed)
    low, high = interval(sample, level)
    diff = float(d.mean())
    p = p_value(None if var is not None else d, sample)  # seed luck drawn: draws move even where no item does
    better_share = float(((sample > 0) if higher else (sample < 0)).mean() + 0.5 * (sample == 0).mean())
    out = Decision(
        metric,
        higher,
        float(ma.mean()),
        float(mb.mean()),
        diff,
        low,
        high,
        level,
        p,
        better_share,
        "inconclusive",
        margin,
        "",
        covers_seeds=covered,
    )
    if not covered:
        out.why = (
            "training luck is not covered (an arm of one run and no seed-variance reference of its arm and data"
            + "".join(f"; {n}" for n in luck.notes)
            + "): the difference may be the seeds'"
        )
        out.seeds_needed = max(2, needed_seeds(a, b, metric, d, None, level, margin) or 2)
    elif (
        (low > 0 or high < 0)
        and single_run(a, b)
        and metric in luck.irregular
        and not far_beyond_gap(diff, luck, metric)
    ):
        out.why = (
            f"the {_pct(level)} interval excludes 0, but {luck.irregular[metric]}: one run a side may have fallen "
            "in the other mode, so it cannot tell a bad seed from a bad change"
        )
        out.seeds_needed = max(3, needed_seeds(a, b, metric, d, var, level, margin) or 3)
    elif (low > 0 or high < 0) and single_run_within_gap(a, b, diff, luck.seed_gap.get(metric)):
        gap, lo, hi = luck.seed_gap[metric]
        out.why = (
            f"the {_pct(level)} interval excludes 0, but with one run a side the gap ({diff:+.4g}) is within the "
            f"widest gap seen between two seeds of the reference ({gap:.4g}: {lo:.4g} to {hi:.4g}): one unlucky run "
            "could make it"
        )
        out.seeds_needed = max(2, needed_seeds(a, b, metric, d, var, level, margin) or 2)
    elif low > 0 or high < 0:
        out.outcome = "better" if (diff > 0) == higher else "worse"
        out.why = f"the {_pct(level)} interval excludes 0"
    elif -margin < low and high < margin:
        out.outcome = "equivalent"
        out.why = f"the {_pct(level)} interval lies inside +-{margin:g}"
    else:
        out.why = f"the {_pct(level)} interval holds 0 and reaches beyond +-{margin:g}"
        out.seeds_needed = needed_seeds(a, b, metric, d, var, level, margin)
    return out


def single_run_within_gap(a: ArmRuns, b: ArmRuns, diff: float, gap: tuple[float, float, float] | None) -> bool:
    """A trained side of one run, and a gap no wider than the widest between two seeds of the
    reference: one run can fall in another mode of the seeds (docs/decisions.md, "One run a side")."""
    return single_run(a, b) and gap is not None and abs(diff) <= gap[0]


def far_beyond_gap(diff: float, luck: Luck, metric: str) -> bool:
    """A difference more than GUARD_MULTIPLE times the widest gap between two reference seeds: not
    something a seed of the other mode could make, so the guard for modes lets it through."""
    gap = luck.seed_gap.get(metric)
    return gap is not None and gap[0] > 0 and abs(diff) > GUARD_MULTIPLE * gap[0]


def single_run(a: ArmRuns, b: ArmRuns) -> bool:
    """A trained side of one run: its luck is one draw, which no spread can pin down."""
    return any(x.runs == 1 for x in (a, b) if not x.deterministic)


def needed_seeds(
    a: ArmRuns, b: ArmRuns, metric: str, d: np.ndarray, var: SeedVar | None, level: float, margin: float
) -> int | None:
    """About how many seeds per arm would settle it, if the difference stays what it is now: the
    fewest n, more than the runs there are, whose interval (a t distribution with the degrees of
    freedom n seeds would give) excludes 0 or fits in the margin. None when no number of seeds up
    to MAX_SEEDS_ESTIMATE would (the test items' own luck is wider than both)."""
    trained = [x for x in (a, b) if not x.deterministic]
    n_items = max(len(d), 1)
    inter = var.interaction if var is not None else 0.0
    run_var = var.run_var if var is not None else 0.0
    now = sum(1.0 / x.runs for x in trained)
    item_part = max(0.0, float(np.var(d, ddof=1)) - inter * now) if len(d) > 1 else 0.0  # the items' own
    diff = abs(float(d.mean()))
    have = max((x.runs for x in trained), default=1)
    df_now = var.df if var is not None else 0
    for n in range(have + 1, MAX_SEEDS_ESTIMATE + 1):
        c = len(trained) / n
        df = max(1, df_now + len(trained) * (n - have))
        q = sps.t.ppf(1 - (1 - level) / 2, df)
        half = q * math.sqrt(item_part / n_items + run_var * c)
        if half < diff or half < margin - diff:
            return n
    return None


def compare_arms(
    a: ArmRuns,
    b: ArmRuns,
    references: Sequence = (),
    level: float = CONFIDENCE,
    margins: Mapping[str, float] | None = None,
    metrics: Sequence[str] = METRICS,
    *,
    resamples: int,
    seed: int,
) -> tuple[dict[str, Decision], Luck]:
    luck = luck_for(a, b, references=references)
    margins = {**MARGINS, **(margins or {})}
    out = {m: compare_metric(a, b, m, luck, level, margins[m], resamples=resamples, seed=seed) for m in metrics}
    return out, luck


def arm_interval(
    x: ArmRuns, metric: str, var: SeedVar | None, level: float = CONFIDENCE, *, resamples: int, seed: int
) -> tuple[float, float, float]:
    """(mean, low, high) of one arm's mean: the items' luck and (var given) its seeds'."""
    m = _arm_mean(x, metric)
    low, high = interval(draws(m, var, (x,), resamples, seed), level)
    return float(m.mean()), low, high


def interval(sample: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` interval of the draws, each end taken outward (no interpolation
    between draws: the interval is never narrower than the draws say)."""
    tail = (1 - level) / 2 * 100
    return float(np.percentile(sample, tail, method="lower")), float(np.percentile(sample, 100 - tail, method="higher"))


# --------------------------------------------------------------------------- sequential looks


def alpha_spending(looks: int, alpha: float = 1 - CONFIDENCE) -> list[float]:
    """Per-look error rates for `looks` planned looks whose sum is alpha: by look k, alpha *
    ln(1 + (e - 1) t) of it is spent, t = k / looks. Why this curve, and why stopping at the first
    decisive look keeps the error rate <= alpha: docs/decisions.md ("./dev decide")."""
    if looks < 1:
        raise ValueError(f"looks must be >= 1; got {looks}")
    spent = [alpha * math.log(1 + (math.e - 1) * k / looks) for k in range(looks + 1)]
    return [spent[k] - spent[k - 1] for k in range(1, looks + 1)]


@dataclass(frozen=True)
class SequentialPlan:
    """Looks after each of up to `max_pairs` seed pairs, the first after pair `first_look` (1 when
    a seed-variance reference gives the seed spread from the start, else 2), each at the level
    that alpha_spending gives it."""

    max_pairs: int
    first_look: int
    alpha: float = 1 - CONFIDENCE

    def __post_init__(self) -> None:
        if not 1 <= self.first_look <= self.max_pairs:
            raise ValueError(f"the first look ({self.first_look}) must come within the {self.max_pairs} pairs")

    @property
    def levels(self) -> dict[int, float]:
        spend = alpha_spending(self.max_pairs - self.first_look + 1, self.alpha)
        return {self.first_look + k: 1 - a for k, a in enumerate(spend)}


def look(
    plan: SequentialPlan,
    pairs: int,
    a: ArmRuns,
    b: ArmRuns,
    metric: str,
    references: Sequence = (),
    margin: float | None = None,
    *,
    resamples: int,
    seed: int,
) -> Decision | None:
    """The look after `pairs` seed pairs (each arm `pairs` runs), or None when none is due: not in
    the plan, or no seed spread yet (no matching reference before each arm has 2 runs). A caller
    stops at the first look whose outcome is not "inconclusive"."""
    level = plan.levels.get(pairs)
    if level is None:
        return None
    luck = luck_for(a, b, references=references)
    if not luck.covers_seeds:
        return None
    return compare_metric(a, b, metric, luck, level, margin, resamples=resamples, seed=seed)


def _pct(level: float) -> str:
    text = f"{level * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text} %"
