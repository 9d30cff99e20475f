"""The evaluate stage's baselines beside the model (pipeline/evaluate/retrieval.py): identity,
ridge and nearest (the answer of the nearest training question), scored on the same items; and
the model's intervals widened by the training seed's luck when a seed-variance reference is given."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.answer.bank import build_bank
from pipeline.data.shards import SplitShard
from pipeline.evaluate.retrieval import (
    BASELINES,
    evaluate_split,
    nearest_predict,
    predictions,
    ridge_fit,
    score_items,
)
from pipeline.stats.metrics import METRICS, item_metrics
from pipeline.stats.seed_variance import SeedVar

pytestmark = pytest.mark.unit

# The resamples and seed these checks were written with: the library takes both from its caller.
BOOTSTRAP = {"resamples": 2000, "seed": 20261123}


def make_shard(n: int = 40, dim: int = 16, seed: int = 0, split: str = "test") -> SplitShard:
    """A split of n rows whose targets repeat 10 distinct texts (the retrieval bank)."""
    rng = np.random.default_rng(seed)
    bank = np.random.default_rng(99).normal(size=(10, dim)).astype(np.float32)
    which = np.arange(n) % 10
    texts = np.array([f"target {i}" for i in which], dtype=object)
    return SplitShard(
        split=split,
        ids=np.array([f"{split}{i}" for i in range(n)], dtype=object),
        input_texts=np.array([f"input {i}" for i in range(n)], dtype=object),
        target_texts=texts,
        groups=texts,
        inputs=(bank[which] + rng.normal(0, 0.5, size=(n, dim))).astype(np.float32),
        targets=bank[which],
        dim=dim,
        count=n,
    )


def test_the_baselines_are_identity_ridge_nearest_and_the_trained_mlp():
    assert BASELINES == ("identity", "ridge", "nearest", "mlp")


def _replicates(test, k: int, noise: float, seed: int = 7) -> list[tuple[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(s, (test.targets + rng.normal(0, noise, size=test.targets.shape)).astype(np.float32)) for s in range(k)]


def test_a_trained_baseline_is_the_mean_of_its_replicates_with_their_seed_spread():
    test, train = make_shard(seed=3), make_shard(80, seed=4, split="train")
    rng = np.random.default_rng(2)
    model_pred = (test.targets + rng.normal(0, 0.3, size=test.targets.shape)).astype(np.float32)
    preds = predictions(model_pred, test, ridge_fit(train.inputs, train.targets, 1.0), train)
    bank = build_bank([train, test])
    reps = _replicates(test, 3, 0.3)
    flat, est, items = evaluate_split("test", preds, test, bank, **BOOTSTRAP, replicates={"mlp": reps})
    each = [item_metrics(score_items(p, test, bank)) for _, p in reps]
    for m in METRICS:  # the mean over replicates of the per-item values
        assert flat[f"eval/test/mlp/{m}"] == round(float(np.mean([e[m].mean() for e in each])), 6)
    assert flat["eval/test/mlp/replicates"] == 3 and flat["eval/test/model_vs_mlp/ci_covers_seeds"] == 0
    # Every replicate in the item table, under its seed; no column of the mean.
    assert {f"mlp.{s}_{c}" for s in range(3) for c in ("rank", "group_rank", "cosine", "mse")} <= set(items.columns)
    assert "mlp_rank" not in items.columns
    # Its interval carries its replicates' spread: wider than the item bootstrap of the same means alone.
    alone, _, _ = evaluate_split("test", {**preds, "mlp": reps[0][1]}, test, bank, **BOOTSTRAP)

    def width(f, key):
        return f[f"{key}/ci95_high"] - f[f"{key}/ci95_low"]

    assert width(flat, "eval/test/mlp/cosine") > 0 and est["mlp/cosine"].low < est["mlp/cosine"].value


def test_the_model_against_the_mlp_covers_both_models_seeds_only_with_the_models_reference():
    test, train = make_shard(seed=3), make_shard(80, seed=4, split="train")
    model_pred = (test.targets + np.random.default_rng(2).normal(0, 0.3, size=test.targets.shape)).astype(np.float32)
    preds = predictions(model_pred, test, ridge_fit(train.inputs, train.targets, 1.0), train)
    bank = build_bank([train, test])
    reps = {"mlp": _replicates(test, 4, 0.3)}
    luck = {m: SeedVar(0.01**2, 7, 0.02**2, len(test.ids)) for m in METRICS}
    mlp_only, _, _ = evaluate_split("test", preds, test, bank, **BOOTSTRAP, replicates=reps)
    both, _, _ = evaluate_split("test", preds, test, bank, **BOOTSTRAP, seed_luck=luck, replicates=reps)
    covers = "eval/test/model_vs_mlp/ci_covers_seeds"
    assert mlp_only[covers] == 0 and both[covers] == 1

    def width(f, key):
        return f[f"{key}/ci95_high"] - f[f"{key}/ci95_low"]

    key = "eval/test/model_vs_mlp/cosine"
    assert width(both, key) > width(mlp_only, key)  # the model's seed luck added to the MLP's
    assert both[key] == mlp_only[key]  # the difference itself stays
    # The MLP's own interval does not depend on the model's reference.
    assert width(both, "eval/test/mlp/cosine") == width(mlp_only, "eval/test/mlp/cosine")


def test_nearest_is_the_target_of_the_most_similar_training_input_across_blocks(monkeypatch):
    rng = np.random.default_rng(0)
    train_x = rng.normal(size=(50, 8)).astype(np.float32)
    train_y = rng.normal(size=(50, 8)).astype(np.float32)
    queries = train_x[[3, 17, 42]] * 2.5 + 1e-4  # scaled copies: cosine-nearest is the original row
    want = train_y[[3, 17, 42]]
    assert np.array_equal(nearest_predict(train_x, train_y, queries), want)
    # Blocks smaller than the data (a training split larger than memory is read block by block):
    # the same answer; an earlier block wins ties.
    monkeypatch.setattr("pipeline.evaluate.retrieval.NEAREST_BLOCK", 7)
    assert np.array_equal(nearest_predict(train_x, train_y, queries), want)
    twins = np.concatenate([train_x, train_x])  # every row twice: the first copy's target
    assert np.array_equal(nearest_predict(twins, np.concatenate([train_y, -train_y]), queries), want)


def test_evaluate_split_scores_the_nearest_baseline_when_the_train_split_is_given():
    test, train = make_shard(seed=1), make_shard(80, seed=2, split="train")
    rng = np.random.default_rng(1)
    model_pred = (test.targets + rng.normal(0, 0.1, size=test.targets.shape)).astype(np.float32)
    w = ridge_fit(train.inputs, train.targets, alpha=1.0)
    bank = build_bank([train, test])
    without, _, _ = evaluate_split("test", predictions(model_pred, test, w), test, bank, **BOOTSTRAP)
    with_nearest, _, items = evaluate_split("test", predictions(model_pred, test, w, train), test, bank, **BOOTSTRAP)
    keys = {k for k in with_nearest if k.startswith(("eval/test/nearest/", "eval/test/model_vs_nearest/"))}
    assert {f"eval/test/nearest/{m}" for m in METRICS} <= keys and not keys & set(without)
    assert {k: with_nearest[k] for k in without} == without  # the rest unchanged (the same resamples)
    expected = item_metrics(score_items(nearest_predict(train.inputs, train.targets, test.inputs), test, bank))
    assert {m: with_nearest[f"eval/test/nearest/{m}"] for m in METRICS} == {
        m: round(float(expected[m].mean()), 6) for m in METRICS
    }
    assert "nearest_rank" in items.columns and "nearest_group_rank" in items.columns
    # The inputs are noisy copies of their targets: their nearest training row has the same answer.
    assert with_nearest["eval/test/nearest/group_top1"] == 1.0


def test_a_seed_reference_widens_the_models_intervals_and_says_so():
    test, train = make_shard(seed=3), make_shard(80, seed=4, split="train")
    rng = np.random.default_rng(2)
    model_pred = (test.targets + rng.normal(0, 0.3, size=test.targets.shape)).astype(np.float32)
    preds = predictions(model_pred, test, ridge_fit(train.inputs, train.targets, 1.0), train)
    bank = build_bank([train, test])
    items_only, _, _ = evaluate_split("test", preds, test, bank, **BOOTSTRAP)
    luck = {m: SeedVar(0.01**2, 7, 0.02**2, len(test.ids)) for m in METRICS}
    covered, _, _ = evaluate_split("test", preds, test, bank, **BOOTSTRAP, seed_luck=luck)
    assert items_only["eval/test/ci_covers_seeds"] == 0 and covered["eval/test/ci_covers_seeds"] == 1

    def width(flat, key):
        return flat[f"{key}/ci95_high"] - flat[f"{key}/ci95_low"]

    for key in ("eval/test/model/cosine", "eval/test/model_vs_ridge/cosine"):
        assert width(covered, key) > width(items_only, key), key
    for key in ("eval/test/ridge/cosine", "eval/test/identity/group_top1"):  # no training, no seed luck
        assert width(covered, key) == width(items_only, key), key
    assert covered["eval/test/model/cosine"] == items_only["eval/test/model/cosine"]  # the means stay


def test_evaluate_split_val_means_only():
    shard = make_shard(seed=5, split="val")
    w = ridge_fit(shard.inputs, shard.targets, alpha=1.0)
    out, est, _ = evaluate_split(
        "val", predictions(np.asarray(shard.inputs), shard, w), shard, build_bank([shard]), **BOOTSTRAP, with_ci=False
    )
    assert est == {} and not any(k.endswith(("ci95_low", "ci95_high")) for k in out)
    # The model predicted the inputs: it scores exactly like the identity baseline.
    assert all(out[f"eval/val/model/{m}"] == out[f"eval/val/identity/{m}"] for m in METRICS)
