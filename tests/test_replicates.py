"""Decisions on real replicates: the item tables of runs that differ only in their seed.

tests/data/replicates/ holds item tables (the model's columns and the metadata) of real runs made
by `./dev seeds --tables DIR` (tools/seeds.py), trained once and kept: 20 seeds of the smoke
preset, 10 of the smoke preset with the linear path (`-S model.residual=linear`) and, when
present, 8 of the default preset. On them:

- A/A: every pair of single runs of one arm, compared with the seed spread measured from the
  other seeds of the arm (as the committed reference would give it) must be called better or
  worse at most 5 % of the time; the item-only interval (what `./dev compare` did before seeds
  were counted) is printed beside it, far above;
- the same with 3 runs a side (disjoint splits of the seeds), with and without a reference;
- power: the linear path against the prototype's model is found better from one seed a side on
  the retrieval metrics, from two on cosine too, and by the sequential decision at its first look.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from pipeline.stats.decision import ArmRuns, SequentialPlan, compare_metric, look, luck_for
from pipeline.stats.item_sources import Source, predictor_table, runs_values, shared_ids
from pipeline.stats.item_tables import read_items
from pipeline.stats.seed_variance import measure

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "data" / "replicates"
RESAMPLES = 1000
SEED = 20261123  # the bootstrap seed the first look's check was written with
# The metrics the A/A rates are printed for: continuous, and the retrieval headline.
SHOWN = ("cosine", "mse", "group_top1", "mrr")


def load_arm(name: str) -> tuple[list[int], dict[str, np.ndarray], object]:
    """(seeds, metric -> runs x items, the first table's metadata) of a fixture directory."""
    tables, metas = [], []
    for path in sorted((FIXTURES / name).glob("seed-*.parquet"), key=lambda p: int(p.stem.split("-")[1])):
        table, meta = read_items(path)
        tables.append(predictor_table(Source(path.name, path.name, "file", str(path), table)))
        metas.append(meta)
    assert tables, f"no fixture tables in {FIXTURES / name}"
    values = runs_values(tables, shared_ids(tables))
    return [m.seed for m in metas], values, metas[0]


def pick(values: dict, rows) -> dict:
    return {m: v[list(rows)] for m, v in values.items()}


def reference_from(values: dict, rows) -> object:
    rows = list(rows)
    return measure("fixture", "data", {"digest": "x", "name": "x"}, rows, pick(values, rows), {})


def aa_single_pairs(values: dict, share: int = 3, metrics=SHOWN) -> dict[str, dict[str, float]]:
    """Over every pair of single runs (share 3) or a fixed random third of them (share 1): the
    share called better or worse, with the seed spread of the other runs as the reference, and by
    the item-only interval. A pair's bootstrap seed is its index among all pairs, so a sampled
    pair is decided as in the full check."""
    k = next(iter(values.values())).shape[0]
    new = {m: 0 for m in metrics}
    old = {m: 0 for m in metrics}
    pairs = list(enumerate(itertools.combinations(range(k), 2)))
    if share < 3:
        rows = np.random.default_rng(SEED).choice(len(pairs), size=len(pairs) * share // 3, replace=False)
        pairs = [pairs[r] for r in sorted(rows)]
    for n, (i, j) in pairs:
        ref = reference_from(values, [r for r in range(k) if r not in (i, j)])
        a, b = ArmRuns("A", [i], pick(values, [i])), ArmRuns("B", [j], pick(values, [j]))
        luck = luck_for(a, b, references=[ref])
        item_only = luck_for(ArmRuns("A", [i], a.values, True), ArmRuns("B", [j], b.values, True))
        for m in metrics:
            new[m] += compare_metric(a, b, m, luck, resamples=RESAMPLES, seed=n).outcome in ("better", "worse")
            d = compare_metric(a, b, m, item_only, resamples=RESAMPLES, seed=n)
            old[m] += d.low > 0 or d.high < 0
    return {m: {"new": new[m] / len(pairs), "old": old[m] / len(pairs), "pairs": len(pairs)} for m in metrics}


def aa_splits(
    values: dict, per_side: int, splits: int, seed: int = 0, metrics=SHOWN, with_reference: bool = False
) -> dict[str, float]:
    """Disjoint random splits of the runs into two sides of per_side runs; with_reference: the
    remaining runs give the seed-variance reference (as a committed one would)."""
    rng = np.random.default_rng(seed)
    k = next(iter(values.values())).shape[0]
    calls = {m: 0 for m in metrics}
    for n in range(splits):
        rows = rng.permutation(k)
        a = ArmRuns("A", list(rows[:per_side]), pick(values, rows[:per_side]))
        b = ArmRuns("B", list(rows[per_side : 2 * per_side]), pick(values, rows[per_side : 2 * per_side]))
        refs = [reference_from(values, rows[2 * per_side :])] if with_reference else []
        luck = luck_for(a, b, references=refs)
        for m in metrics:
            calls[m] += compare_metric(a, b, m, luck, resamples=RESAMPLES, seed=n).outcome in ("better", "worse")
    return {m: c / splits for m, c in calls.items()}


def _print(capsys, title: str, rates: dict) -> None:
    with capsys.disabled():
        print(f"\n{title}")
        for m, r in rates.items():
            if isinstance(r, dict):
                print(f"  {m:<11} new {r['new']:.3f}   item-only (old) {r['old']:.3f}   ({r['pairs']} pairs)")
            else:
                print(f"  {m:<11} {r:.3f}")


def test_fixtures_are_replicates_of_one_arm_each():
    for name in ("smoke", "smoke-residual-linear"):
        metas = [read_items(p)[1] for p in (FIXTURES / name).glob("seed-*.parquet")]
        assert len({m.arm_digest for m in metas}) == 1 and len({m.data for m in metas}) == 1, name
        assert len({m.seed for m in metas}) == len(metas) >= 10, name


# The A/A rates on real runs: a third of the pairs (or splits) in the unit tier, all of them among
# the slow checks. Over a sample of n the bound widens by two standard errors of a 5 % rate
# estimated from n draws (sqrt(0.05 * 0.95 / n)): the sample's own noise, not the method's; the
# full check keeps the exact bound.
AA_SHARE = [pytest.param(1, id="sampled"), pytest.param(3, id="all", marks=pytest.mark.slow)]


def _aa_bound(n: int, share: int) -> float:
    return 0.05 + (2 * np.sqrt(0.05 * 0.95 / n) if share < 3 else 1e-9)


@pytest.mark.parametrize("share", AA_SHARE)
def test_smoke_aa_single_seed_pairs_are_rarely_called_and_far_less_than_item_only(capsys, share):
    seeds, values, _ = load_arm("smoke")
    rates = aa_single_pairs(values, share)
    _print(capsys, f"A/A on {len(seeds)} real smoke runs, one run a side (better/worse at 95 %):", rates)
    for m, r in rates.items():
        assert r["new"] <= _aa_bound(r["pairs"], share), (m, r)
    assert max(r["old"] for r in rates.values()) > 0.3  # what counting seeds protects against


@pytest.mark.parametrize("share", AA_SHARE)
def test_smoke_aa_three_runs_a_side_with_the_other_seeds_as_reference(capsys, share):
    _, values, _ = load_arm("smoke")
    splits = 50 * share
    rates = aa_splits(values, 3, splits, with_reference=True)
    _print(capsys, "A/A on real smoke runs, 3 runs a side, the other 14 as reference (better/worse at 95 %):", rates)
    for m, r in rates.items():
        assert r <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / splits), (m, r)


@pytest.mark.parametrize("share", AA_SHARE)
def test_aa_three_runs_a_side_without_a_reference(capsys, share):
    """Without a reference the seed spread is the sides' own, a t interval on 3 + 3 runs: it holds
    where a seed's luck is bell-shaped (the smoke preset with the linear path); where seeds split
    into modes, 3 runs a side are too few to see it (the prototype smoke preset's mse: printed
    by the full check, documented in docs/experiments.md, not asserted)."""
    _, linear, _ = load_arm("smoke-residual-linear")
    splits = 50 * share
    rates = aa_splits(linear, 3, splits)
    _print(capsys, "A/A, smoke with the linear path, 3 runs a side, no reference (better/worse at 95 %):", rates)
    for m, r in rates.items():
        assert r <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / splits), (m, r)
    if share == 3:
        _, bimodal, _ = load_arm("smoke")
        _print(capsys, "A/A, prototype smoke (bimodal seeds), 3 runs a side, no reference:", aa_splits(bimodal, 3, 150))


