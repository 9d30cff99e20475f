"""Intervals that cover the test items and the training seeds (pipeline/stats/decision.py,
seed_variance.py): the seed spread from replicates, its reference, the outcomes, the sequential
plan, and the false-positive rate of A/A comparisons in simulation, where the truth is known.

The simulated runs follow the layout the method assumes (pipeline/stats/seed_variance.py): per item a difficulty
shared by every run, per run a shift of the whole run, per run and item the flips, with sizes of
the order measured on the default preset (tests/test_replicates.py checks the same on real runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.stats.decision import (
    ArmRuns,
    SequentialPlan,
    alpha_spending,
    compare_arms,
    compare_metric,
    draws,
    interval,
    look,
    luck_for,
)
from pipeline.stats.metrics import METRICS
from pipeline.stats.seed_variance import Reference, SeedVar, components, measure, pool

pytestmark = pytest.mark.unit

N_ITEMS = 500
# The resamples and seed these checks were written with: the library takes both from its caller.
BOOTSTRAP = {"resamples": 2000, "seed": 20261123}


def runs(rng, k: int, items: np.ndarray, shift: float = 0.0, sd_run: float = 0.004, sd_flip: float = 0.02) -> dict:
    """k runs x items of every metric: cosine-like values (item difficulty + a run's shift + flips),
    a binary hit from a latent of the same parts, mse falling as cosine rises."""
    u = rng.normal(0, sd_run, (k, 1)) + shift
    cos = 0.85 + items + u + rng.normal(0, sd_flip, (k, items.shape[1]))
    hit = ((items + u) * 6 + rng.normal(0, 0.5, (k, items.shape[1])) > -0.2).astype(float)
    out = {m: cos for m in METRICS}
    out.update(group_top1=hit, top1=hit, group_top5=hit, top5=hit, mrr=hit, mse=(1 - cos) / 100)
    return out


def arm(label: str, values: dict, deterministic: bool = False) -> ArmRuns:
    k = next(iter(values.values())).shape[0]
    return ArmRuns(label, list(range(k)), values, deterministic)


def reference_of(values: dict) -> Reference:
    k = next(iter(values.values())).shape[0]
    return measure("sim", "data", {"digest": "x", "name": "sim"}, list(range(k)), values, {})


# --------------------------------------------------------------------------- the seed spread


def test_components_recover_the_run_spread_and_the_flips():
    rng = np.random.default_rng(0)
    items = rng.normal(0, 0.05, (1, 2000))
    x = 0.8 + items + rng.normal(0, 0.01, (40, 1)) + rng.normal(0, 0.03, (40, 2000))
    v = components(x)
    assert v.df == 39 and v.items == 2000
    assert v.interaction == pytest.approx(0.03**2, rel=0.05)
    assert v.run_var == pytest.approx(np.var(x.mean(axis=1), ddof=1))
    assert v.seed_var == pytest.approx(0.01**2, rel=0.35)  # 40 runs: a rough estimate of the shift alone
    # Over other item counts the flips average differently; the whole-run shift does not.
    assert v.run_var_at(500) - v.run_var == pytest.approx(v.interaction * (1 / 500 - 1 / 2000))
    with pytest.raises(ValueError, match="at least 2 x 2"):
        components(x[:1])


def test_pooling_weighs_by_degrees_of_freedom_and_needs_one_estimate():
    a, b = SeedVar(1e-4, 2, 1e-3, 100), SeedVar(4e-4, 6, 1e-3, 100)
    p = pool([a, None, b, SeedVar(1.0, 0, 1.0, 100)], 100)
    assert p.df == 8 and p.run_var == pytest.approx((2 * 1e-4 + 6 * 4e-4) / 8)
    assert pool([None], 100) is None and pool([], 100) is None


def test_the_reference_round_trips_through_its_file_format(tmp_path):
    from pipeline.stats.seed_variance import find_reference, load_references, write_reference

    rng = np.random.default_rng(1)
    ref = reference_of(runs(rng, 6, rng.normal(0, 0.05, (1, 80))))
    ref.preset, ref.data = "mine", "abc"
    write_reference(ref, tmp_path / "mine.json")
    (back,) = load_references(tmp_path)
    assert back.as_dict() == ref.as_dict()
    assert find_reference("mine", "abc", tmp_path).seeds == list(range(6))
    assert find_reference("mine", "other-data", tmp_path) is None and find_reference("smoke", "abc", tmp_path) is None
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(Exception, match="broken.json: not a seed-variance reference"):
        load_references(tmp_path)


# --------------------------------------------------------------------------- outcomes


def test_one_run_a_side_without_a_reference_is_never_better_however_large_the_gap():
    rng = np.random.default_rng(2)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    a, b = arm("A", runs(rng, 1, items)), arm("B", runs(rng, 1, items, shift=0.05))
    decisions, luck = compare_arms(a, b, **BOOTSTRAP)
    assert not luck.covers_seeds and "NOT covered" in luck.describe()
    assert {d.outcome for d in decisions.values()} == {"inconclusive"}
    assert all(not d.covers_seeds and d.seeds_needed >= 2 for d in decisions.values())
    # The same two runs with a reference of the seed spread: now a clear gain is better.
    ref = reference_of(runs(rng, 8, items))
    decisions, luck = compare_arms(a, b, [ref], **BOOTSTRAP)
    assert luck.covers_seeds and "reference" in luck.describe()
    assert decisions["cosine"].outcome == "better" and decisions["mse"].outcome == "better"
    assert decisions["cosine"].prob_b_better > 0.99


def test_equivalent_worse_and_inconclusive():
    rng = np.random.default_rng(3)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    base = runs(rng, 6, items, sd_run=0.0005)
    same = runs(rng, 6, items, sd_run=0.0005)
    luck = luck_for(arm("A", base), arm("B", same))
    d = compare_metric(arm("A", base), arm("B", same), "cosine", luck, margin=0.01, **BOOTSTRAP)
    assert d.outcome == "equivalent" and -0.01 < d.low < d.high < 0.01 and "inside" in d.why
    worse = runs(rng, 6, items, shift=-0.03, sd_run=0.0005)
    luck = luck_for(arm("A", base), arm("B", worse))
    assert compare_metric(arm("A", base), arm("B", worse), "cosine", luck, **BOOTSTRAP).outcome == "worse"
    # lower is better for mse: B's higher mse is worse too.
    assert compare_metric(arm("A", base), arm("B", worse), "mse", luck, **BOOTSTRAP).outcome == "worse"
    # A gap the size of the seed noise with 2 seeds: open, with an estimate of the seeds it takes.
    small = runs(rng, 2, items, shift=0.004, sd_run=0.004)
    two = runs(rng, 2, items, sd_run=0.004)
    d = compare_metric(arm("A", two), arm("B", small), "cosine", luck_for(arm("A", two), arm("B", small)), **BOOTSTRAP)
    assert d.outcome == "inconclusive" and (d.seeds_needed is None or d.seeds_needed > 2)


def test_a_model_against_a_baseline_adds_only_the_models_seed_luck():
    rng = np.random.default_rng(4)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    model = runs(rng, 1, items)
    baseline = {m: v - 0.002 for m, v in runs(rng, 1, items, sd_run=0.0).items()}
    ref = reference_of(runs(rng, 8, items))
    with_seeds, luck = compare_arms(arm("base", baseline, deterministic=True), arm("model", model), [ref], **BOOTSTRAP)
    assert luck.covers_seeds
    base_arm, model_arm = arm("base", baseline, deterministic=True), arm("model", model)
    only_items = compare_metric(base_arm, model_arm, "cosine", luck_for(base_arm, base_arm), **BOOTSTRAP)
    assert with_seeds["cosine"].high - with_seeds["cosine"].low > only_items.high - only_items.low
    # Neither side trained: nothing to cover but the items.
    assert luck_for(base_arm, base_arm).covers_seeds and not luck_for(base_arm, base_arm).needs_seeds


def test_draws_are_deterministic_and_the_interval_is_taken_outward():
    rng = np.random.default_rng(5)
    d = rng.normal(0, 0.02, N_ITEMS)
    var = SeedVar(1e-5, 4, 4e-4, N_ITEMS)
    a, b = arm("A", {"cosine": np.zeros((1, N_ITEMS))}), arm("B", {"cosine": np.zeros((1, N_ITEMS))})
    first, again = draws(d, var, (a, b), 2000, 7), draws(d, var, (a, b), 2000, 7)
    assert np.array_equal(first, again) and not np.array_equal(first, draws(d, var, (a, b), 2000, 8))
    low, high = interval(first, 0.95)
    assert low <= np.percentile(first, 2.5) and high >= np.percentile(first, 97.5)


# --------------------------------------------------------------------------- A/A false positives


def _aa_rate(rng, trials: int, k: int, with_reference: bool, old_method: bool = False) -> float:
    """Share of A/A pairs (k runs a side of one arm) called better or worse on cosine."""
    calls = 0
    for t in range(trials):
        items = rng.normal(0, 0.05, (1, N_ITEMS))
        a, b = arm("A", runs(rng, k, items)), arm("B", runs(rng, k, items))
        refs = [reference_of(runs(rng, 8, items))] if with_reference else []
        if old_method:  # the item-only paired bootstrap (what ./dev compare did before)
            luck = luck_for(arm("A", a.values, True), arm("B", b.values, True))
        else:
            luck = luck_for(a, b, references=refs)
        d = compare_metric(a, b, "cosine", luck, resamples=1000, seed=t)
        if old_method:
            calls += d.low > 0 or d.high < 0
        else:
            calls += d.outcome in ("better", "worse")
    return calls / trials


# The simulated A/A rates: a third of the pairs in the unit tier (the bound widens with the
# simulation's noise), all of them among the slow checks.
AA_TRIALS = [pytest.param(1, id="sampled"), pytest.param(3, id="all", marks=pytest.mark.slow)]


@pytest.mark.parametrize("share", AA_TRIALS)
def test_aa_false_positive_rate_is_at_most_5_percent_and_the_item_only_method_is_far_above(capsys, share):
    rng = np.random.default_rng(20261126)
    trials = 100 * share
    rates = {
        "1 run a side, reference": _aa_rate(rng, trials, 1, True),
        "2 runs a side, no reference": _aa_rate(rng, trials, 2, False),
        "3 runs a side, no reference": _aa_rate(rng, trials, 3, False),
        "1 run a side, item-only interval (the old method)": _aa_rate(rng, trials, 1, False, old_method=True),
    }
    with capsys.disabled():
        print(f"\nA/A 'better/worse' rate at 95 % (simulated, cosine, {trials} pairs each):")
        for what, rate in rates.items():
            print(f"  {what:<52} {rate:.3f}")
    se = math.sqrt(0.05 * 0.95 / trials)
    for what, rate in list(rates.items())[:3]:
        assert rate <= 0.05 + 2 * se, (what, rate)  # at most 5 %, up to the simulation's own noise
    assert rates["1 run a side, item-only interval (the old method)"] > 0.3


# --------------------------------------------------------------------------- sequential looks


def test_alpha_spending_sums_to_alpha_and_spends_early_looks_less():
    spend = alpha_spending(5, 0.05)
    assert sum(spend) == pytest.approx(0.05) and all(s > 0 for s in spend)
    assert spend == sorted(spend, reverse=True)  # a little more early, never nothing
    plan = SequentialPlan(5, 2)
    assert list(plan.levels) == [2, 3, 4, 5] and all(0.95 < lv < 1 for lv in plan.levels.values())
    with pytest.raises(ValueError):
        SequentialPlan(2, 3)
    with pytest.raises(ValueError):
        alpha_spending(0)


def _sequence(rng, plan: SequentialPlan, shift: float, refs: bool, metric: str = "cosine") -> tuple[str, int]:
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    a_all, b_all = runs(rng, plan.max_pairs, items), runs(rng, plan.max_pairs, items, shift=shift)
    references = [reference_of(runs(rng, 8, items))] if refs else []
    for k in range(1, plan.max_pairs + 1):
        a = arm("A", {m: v[:k] for m, v in a_all.items()})
        b = arm("B", {m: v[:k] for m, v in b_all.items()})
        d = look(plan, k, a, b, metric, references, resamples=1000, seed=k)
        if d is not None and d.outcome != "inconclusive":
            return d.outcome, k
    return "inconclusive", plan.max_pairs


@pytest.mark.parametrize("share", AA_TRIALS)
def test_looking_after_every_pair_keeps_aa_false_positives_at_most_5_percent(capsys, share):
    rng = np.random.default_rng(7)
    trials = 200 * share // 3
    outcomes = [_sequence(rng, SequentialPlan(5, 1), 0.0, True)[0] for _ in range(trials)]
    rate = sum(o in ("better", "worse") for o in outcomes) / trials
    with capsys.disabled():
        print(
            f"\nsequential A/A (5 looks, reference): better/worse {rate:.3f}, "
            f"equivalent {outcomes.count('equivalent') / trials:.3f}"
        )
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / trials)


def test_a_real_gain_is_called_better_within_a_few_pairs():
    """A gain of 5 run SDs (0.02 cosine against a run spread of 0.004): found, and early."""
    rng = np.random.default_rng(8)
    results = [_sequence(rng, SequentialPlan(5, 1), 0.02, True) for _ in range(40)]
    assert sum(o == "better" for o, _ in results) >= 38
    assert np.median([k for o, k in results if o == "better"]) <= 2


def test_no_look_before_the_seed_spread_is_known():
    rng = np.random.default_rng(9)
    items = rng.normal(0, 0.05, (1, 100))
    one = arm("A", runs(rng, 1, items))
    plan = SequentialPlan(4, 1)
    assert look(plan, 1, one, one, "cosine", **BOOTSTRAP) is None  # planned, but no reference and one run a side
    assert look(SequentialPlan(4, 2), 1, one, one, "cosine", **BOOTSTRAP) is None  # not planned


# --------------------------------------------------------------------------- which arms a reference covers


def _with_arm(x: ArmRuns, digest: str) -> ArmRuns:
    return ArmRuns(x.label, x.seeds, x.values, x.deterministic, arm=digest)


def test_a_reference_covers_its_own_arm_and_no_other_of_one_run():
    rng = np.random.default_rng(5)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    ref = reference_of(runs(rng, 8, items))  # measured on arm "x"
    a = _with_arm(arm("A", runs(rng, 1, items)), "x")
    b = _with_arm(arm("B", runs(rng, 1, items, shift=0.05)), "other")
    decisions, luck = compare_arms(a, b, [ref], **BOOTSTRAP)
    assert not luck.covers_seeds and {d.outcome for d in decisions.values()} == {"inconclusive"}
    assert "B is another arm than the sim reference's arm (sim [x])" in luck.describe()
    assert (
        "needs replicates of its own, at least 2 runs (3 to test" in luck.describe() and "it has 1" in luck.describe()
    )
    # The same arm on both sides (an A/A comparison of the reference's arm): covered.
    _, same = compare_arms(a, _with_arm(b, "x"), [ref], **BOOTSTRAP)
    assert same.covers_seeds and not same.notes


def test_another_arm_borrows_the_reference_only_when_its_own_runs_share_the_spread():
    rng = np.random.default_rng(6)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    ref = reference_of(runs(rng, 10, items, sd_run=0.004))
    a = _with_arm(arm("A", runs(rng, 3, items)), "x")
    alike = _with_arm(arm("B", runs(rng, 3, items, shift=0.01, sd_run=0.004)), "other")
    luck = luck_for(a, alike, references=[ref])
    assert luck.covers_seeds and any("reference" in s for s in luck.sources) and luck.seed["cosine"].df == 4 + 9
    # Runs that spread ten times wider: an F test tells them apart; their own runs only.
    wide = _with_arm(arm("B", runs(rng, 3, items, sd_run=0.04)), "other")
    luck = luck_for(a, wide, references=[ref])
    assert luck.covers_seeds and any("F test p" in n for n in luck.notes)
    # A keeps the reference (its arm); B has its own 2 degrees of freedom: Welch's, well under 13.
    assert luck.seed["cosine"].df < 4 + 9 and luck.seed["cosine"].run_var > 10 * ref.metrics["cosine"].run_var


def test_the_modes_guard_lets_through_a_difference_far_beyond_the_widest_seed_gap():
    rng = np.random.default_rng(7)
    items = rng.normal(0, 0.05, (1, N_ITEMS))
    seeds = runs(rng, 12, items)
    seeds = {m: v.copy() for m, v in seeds.items()}
    seeds["cosine"][0] -= 0.06  # one seed in another mode: the reference is not bell-shaped on cosine
    ref = reference_of(seeds)
    gap = max(ref.per_seed["cosine"]) - min(ref.per_seed["cosine"])
    assert ref.outliers("cosine")
    a = arm("A", runs(rng, 1, items))
    for shift, outcome in ((2 * gap, "inconclusive"), (4 * gap, "better")):
        b = arm("B", runs(rng, 1, items, shift=shift))
        d = compare_arms(a, b, [ref], metrics=["cosine"], **BOOTSTRAP)[0]["cosine"]
        assert d.outcome == outcome, (shift, d.why)
