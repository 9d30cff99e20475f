from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.answer.bank import build_bank
from pipeline.evaluate.retrieval import (
    evaluate_split,
    predictions,
    ridge_fit,
    ridge_predict,
    score_items,
)
from pipeline.stats.bootstrap import Estimate, intervals, p_value, resample_means, verdict
from pipeline.stats.metrics import METRICS, item_metrics

pytestmark = pytest.mark.unit

# The resamples and seed these checks were written with: the library takes both from its caller.
BOOTSTRAP = {"resamples": 2000, "seed": 20261123}


def split_of(name, texts, groups, vectors, ids=None):
    """A split as the evaluation reads it (SplitShard's fields that it uses)."""
    n = len(texts)
    return SimpleNamespace(
        split=name,
        ids=np.array(ids or [f"{name}{i}" for i in range(n)], dtype=object),
        input_texts=np.array([f"q {t}" for t in texts], dtype=object),
        target_texts=np.array(texts, dtype=object),
        groups=np.array(groups, dtype=object),
        targets=np.asarray(vectors, dtype=np.float32),
        inputs=np.asarray(vectors, dtype=np.float32),
        count=n,
    )


def test_bank_holds_every_distinct_target_of_every_split_once_with_its_groups():
    eye = np.eye(4, dtype=np.float32)
    train = split_of("train", ["a", "b", "a"], ["g1", "g2", "g1"], eye[[0, 1, 0]])
    test = split_of("test", ["c", "b"], ["g1", "g2"], eye[[2, 1]])
    bank = build_bank([train, test])
    assert bank.texts == ["a", "b", "c"] and bank.size == 3
    assert bank.ids == ["train0", "train1", "test0"]  # the first row holding each text
    assert {g: list(m) for g, m in bank.group_members.items()} == {"g1": [0, 2], "g2": [1]}
    np.testing.assert_allclose(bank.vectors.norm(dim=1).numpy(), 1.0, atol=1e-6)


def test_exact_and_group_ranks_and_the_metrics_they_give():
    # Bank: 4 orthogonal texts; "a" and "b" answer one fact (group f), "c" and "d" are others.
    eye = np.eye(4, dtype=np.float32)
    train = split_of("train", ["a", "b", "c", "d"], ["f", "f", "c", "d"], eye)
    test = split_of("test", ["a", "c"], ["f", "c"], eye[[0, 2]])
    bank = build_bank([train, test])
    # Item 0 (target a) predicts b: an exact miss (rank 2) but a group hit (b is its fact).
    # Item 1 (target c) predicts mostly d, then c: rank 2 either way.
    pred = np.array([[0.2, 1.0, 0, 0], [0, 0, 0.5, 1.0]], dtype=np.float32)
    sc = score_items(pred, test, bank)
    assert list(sc["rank"]) == [2, 2] and list(sc["group_rank"]) == [1, 2]
    assert [bank.ids[j] for j in sc["top"][0][:2]] == ["train1", "train0"]
    m = item_metrics(sc)
    assert list(m["top1"]) == [0, 0] and list(m["group_top1"]) == [1, 0] and list(m["top5"]) == [1, 1]
    assert list(m["mrr"]) == [1.0, 0.5]
    # Without groups (each text its own group) the group metrics are the exact ones.
    plain = split_of("test", ["a", "c"], ["a", "c"], eye[[0, 2]])
    bank2 = build_bank([split_of("train", ["a", "b", "c", "d"], ["a", "b", "c", "d"], eye), plain])
    assert list(score_items(pred, plain, bank2)["group_rank"]) == [2, 2]


def test_perfect_and_wrong_predictions_score_as_expected():
    rng = np.random.default_rng(0)
    targets = rng.normal(size=(20, 8)).astype(np.float32)
    split = split_of("test", [f"t{i}" for i in range(20)], [f"t{i}" for i in range(20)], targets)
    bank = build_bank([split])
    perfect = item_metrics(score_items(targets, split, bank))
    assert perfect["cosine"].mean() == pytest.approx(1.0, abs=1e-6) and perfect["mse"].mean() == pytest.approx(
        0, abs=1e-9
    )
    assert perfect["top1"].mean() == 1.0 and perfect["group_top5"].mean() == 1.0 and perfect["mrr"].mean() == 1.0
    shifted = item_metrics(score_items(np.roll(targets, 1, axis=0), split, bank))
    assert shifted["top1"].mean() == 0.0 and abs(shifted["cosine"].mean()) < 0.3


def test_evaluate_split_gives_values_cis_and_paired_differences_under_eval_keys():
    rng = np.random.default_rng(4)
    n, dim = 120, 16
    targets = rng.normal(size=(n, dim)).astype(np.float32)
    split = split_of("test", [f"t{i}" for i in range(n)], [f"g{i // 2}" for i in range(n)], targets)
    split.inputs = (targets + rng.normal(0, 1.5, size=targets.shape)).astype(np.float32)
    w = ridge_fit(split.inputs, split.targets, 1.0)
    model_pred = (targets + rng.normal(0, 0.3, size=targets.shape)).astype(np.float32)
    flat, est, items = evaluate_split(
        "test", predictions(model_pred, split, w, None), split, build_bank([split]), resamples=1000, seed=1
    )
    assert flat["eval/test/items"] == n and len(items) == n
    for who in ("model", "identity", "ridge"):
        for m in METRICS:
            v, lo, hi = (flat[f"eval/test/{who}/{m}" + p] for p in ("", "/ci95_low", "/ci95_high"))
            assert lo <= v <= hi, (who, m)
    # The model (noise 0.3) is far better than identity (noise 1.5): the paired CI says so.
    d = est["model_vs_identity/group_top1"]
    assert d.value > 0 and d.low > 0 and d.p_value < 0.01
    assert flat["eval/test/model_vs_identity/group_top1/p_value"] == round(d.p_value, 6)
    assert not any(k.startswith(("test/", "val/", "baseline/")) for k in flat)  # train's keys are train's
    assert list(items.columns[:9]) == ["id", "group", "input", "target", "rank", "group_rank", "cosine", "mse", "top5"]
    assert {"identity_rank", "ridge_group_rank", "ridge_cosine"} <= set(items.columns)
    # The same seed gives the same numbers, run after run.
    again, _, _ = evaluate_split(
        "test", predictions(model_pred, split, w, None), split, build_bank([split]), resamples=1000, seed=1
    )
    assert again == flat