@pytest.mark.skipif(not (FIXTURES / "default").is_dir(), reason="no default-preset replicate tables kept")
@pytest.mark.parametrize("share", AA_SHARE)
def test_default_aa_single_seed_pairs(capsys, share):
    seeds, values, _ = load_arm("default")
    rates = aa_single_pairs(values, share)
    _print(capsys, f"A/A on {len(seeds)} real default runs, one run a side (better/worse at 95 %):", rates)
    for m, r in rates.items():
        assert r["new"] <= _aa_bound(r["pairs"], share), (m, r)


def test_the_linear_path_is_found_better_than_the_prototype(capsys):
    """Power: the linear path against the prototype's model (smoke). From one seed a side, on the
    retrieval metrics, and on cosine too: the prototype's seeds split into modes there (one run
    could be an unlucky one: the guard of decision.single_run), but the gain (+0.35) is more than
    GUARD_MULTIPLE times the widest gap between two reference seeds (0.087), which no unlucky seed
    makes; from 2 seeds a side; and by the sequential decision at its first look."""
    _, none, _ = load_arm("smoke")
    seeds, linear, _ = load_arm("smoke-residual-linear")
    ref = reference_from(none, range(2, 20))
    called = {m: 0 for m in ("cosine", "group_top1", "mrr")}
    for s in range(len(seeds)):
        a, b = ArmRuns("none", [0], pick(none, [s])), ArmRuns("linear", [s], pick(linear, [s]))
        luck = luck_for(a, b, references=[ref])
        for m in called:
            called[m] += compare_metric(a, b, m, luck, resamples=RESAMPLES, seed=s).outcome == "better"
    pairs = {m: 0 for m in called}
    for s in range(0, len(seeds), 2):
        a = ArmRuns("none", [s, s + 1], pick(none, [s, s + 1]))
        b = ArmRuns("linear", [s, s + 1], pick(linear, [s, s + 1]))
        luck = luck_for(a, b, references=[ref])
        for m in pairs:
            pairs[m] += compare_metric(a, b, m, luck, resamples=RESAMPLES, seed=s).outcome == "better"
    with capsys.disabled():
        print(
            f"\nsmoke, residual none vs linear: called better from one seed a side {called} of {len(seeds)}, "
            f"from two seeds a side {pairs} of {len(seeds) // 2}"
        )
    assert called["group_top1"] == called["mrr"] == called["cosine"] == len(seeds), called
    assert all(c == len(seeds) // 2 for c in pairs.values()), pairs
    plan = SequentialPlan(5, 1)
    a, b = ArmRuns("none", [0], pick(none, [0])), ArmRuns("linear", [0], pick(linear, [0]))
    d = look(plan, 1, a, b, "group_top1", [ref], resamples=RESAMPLES, seed=SEED)
    assert d is not None and d.outcome == "better"
