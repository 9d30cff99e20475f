"""Answers that know their limits: the confidence rule's calibration on synthetic scores
(pipeline/evaluate/abstention.py), the k distinct facts against a plain reference
(pipeline/answer/ranking.py), banks with and without groups (pipeline/answer/bank.py), how ./dev ask
says an answer is not confident (tools/ask.py), the committed out-of-bank questions, and the
figures the default run measured (metrics/eval.json)."""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest
import torch

from pipeline.answer.bank import AnswerBank, bank_digest, load_bank, save_bank
from pipeline.answer.confidence import ConfidenceRule
from pipeline.answer.ranking import distinct_top, group_sizes, top_and_margin
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.evaluate.abstention import (
    KEY,
    Signals,
    answered,
    calibrate,
    lowest_threshold,
    read_questions,
    score_floor,
)
from tools.ask import UNKNOWN, render

pytestmark = pytest.mark.unit

OUT_OF_BANK = REPO_ROOT / "data" / "out_of_bank_questions.csv"
QA_PAIRS = REPO_ROOT / "data" / "raw" / "qa_pairs.csv"
EVAL_JSON = REPO_ROOT / "metrics" / "eval.json"


# --- calibration ---------------------------------------------------------------------------------


def test_the_threshold_is_the_lowest_score_whose_answered_precision_reaches_the_target():
    # Best first: right, right, wrong, right, wrong, wrong. Precision of the top 1..6: 1, 1, .67, .75, .6, .5
    values = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    right = np.array([1, 1, 0, 1, 0, 0], dtype=bool)
    assert lowest_threshold(values, right, 0.75) == 0.6  # the top 4: 3 of 4 right
    assert lowest_threshold(values, right, 0.9) == 0.8
    assert lowest_threshold(values, right, 0.5) == 0.4  # everything
    assert lowest_threshold(values, right, 1.0) == 0.8
    # Shuffled input: the same answer (the order is the scores', not the items').
    order = np.random.default_rng(0).permutation(6)
    assert lowest_threshold(values[order], right[order], 0.75) == 0.6


def test_tied_scores_are_all_answered_or_all_refused():
    # 0.7 is tied between a right and a wrong answer: cutting between them is not a threshold.
    values = np.array([0.9, 0.7, 0.7, 0.1])
    right = np.array([1, 1, 0, 0], dtype=bool)
    assert lowest_threshold(values, right, 0.9) == 0.9  # top 3 (the tie whole) are 2/3 right
    assert lowest_threshold(values, right, 0.6) == 0.7


def test_no_threshold_reaching_the_target_means_never_confident():
    values, right = np.array([0.9, 0.8, 0.7]), np.array([0, 1, 0], dtype=bool)
    assert lowest_threshold(values, right, 0.9) is None
    rule = calibrate(Signals(values, values), right, 0.9, 1.0)
    assert rule.margin_threshold is None and not rule.confident(np.ones(3), np.ones(3)).any()
    assert answered(rule, Signals(values, values), right)[0] == 0.0
    assert "no threshold" in rule.why_not(0.9, 0.9)
    assert lowest_threshold(np.array([]), np.array([], dtype=bool), 0.9) is None


def test_the_floor_keeps_the_given_share_of_right_answers():
    top = np.linspace(0.0, 0.99, 100)
    right = np.ones(100, dtype=bool)
    right[:10] = False  # the ten lowest are wrong and do not count
    assert score_floor(top, right, 1.0) == pytest.approx(top[10])  # every right answer kept
    floor = score_floor(top, right, 0.9)
    assert (top[right] >= floor).mean() >= 0.9 and (top[right] > floor).mean() < 0.9
    assert score_floor(top, np.zeros(100, dtype=bool), 0.9) == math.inf


def test_calibrated_rule_reaches_the_target_on_its_own_data_and_separates_synthetic_answers():
    """Synthetic val: right answers have large margins, wrong ones small; some questions are out
    of the bank's domain (low best score) with large margins. The rule answers the right ones at
    the target precision and refuses the low-scoring ones through the floor."""
    rng = np.random.default_rng(1)
    n = 2000
    right = rng.random(n) < 0.8
    margin = np.where(right, rng.uniform(0.0, 0.1, n), rng.uniform(0.0, 0.02, n))
    top = rng.uniform(0.8, 1.0, n)
    rule = calibrate(Signals(top, margin), right, 0.95, 0.99)
    share, precision = answered(rule, Signals(top, margin), right)
    assert precision >= 0.95 and 0.5 < share < 1.0
    assert rule.score_floor <= np.quantile(top[right], 0.011)
    # A clear winner among unrelated facts, far below the floor: refused.
    assert not rule.confident(np.array([0.6]), np.array([0.09]))[0]
    assert rule.confident(np.array([0.95]), np.array([0.09]))[0]
    assert "score floor" in rule.why_not(0.6, 0.09) and "margin" in rule.why_not(0.95, 0.0)