def test_val_gets_means_without_intervals():
    rng = np.random.default_rng(5)
    t = rng.normal(size=(30, 8)).astype(np.float32)
    split = split_of("val", [f"t{i}" for i in range(30)], [f"t{i}" for i in range(30)], t)
    flat, est, _ = evaluate_split(
        "val",
        predictions(t, split, ridge_fit(t, t, 1.0)),
        split,
        build_bank([split]),
        resamples=1000,
        seed=BOOTSTRAP["seed"],
        with_ci=False,
    )
    assert est == {} and flat["eval/val/model/top1"] == 1.0 and not any("ci95" in k for k in flat)


# ---------------------------------------------------------------- the paired bootstrap


def mean_ci(values, resamples: int, seed: int) -> Estimate:
    low, high = intervals(resample_means(values, resamples, seed)[:, 0])
    return Estimate(float(np.mean(values)), float(low), float(high))


def paired_difference(a, b, resamples: int, seed: int) -> Estimate:
    """mean(a) - mean(b) over the same items: resampled as the evaluate stage does its differences."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    means = resample_means(diff, resamples, seed)[:, 0]
    low, high = intervals(means)
    return Estimate(float(diff.mean()), float(low), float(high), p_value(diff, means))


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_items():
    rng = np.random.default_rng(0)
    small, large = rng.random(100) < 0.7, rng.random(10_000) < 0.7
    a, b = mean_ci(small, **BOOTSTRAP), mean_ci(large, **BOOTSTRAP)
    assert a.low < a.value < a.high and b.low < b.value < b.high
    assert (b.high - b.low) < (a.high - a.low) / 5  # ~1/sqrt(100) as wide
    assert b.low < 0.7 < b.high


def test_paired_difference_sees_a_small_consistent_gain_that_unpaired_intervals_hide():
    rng = np.random.default_rng(1)
    base = rng.random(500)
    better = base + 0.01  # the same items, each a little better
    unpaired_a, unpaired_b = mean_ci(base, **BOOTSTRAP), mean_ci(better, **BOOTSTRAP)
    assert unpaired_a.high > unpaired_b.low  # the separate intervals overlap
    d = paired_difference(better, base, **BOOTSTRAP)
    assert d.value == pytest.approx(0.01) and d.low > 0 and d.p_value < 0.01
    assert "beats" in verdict(d, "B", "A", "cosine")
    same = paired_difference(base, base, **BOOTSTRAP)
    assert (same.value, same.p_value) == (0.0, 1.0) and "no significant difference" in verdict(same, "B", "A", "x")
    assert "beats" in verdict(paired_difference(base, better, **BOOTSTRAP), "B", "A", "mse", higher_is_better=False)


def test_resampling_is_seeded_and_chunked_without_changing_the_draws(monkeypatch):
    from pipeline.stats import bootstrap as eval_stats

    x = np.random.default_rng(2).random((300, 2))
    whole = resample_means(x, 1000, seed=3)
    assert np.array_equal(whole, resample_means(x, 1000, seed=3))
    assert not np.array_equal(whole, resample_means(x, 1000, seed=4))
    monkeypatch.setattr(eval_stats, "_CELLS", 300 * 7)  # 7 resamples a block, the last one short
    assert np.allclose(resample_means(x, 1000, seed=3), whole, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no items"):
        resample_means(np.zeros((0, 1)), 10, BOOTSTRAP["seed"])


def test_ridge_recovers_a_linear_map():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 6))
    w_true = rng.normal(size=(6, 4))
    y = x @ w_true + 3.0  # with a bias
    w = ridge_fit(x, y, alpha=1e-6)
    np.testing.assert_allclose(ridge_predict(w, x), y, atol=1e-3)


def test_ridge_fit_in_row_blocks_equals_the_direct_solution(monkeypatch):
    from pipeline.evaluate import retrieval as evaluation

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(1000, 6)), rng.normal(size=(1000, 4))
    whole = evaluation.ridge_fit(x, y, 0.5)
    monkeypatch.setattr(evaluation, "RIDGE_CHUNK", 128)  # 8 blocks, the last one short
    assert np.allclose(evaluation.ridge_fit(x, y, 0.5), whole, rtol=1e-10, atol=1e-12)
    x64 = np.hstack([x, np.ones((1000, 1))])
    reg = 0.5 * np.eye(7)
    reg[-1, -1] = 0
    assert np.allclose(whole, np.linalg.solve(x64.T @ x64 + reg, x64.T @ y))
