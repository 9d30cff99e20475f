import numpy as np
import pytest
import torch

from pipeline.bridge import TextBridge, nearest
from pipeline.evaluation import ridge_fit, ridge_predict, score, text_bank


def test_text_bank_embeds_each_distinct_text_once():
    texts = ["a", "b", "a", "c", "b"]
    emb = np.arange(10, dtype=np.float32).reshape(5, 2)
    bank_texts, bank, row_to_bank = text_bank(texts, emb)
    assert bank_texts == ["a", "b", "c"]
    np.testing.assert_array_equal(bank, emb[[0, 1, 3]])
    np.testing.assert_array_equal(row_to_bank, [0, 1, 0, 2, 1])


def test_score_perfect_and_wrong_predictions():
    rng = np.random.default_rng(0)
    targets = rng.normal(size=(20, 8)).astype(np.float32)
    bank, row_to_bank = targets, np.arange(20)
    perfect = score(targets, targets, bank, row_to_bank)
    assert perfect["cosine"] == pytest.approx(1.0, abs=1e-6) and perfect["mse"] == pytest.approx(0.0, abs=1e-9)
    assert perfect["top1"] == 1.0 and perfect["top5"] == 1.0
    # Predicting the next row's target: top-1 never right, cosine near 0 on random vectors.
    shifted = score(np.roll(targets, 1, axis=0), targets, bank, row_to_bank)
    assert shifted["top1"] == 0.0 and abs(shifted["cosine"]) < 0.3


def test_topk_counts_a_hit_anywhere_in_the_first_k():
    bank = np.eye(6, dtype=np.float32)
    # Each prediction is nearest to bank row 0, second-nearest to its own target row.
    pred = np.eye(6, dtype=np.float32) * 0.5
    pred[:, 0] += 1.0
    res = score(pred[[1, 2, 3]], bank[[1, 2, 3]], bank, np.array([1, 2, 3]), ks=(1, 2))
    assert res["top1"] == 0.0 and res["top2"] == 1.0


def test_ridge_recovers_a_linear_map():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 6))
    w_true = rng.normal(size=(6, 4))
    y = x @ w_true + 3.0  # with a bias
    w = ridge_fit(x, y, alpha=1e-6)
    np.testing.assert_allclose(ridge_predict(w, x), y, atol=1e-3)


def test_decode_surface_batch_returns_nearest_texts_for_the_whole_batch():
    bank = torch.eye(3)
    texts = ["zero", "one", "two"]
    pred = torch.tensor([[0.1, 0.9, 0.0], [0.0, 0.2, 0.8]])
    assert TextBridge.decode_surface_batch(pred, bank, texts, k=2) == [["one", "zero"], ["two", "one"]]
    assert nearest(pred, bank, 10).shape == (2, 3)  # k capped at the bank size


def test_ridge_fit_in_row_blocks_equals_the_direct_solution(monkeypatch):
    from pipeline import evaluation

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(1000, 6)), rng.normal(size=(1000, 4))
    whole = evaluation.ridge_fit(x, y, 0.5)
    monkeypatch.setattr(evaluation, "RIDGE_CHUNK", 128)  # 8 blocks, the last one short
    assert np.allclose(evaluation.ridge_fit(x, y, 0.5), whole, rtol=1e-10, atol=1e-12)
    x64 = np.hstack([x, np.ones((1000, 1))])
    reg = 0.5 * np.eye(7)
    reg[-1, -1] = 0
    assert np.allclose(whole, np.linalg.solve(x64.T @ x64 + reg, x64.T @ y))
