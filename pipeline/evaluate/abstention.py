"""Calibrating when the answer model may answer, on the validation split, and measuring the rule
on held-out questions (pipeline/answer/confidence.py says what the rule is; docs/serving.md, "When
it is confident", why these two signals and their figures).

calibrate(top, margin, right, target, keep): the score floor is the lowest best-fact cosine among
the `keep` share of val's rightly answered questions that score highest; the margin threshold the
lowest margin t, over the val questions at or above the floor, such that the top answer is right
for at least `target` of those with margin >= t (cut only between distinct margins), None when no
t reaches it. The signals are measured on the served path: one question per batch
(max_active_flows is a per-batch budget, so the batch changes the prediction)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.answer.bank import group_numbers
from pipeline.answer.confidence import ConfidenceRule
from pipeline.answer.prediction import predict
from pipeline.answer.ranking import distinct_top, group_sizes, top_and_margin

SCORE_BLOCK = 4096  # questions scored against the bank at once


@dataclass(frozen=True)
class Signals:
    top: np.ndarray  # the best fact's cosine, per question
    margin: np.ndarray  # its margin over the second best fact's


def signals(pred: np.ndarray, bank_vectors: torch.Tensor, group_ids: np.ndarray) -> Signals:
    """The confidence signals of predictions `pred` against a bank, as the served model computes
    them (pipeline/serve/answering.py): cosines, the two best distinct facts, best minus second."""
    ids = torch.from_numpy(np.asarray(group_ids, dtype=np.int64))
    width = group_sizes(ids)
    p = F.normalize(torch.from_numpy(np.asarray(pred, dtype=np.float32)), dim=1)
    tops, margins = [], []
    for s in range(0, len(p), SCORE_BLOCK):
        scores, _ = distinct_top(p[s : s + SCORE_BLOCK] @ bank_vectors.T, ids, 2, width)
        top, margin = top_and_margin(scores)
        tops.append(top.double().numpy())
        margins.append(margin.double().numpy())
    if not tops:
        return Signals(np.zeros(0), np.zeros(0))
    return Signals(np.concatenate(tops), np.concatenate(margins))


def lowest_threshold(values: np.ndarray, right: np.ndarray, target: float) -> float | None:
    """The lowest t such that `right` holds for at least `target` of the items with value >= t,
    or None when no t does (ties at t are all in or all out)."""
    values, right = np.asarray(values, dtype=np.float64), np.asarray(right, dtype=bool)
    if len(values) == 0:
        return None
    order = np.argsort(-values, kind="stable")
    v, r = values[order], right[order]
    precision = np.cumsum(r) / np.arange(1, len(r) + 1)
    # A cut after position i is a threshold only where the next value is lower (end of a tie run).
    cut = np.r_[v[1:] < v[:-1], True]
    ok = np.flatnonzero((precision >= target) & cut)
    return float(v[ok[-1]]) if len(ok) else None


def score_floor(top: np.ndarray, right: np.ndarray, keep: float) -> float:
    """The best-fact cosine under which fewer than 1 - keep of the rightly answered questions
    fall: the lowest score of the `keep` share of them that score highest. With no right answer
    there is nothing to keep: +inf, under which every question falls."""
    kept = np.sort(np.asarray(top, dtype=np.float64)[np.asarray(right, dtype=bool)])[::-1]
    if len(kept) == 0:
        return float("inf")
    return float(kept[max(0, int(np.ceil(keep * len(kept))) - 1)])


def calibrate(sig: Signals, right: np.ndarray, target: float, keep: float) -> ConfidenceRule:
    floor = score_floor(sig.top, right, keep)
    above = sig.top >= floor
    threshold = lowest_threshold(sig.margin[above], np.asarray(right, dtype=bool)[above], target)
    return ConfidenceRule(floor if np.isfinite(floor) else 1.0, threshold, float(target))


def answered(rule: ConfidenceRule, sig: Signals, right: np.ndarray | None = None) -> tuple[float, float]:
    """(the share of questions the rule answers, the share of those whose top answer is right;
    NaN when it answers none or `right` is not given)."""
    confident = rule.confident(sig.top, sig.margin)
    share = float(confident.mean()) if len(confident) else float("nan")
    if right is None or not confident.any():
        return share, float("nan")
    return share, float(np.asarray(right, dtype=bool)[confident].mean())


SERVED_BATCH = 1  # ./dev ask's batch for one question: the path the rule is calibrated on


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """A batch of one is too small to share between threads: on 2 busy cores, two threads took
    84 s for val's 656 questions where one took 3 s (the results differ in the last bits at most)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


