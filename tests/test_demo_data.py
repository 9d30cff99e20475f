"""The shipped demo dataset (data/raw/qa_pairs.csv) is what pipeline.data.demo generates, and is sane."""
from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.data import demo

COMMITTED = Path(__file__).resolve().parent.parent / "data/raw/qa_pairs.csv"
MAX_BYTES = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with open(COMMITTED, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(demo.COLUMNS)
        return list(reader)


def test_regenerated_file_is_byte_identical(tmp_path):
    out = tmp_path / "qa_pairs.csv"
    n = demo.write_csv(out)
    assert out.read_bytes() == COMMITTED.read_bytes(), (
        "data/raw/qa_pairs.csv is stale: rerun `python -m pipeline.data.demo`")
    assert n == len(demo.generate())


def test_generate_is_deterministic():
    assert demo.generate() == demo.generate()


def test_count(rows):
    assert len(rows) >= 3000


def test_ids_unique(rows):
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))


def test_no_empty_fields(rows):
    for r in rows:
        for col in demo.COLUMNS:
            assert r[col] and r[col].strip(), f"empty {col} in row {r['id']!r}"


def test_no_duplicate_pairs(rows):
    pairs = [(r["question"], r["answer"]) for r in rows]
    assert len(pairs) == len(set(pairs))


def test_each_question_has_one_answer(rows):
    answers = defaultdict(set)
    for r in rows:
        answers[r["question"]].add(r["answer"])
    conflicting = {q: a for q, a in answers.items() if len(a) > 1}
    assert not conflicting


def test_every_topic_has_several_question_phrasings(rows):
    phrasings = defaultdict(set)
    for r in rows:
        m = re.fullmatch(r".+-q(\d+)", r["id"])
        assert m, r["id"]
        phrasings[r["topic"]].add(m.group(1))
    assert phrasings
    for topic, templates in phrasings.items():
        assert len(templates) >= 3, topic


def test_answers_are_sentences(rows):
    for r in rows:
        assert r["answer"][0].isupper() or r["answer"][0].isdigit(), r["id"]
        assert r["answer"].endswith(".") and not r["answer"].endswith(".."), r["id"]
        assert r["question"].endswith(("?", ".")), r["id"]


def test_file_format(rows):
    data = COMMITTED.read_bytes()
    assert len(data) < MAX_BYTES
    assert b"\r" not in data
    assert data.endswith(b"\n")
    data.decode("utf-8")