def test_the_rule_survives_the_model_config_and_a_model_without_one_has_none():
    rule = ConfidenceRule(0.77, 0.0046, 0.9)
    assert ConfidenceRule.from_config({"confidence": rule.to_config()}) == rule
    never = ConfidenceRule(0.77, None, 0.9)
    assert ConfidenceRule.from_config(json.loads(json.dumps({"confidence": never.to_config()}))) == never
    assert ConfidenceRule.from_config({"dim": 384}) is None  # logged before answers had a confidence
    with pytest.raises(PipelineError, match="expected a mapping of score_floor"):
        ConfidenceRule.from_config({"confidence": {"score_floor": 0.5}})


# --- distinct top-k ------------------------------------------------------------------------------


def reference_distinct(sims: np.ndarray, groups: np.ndarray, k: int):
    """The plain way: walk each row best first, keep a text when its group is new."""
    scores, picks = [], []
    for row in sims:
        seen, s, p = set(), [], []
        for j in np.argsort(-row, kind="stable"):
            if groups[j] not in seen:
                seen.add(groups[j])
                s.append(row[j])
                p.append(j)
            if len(p) == k:
                break
        scores.append(s)
        picks.append(p)
    return np.array(scores), np.array(picks)


@pytest.mark.parametrize("k", [1, 2, 5, 40, 1000])
def test_top_k_answers_are_distinct_facts_as_a_plain_walk_finds_them(k):
    rng = np.random.default_rng(k)
    groups = rng.integers(0, 30, 80)  # up to ~6 texts a fact
    groups = np.unique(groups, return_inverse=True)[1]  # numbered 0 .. facts - 1
    sims = rng.standard_normal((7, 80)).astype(np.float32)
    ids = torch.from_numpy(groups.astype(np.int64))
    scores, positions = distinct_top(torch.from_numpy(sims), ids, k, group_sizes(ids))
    want_scores, want_positions = reference_distinct(sims, groups, k)
    assert scores.shape == (7, min(k, groups.max() + 1))
    np.testing.assert_array_equal(positions.numpy(), want_positions)
    np.testing.assert_array_equal(scores.numpy(), want_scores)
    for row in positions.numpy():
        assert len(set(groups[row])) == len(row)  # one text per fact


def test_one_fact_in_three_phrasings_is_one_answer_and_the_margin_is_to_the_next_fact():
    # Texts 0-2: one fact (the best three texts); 3 and 4: two other facts.
    sims = torch.tensor([[0.95, 0.94, 0.93, 0.70, 0.60]])
    ids = torch.tensor([0, 0, 0, 1, 2])
    scores, positions = distinct_top(sims, ids, 3, group_sizes(ids))
    assert positions.tolist() == [[0, 3, 4]]
    top, margin = top_and_margin(scores)
    assert top.item() == pytest.approx(0.95) and margin.item() == pytest.approx(0.25)
    # A bank of one fact: no next fact, the margin is to the lowest cosine.
    one, _ = distinct_top(sims, torch.zeros(5, dtype=torch.int64), 2, 5)
    assert one.shape == (1, 1) and top_and_margin(one)[1].item() == pytest.approx(1.95)


# --- the bank's groups ---------------------------------------------------------------------------


def small_bank(groups):
    vectors = np.eye(3, 4, dtype=np.float32)
    texts = ["a", "b", "c"]
    return AnswerBank(texts, vectors, bank_digest(vectors, texts, groups), groups)


def test_a_bank_keeps_its_groups_and_its_digest_covers_them(tmp_path):
    bank = small_bank(["f1", "f1", "f2"])
    path = save_bank(bank, tmp_path / "bank.npz")
    loaded = load_bank(path, bank.sha256)
    assert loaded.groups == ["f1", "f1", "f2"] and loaded.group_ids().tolist() == [0, 0, 1]
    other = small_bank(["f1", "f2", "f2"])
    assert other.sha256 != bank.sha256 != bank_digest(bank.vectors, bank.texts)
    save_bank(other, path)  # the same texts and vectors, other groups: not the logged bank
    with pytest.raises(PipelineError, match="content has sha256"):
        load_bank(path, bank.sha256)


def test_a_bank_saved_before_banks_held_groups_loads_each_text_its_own_group(tmp_path):
    """The file and digest as they were: `vectors` and `texts` only, the digest without groups."""
    vectors = np.eye(3, 4, dtype=np.float32)
    texts = ["a", "b", "c"]
    path = tmp_path / "old.npz"
    with open(path, "wb") as f:
        np.savez(f, vectors=vectors, texts=np.frombuffer(json.dumps(texts).encode(), dtype=np.uint8))
    old_digest = bank_digest(vectors, texts)
    loaded = load_bank(path, old_digest)
    assert loaded.groups is None and loaded.group_ids().tolist() == [0, 1, 2]
    assert loaded.sha256 == old_digest


