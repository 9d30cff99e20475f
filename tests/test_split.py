"""assign_splits: proportions, independence from order and other rows, salt, grouping keys."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from pipeline.data.split import assign_splits

pytestmark = pytest.mark.unit

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def frame(n: int, n_targets: int | None = None) -> pd.DataFrame:
    targets = [f"target {i % n_targets if n_targets else i}" for i in range(n)]
    return pd.DataFrame(
        {"id": [str(i) for i in range(n)], "input_text": [f"input {i}" for i in range(n)], "target_text": targets}
    )


def test_proportions_within_3_percent():
    splits = assign_splits(frame(5000), FRACTIONS)
    assert splits.dtype == object and len(splits) == 5000
    assert set(splits) == set(FRACTIONS)
    for name, frac in FRACTIONS.items():
        assert abs(np.mean(splits == name) - frac) < 0.03, name


def test_matches_documented_hash():
    # sha256(salt + "\x1f" + input + "\x1f" + target), first 8 bytes big-endian / 2**64.
    df = frame(50)
    got = assign_splits(df, {"a": 0.5, "b": 0.5}, salt="s")
    for i, row in df.iterrows():
        h = hashlib.sha256(f"s\x1f{row.input_text}\x1f{row.target_text}".encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        assert got[i] == ("a" if u < 0.5 else "b")


def test_shuffling_rows_changes_no_assignment():
    df = frame(1000)
    before = dict(zip(df["id"], assign_splits(df, FRACTIONS)))
    shuffled = df.sample(frac=1.0, random_state=3).reset_index(drop=True)
    after = dict(zip(shuffled["id"], assign_splits(shuffled, FRACTIONS)))
    assert after == before


def test_independent_of_other_rows():
    df = frame(1000)
    full = assign_splits(df, FRACTIONS)
    part = assign_splits(df.iloc[::7].reset_index(drop=True), FRACTIONS)
    assert list(part) == list(full[::7])


def test_salt_changes_assignment():
    df = frame(1000)
    a = assign_splits(df, FRACTIONS, salt="")
    b = assign_splits(df, FRACTIONS, salt="v2")
    # Each row moves with probability 1 - sum(f^2) = 0.34; demand a clear share of them.
    assert 0.25 < np.mean(a != b) < 0.45
    assert list(assign_splits(df, FRACTIONS, salt="v2")) == list(b)


def test_key_target_keeps_equal_targets_together():
    df = frame(2000, n_targets=100)  # 20 phrasings per target
    splits = assign_splits(df, FRACTIONS, key="target")
    per_target = pd.Series(splits).groupby(df["target_text"]).nunique()
    assert (per_target == 1).all()
    assert len(set(splits)) == 3  # grouping still spreads targets across all splits
    # key="pair" does split phrasings of one target apart.
    pair = pd.Series(assign_splits(df, FRACTIONS)).groupby(df["target_text"]).nunique()
    assert (pair > 1).any()


def test_key_input_keeps_equal_inputs_together():
    df = frame(600)
    df["input_text"] = [f"input {i % 30}" for i in range(600)]
    splits = assign_splits(df, FRACTIONS, key="input")
    assert (pd.Series(splits).groupby(df["input_text"]).nunique() == 1).all()


def test_zero_fraction_split_gets_nothing_and_order_is_mapping_order():
    df = frame(2000)
    splits = assign_splits(df, {"train": 0.9, "empty": 0.0, "test": 0.1})
    assert "empty" not in set(splits)
    assert abs(np.mean(splits == "test") - 0.1) < 0.03
    only = assign_splits(df, {"all": 1.0})
    assert set(only) == {"all"}


@pytest.mark.parametrize(
    "fractions,fragment",
    [
        ({"train": 0.8, "test": 0.1}, "sum to 0.9"),
        ({"train": 1.1, "test": -0.1}, "test=-0.1"),
        ({"train": float("nan"), "test": 1.0}, "train=nan"),
        ({}, "empty"),
    ],
)
def test_bad_fractions(fractions, fragment):
    with pytest.raises(ValueError) as exc:
        assign_splits(frame(5), fractions)
    assert fragment in str(exc.value)
    if fractions:
        assert str(dict(fractions)) in str(exc.value)


def test_sum_within_tolerance_is_accepted():
    out = assign_splits(frame(100), {"a": 0.5, "b": 0.4999995})
    assert set(out) <= {"a", "b"} and len(out) == 100


def test_bad_key():
    with pytest.raises(ValueError, match="split key 'question' is unknown; expected one of pair, input, target"):
        assign_splits(frame(5), FRACTIONS, key="question")
