"""The shipped demo dataset (data/raw/qa_pairs.csv) is what tools.demo_data generates, and is sane."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tools import demo_data as demo

pytestmark = pytest.mark.unit

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
        "data/raw/qa_pairs.csv is stale: rerun `python -m tools.demo_data`"
    )
    assert n == len(demo.generate())


def test_generate_is_deterministic():
    assert demo.generate() == demo.generate()


def test_columns():
    assert demo.COLUMNS == ("id", "fact", "question", "answer", "topic")


def test_count(rows):
    # Within the pipeline's time budget, and enough facts for group-aware retrieval.
    assert 5500 <= len(rows) <= 7000
    facts = {r["fact"] for r in rows}
    assert len(facts) >= 700
    per_fact = defaultdict(int)
    for r in rows:
        per_fact[r["fact"]] += 1
    assert min(per_fact.values()) >= 4 and max(per_fact.values()) <= 7


def test_id_is_fact_plus_phrasing(rows):
    for r in rows:
        assert re.fullmatch(re.escape(r["fact"]) + r"-q\d+", r["id"]), r["id"]
        assert r["fact"].startswith(r["topic"].replace("_", "-") + "-"), r["id"]
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r["fact"]), r["fact"]


def test_each_fact_is_one_topic_and_has_several_answers(rows):
    topics, answers = defaultdict(set), defaultdict(set)
    for r in rows:
        topics[r["fact"]].add(r["topic"])
        answers[r["fact"]].add(r["answer"])
    assert all(len(t) == 1 for t in topics.values())
    # 2-3 answer phrasings per fact, each question paired with one by hash: most facts use >= 2.
    assert all(1 <= len(a) <= 3 for a in answers.values())
    assert sum(len(a) >= 2 for a in answers.values()) >= 0.8 * len(answers)


def test_answer_text_belongs_to_one_fact(rows):
    """Group-aware retrieval needs it: an answer text found in the bank names one group."""
    assert not _with_several(rows, "answer", "fact")


def _subject(fact_rows: list[dict]) -> str:
    """The subject every row of a fact must mention, from the generator's own tables."""
    fact = fact_rows[0]["fact"]
    topic = fact_rows[0]["topic"]
    if topic in ("capital", "currency", "official_language"):
        names = [
            c[0]
            for c in demo.COUNTRIES
            if demo._slug(c[0].removeprefix("the ")) == fact.removeprefix(topic.replace("_", "-") + "-")
        ]
        assert len(names) == 1, fact
        return names[0].removeprefix("the ")
    if topic in ("element_symbol", "atomic_number"):
        return fact.split("-", 2)[2]
    if topic == "olympics":
        year = fact.split("-")[1]
        return year
    return ""


def test_every_fact_rows_agree_on_the_subject(rows):
    by_fact = defaultdict(list)
    for r in rows:
        by_fact[r["fact"]].append(r)
    for fact, fr in by_fact.items():
        # Every answer of a fact states the same fact: the answers of a fact name its subject ...
        subject = _subject(fr)
        for r in fr:
            if subject:
                assert subject.lower() in r["answer"].lower(), (fact, r["answer"])
        # ... and the questions name the subject or (reverse questions) the answer's value.
        for r in fr:
            words = set(re.findall(r"\w+", r["question"].lower()))
            assert words & set(re.findall(r"\w+", r["answer"].lower())) - _STOP, (fact, r)


_STOP = {
    "the",
    "a",
    "an",
    "of",
    "is",
    "in",
    "what",
    "which",
    "who",
    "name",
    "and",
    "its",
    "has",
    "was",
    "by",
    "to",
    "on",
    "for",
    "as",
    "it",
    "do",
    "does",
    "how",
    "called",
}


def test_country_facts_match_the_table(rows):
    table = {demo._slug(c[0].removeprefix("the ")): c for c in demo.COUNTRIES}
    for r in rows:
        if r["topic"] == "capital":
            name, capital, *_ = table[r["fact"].removeprefix("capital-")]
            assert capital in r["answer"] and name.removeprefix("the ") in r["answer"], r["id"]
        elif r["topic"] == "currency":
            name, _, currency, *_ = table[r["fact"].removeprefix("currency-")]
            assert currency.removeprefix("the ") in r["answer"], r["id"]


def test_element_facts_match_the_table(rows):
    table = {name: (number, symbol) for number, symbol, name, _ in demo.ELEMENTS}
    for r in rows:
        if r["topic"] in ("element_symbol", "atomic_number"):
            number, symbol = table[r["fact"].split("-", 2)[2]]
            assert re.search(rf"\b{symbol}\b", r["answer"]), r["id"]
            assert re.search(rf"\b{number}\b", r["answer"]), r["id"]


def test_confusable_facts_are_present(rows):
    facts = {r["fact"] for r in rows}
    numbers = sorted(n for n, *_ in demo.ELEMENTS)
    assert all(b - a == 1 for a, b in zip(numbers, numbers[1:56]))  # 1..56 without gaps
    assert {"olympics-1988-summer", "olympics-1988-winter"} <= facts
    euro = [c for c in demo.COUNTRIES if c[2] == "the euro"]
    assert len(euro) >= 10


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
    assert not _with_several(rows, "question", "answer")


def _with_several(rows, key: str, value: str) -> dict:
    """Each `key` text that rows pair with more than one `value`, with those values."""
    seen = defaultdict(set)
    for r in rows:
        seen[r[key]].add(r[value])
    return {k: v for k, v in seen.items() if len(v) > 1}


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