def test_a_bank_with_groups_that_do_not_match_its_texts_is_refused(tmp_path):
    path = tmp_path / "bank.npz"
    with open(path, "wb") as f:
        np.savez(
            f,
            vectors=np.eye(3, 4, dtype=np.float32),
            texts=np.frombuffer(b'["a", "b", "c"]', dtype=np.uint8),
            groups=np.frombuffer(b'["f1"]', dtype=np.uint8),
        )
    with pytest.raises(PipelineError, match="1 `groups` for 3 texts"):
        load_bank(path, "0" * 64)


# --- ./dev ask's output --------------------------------------------------------------------------


def test_ask_says_when_there_is_no_confident_answer_and_why_then_shows_the_best_guesses():
    rule = ConfidenceRule(0.71, 0.005, 0.9)
    text = render(
        ["What is the capital of Atlantis?", "What is the capital of Peru?", "Close call?"],
        [["Amman.", "Reykjavik."], ["Lima.", "Sol."], ["X.", "Y."]],
        [[0.603, 0.55], [0.95, 0.87], [0.90, 0.898]],
        confident=[False, True, False],
        rule=rule,
    )
    lines = text.splitlines()
    i = lines.index("Q: What is the capital of Atlantis?")
    assert lines[i + 1] == "  no confident answer (best 0.603 < score floor 0.710); best guesses:"
    assert lines[i + 2] == "  1. 0.603  Amman."
    j = lines.index("Q: What is the capital of Peru?")
    assert lines[j + 1] == "  1. 0.950  Lima."  # confident: the answers alone
    c = lines.index("Q: Close call?")
    assert lines[c + 1] == "  no confident answer (margin 0.002 over the next fact < threshold 0.005); best guesses:"


def test_ask_says_plainly_when_the_model_has_no_confidence_rule():
    text = render(["Q?"], [["A."]], [[0.5]], confident=[None])
    assert text.splitlines()[1] == f"  {UNKNOWN}" and "logged before" in UNKNOWN
    assert render(["Q?"], [["A."]], [[0.5]]).splitlines()[1] == f"  {UNKNOWN}"  # no column at all


# --- the out-of-bank questions -------------------------------------------------------------------


def out_of_bank_rows() -> list[dict]:
    lines = [ln for ln in OUT_OF_BANK.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def test_no_out_of_bank_questions_key_entity_appears_in_the_dataset():
    rows = out_of_bank_rows()
    assert 30 <= len(rows) <= 50 and len({r["question"] for r in rows}) == len(rows)
    dataset = QA_PAIRS.read_text(encoding="utf-8")
    found = [
        r["entity"] for r in rows if re.search(r"\b" + re.escape(r["entity"]) + r"\b", dataset, flags=re.IGNORECASE)
    ]
    assert not found, f"{OUT_OF_BANK}: these entities are in {QA_PAIRS}: {found}"
    for r in rows:  # each entity is what the question asks about
        assert r["entity"].lower() in r["question"].lower(), r
    assert read_questions(OUT_OF_BANK) == [r["question"] for r in rows]


def test_an_out_of_bank_file_without_questions_is_refused_naming_it(tmp_path):
    bad = tmp_path / "q.csv"
    bad.write_text("# a comment\ntext,entity\nx,y\n")
    with pytest.raises(PipelineError, match=r"q.csv \(evaluate.out_of_bank_questions\) has no question column"):
        read_questions(bad)


# --- the default run's figures -------------------------------------------------------------------

PRECISION_TOLERANCE = 0.05  # ~4 standard errors of a precision near 0.9 over ~550 answered test items
REFUSED_FLOOR = 0.9  # the default run refused all 42 (docs/serving.md)


def test_the_default_runs_answers_are_precise_and_its_out_of_bank_questions_refused():
    """The abstention test: the figures the default run measured on held-out data (test split,
    out-of-bank questions), in the committed metrics/eval.json."""
    from omegaconf import OmegaConf

    ev = json.loads(EVAL_JSON.read_text())
    keys = ("threshold", "val_answered_precision", "test_answered_share", "test_answered_precision")
    missing = [k for k in (*keys, "out_of_bank_refused_share", "out_of_bank_questions") if KEY + k not in ev]
    assert not missing, f"{EVAL_JSON} has no {missing}: run ./dev repro to measure them"
    target = float(OmegaConf.load(REPO_ROOT / "params.yaml").evaluate.answer_precision)
    assert math.isfinite(ev[KEY + "threshold"]), "the default model is never confident"
    assert ev[KEY + "val_answered_precision"] >= target
    assert ev[KEY + "test_answered_precision"] >= target - PRECISION_TOLERANCE
    assert ev[KEY + "test_answered_share"] >= 0.5  # it still answers most questions
    assert ev[KEY + "out_of_bank_refused_share"] >= REFUSED_FLOOR
    assert ev[KEY + "out_of_bank_questions"] == len(out_of_bank_rows())