KEY = "eval/answer/"  # metrics/eval.json and MLflow


@dataclass(frozen=True)
class AnswerReport:
    rule: ConfidenceRule
    metrics: dict[str, float]  # eval/answer/... for metrics/eval.json and MLflow
    calibration: dict  # the figures the logged model's metadata records, finite or None

    def summary(self) -> str:
        m = self.metrics
        threshold = (
            "none reached the target (never confident)"
            if self.rule.margin_threshold is None
            else (f"margin >= {self.rule.margin_threshold:.4f}")
        )
        return (
            f"answer confidence (calibrated on val, target precision {self.rule.target_precision:.2f}): "
            f"best >= {self.rule.score_floor:.3f} and {threshold}; answers {m[KEY + 'val_answered_share']:.1%} "
            f"of val at precision {m[KEY + 'val_answered_precision']:.3f}, {m[KEY + 'test_answered_share']:.1%} "
            f"of test at {m[KEY + 'test_answered_precision']:.3f}; refuses "
            f"{m[KEY + 'out_of_bank_refused_share']:.1%} of {int(m[KEY + 'out_of_bank_questions'])} "
            "out-of-bank questions"
        )


def read_questions(path) -> list[str]:
    """The `question` column of a CSV whose lines starting with '#' are comments."""
    import csv
    from pathlib import Path

    from pipeline.core.errors import PipelineError

    path = Path(path)
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.lstrip().startswith("#")]
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(
            f"{path} (evaluate.out_of_bank_questions) cannot be read ({e}); expected a UTF-8 CSV with a question column"
        ) from None
    rows = list(csv.DictReader(lines))
    if not rows or "question" not in rows[0]:
        raise PipelineError(f"{path} (evaluate.out_of_bank_questions) has no question column or no rows")
    questions = [str(r["question"] or "").strip() for r in rows]
    empty = [i + 1 for i, q in enumerate(questions) if not q]
    if empty:
        raise PipelineError(f"{path} (evaluate.out_of_bank_questions): rows {empty[:5]} have an empty question")
    return questions


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def measure(model, shards: dict, bank, target: float, keep: float, out_of_bank: np.ndarray | None) -> AnswerReport:
    """Calibrate the rule on val and measure it on test and on the out-of-bank questions'
    embeddings `out_of_bank` (float32, as the served model embeds a question; None: none given),
    each predicted as the served model predicts one question (SERVED_BATCH). `bank`: the
    evaluate stage's (pipeline.answer.bank.Bank); `shards`: val and test."""
    from pipeline.evaluate.retrieval import score_items

    group_ids = group_numbers(bank.groups)
    measured = {}
    for split in ("val", "test"):
        with _one_thread():
            pred = predict(model, shards[split].inputs, SERVED_BATCH)
        right = score_items(pred, shards[split], bank)["group_rank"] == 1
        measured[split] = (signals(pred, bank.vectors, group_ids), right)
    rule = calibrate(*measured["val"], target, keep)
    metrics = {KEY + "threshold": float("inf") if rule.margin_threshold is None else rule.margin_threshold}
    metrics[KEY + "score_floor"] = rule.score_floor
    for split, (sig, right) in measured.items():
        share, precision = answered(rule, sig, right)
        metrics[f"{KEY}{split}_answered_share"] = share
        metrics[f"{KEY}{split}_answered_precision"] = precision
    n = 0 if out_of_bank is None else len(out_of_bank)
    refused = float("nan")
    if n:
        with _one_thread():
            pred = predict(model, out_of_bank, SERVED_BATCH)
        share, _ = answered(rule, signals(pred, bank.vectors, group_ids))
        refused = 1.0 - share
    metrics[KEY + "out_of_bank_refused_share"] = refused
    metrics[KEY + "out_of_bank_questions"] = n
    metrics = {k: round(v, 6) if np.isfinite(v) else v for k, v in metrics.items()}
    calibration = {
        "calibrated_on": "val, one question per batch",
        "val_answered_share": _finite(metrics[KEY + "val_answered_share"]),
        "val_answered_precision": _finite(metrics[KEY + "val_answered_precision"]),
    }
    return AnswerReport(rule, metrics, calibration)
