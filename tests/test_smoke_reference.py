"""The smoke reference's comparison (tools/reference.py): what passes as noise and what
fails as a change, on the committed reference itself. The reference against a real smoke run is
checked in tests/test_e2e.py."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

from tools import reference as ref

pytestmark = pytest.mark.unit


@pytest.fixture
def reference():
    return ref.load()


def test_the_committed_reference_is_complete(reference):
    steps = [s for s, _ in reference["loss"]]
    assert steps == sorted(steps) and len(steps) >= 10 and all(np.isfinite(v) for _, v in reference["loss"])
    for split in ("val", "test"):
        for who in ("model", "identity", "ridge", "nearest"):
            for metric in ("cosine", "mse", "mrr", "top1", "top5", "group_top1", "group_top5"):
                assert f"eval/{split}/{who}/{metric}" in reference["eval"]
    assert not any(k.endswith(("ci95_low", "ci95_high", "p_value")) for k in reference["eval"])
    assert {"eval/bank_size", "eval/test/items", "eval/val/items"} <= set(reference["eval"])
    vectors = [n for n in reference["shards"] if n.endswith(".npy")]
    assert len(vectors) == 6 and all(
        {"sha256", "abs_sum", "projection_abs_sum"} <= set(reference["shards"][n]) for n in vectors
    )
    assert all(set(v) == {"sha256"} for n, v in reference["shards"].items() if not n.endswith(".npy"))


def test_the_reference_matches_itself(reference):
    assert ref.compare(reference, copy.deepcopy(reference)) == ([], [])


def test_noise_of_the_size_measured_between_thread_counts_passes(reference):
    run = copy.deepcopy(reference)
    for row in run["loss"]:
        row[1] *= 1 + 3e-7  # the largest measured: 2.6e-7
    key = "eval/test/model/cosine"
    run["eval"][key] += 1e-6
    name = "train-00000_inputs.npy"
    run["shards"][name] = {
        **run["shards"][name],
        "sha256": "0" * 64,
        "abs_sum": run["shards"][name]["abs_sum"] * (1 + 1e-7),
    }
    problems, notes = ref.compare(reference, run)
    assert problems == []
    assert notes == [
        f"shard file {name}: other bits (sha256 000000000000), sums within 1e-05: thread-count or CPU-path noise"
    ]


def test_a_real_numerics_change_fails_and_says_where(reference):
    run = copy.deepcopy(reference)
    step, loss = run["loss"][3]
    run["loss"][3][1] = loss * (1 + 1.7e-5)  # AdamW eps 1e-8 -> 1e-7 did this by the 4th logged step
    problems, _ = ref.compare(reference, run)
    assert len(problems) == 1 and problems[0].startswith(f"train/loss at step {step}: ")
    assert problems[0].endswith("(relative difference 1.7e-05 > 1e-05)")

    run = copy.deepcopy(reference)
    n = run["eval"]["eval/val/items"]
    run["eval"]["eval/val/model/group_top5"] -= 1 / n  # one retrieval flipped
    (problem,), _ = ref.compare(reference, run)
    assert problem.startswith("eval/val/model/group_top5: ") and "tolerance 0.0001" in problem


def test_shard_changes_beyond_noise_and_text_changes_fail(reference):
    run = copy.deepcopy(reference)
    name = "test-00000_targets.npy"
    run["shards"][name] = {
        **run["shards"][name],
        "sha256": "1" * 64,
        "projection_abs_sum": run["shards"][name]["projection_abs_sum"] * 1.001,
    }
    run["shards"]["test.parquet"] = {"sha256": "2" * 64}
    problems, _ = ref.compare(reference, run)
    assert len(problems) == 2
    assert problems[0].startswith("shard file test-00000_targets.npy: projection_abs_sum ")
    assert problems[1].startswith("shard file test.parquet: sha256 222222222222") and "same bits" in problems[1]


def test_missing_and_extra_entries_fail(reference):
    run = copy.deepcopy(reference)
    del run["loss"][-1]
    del run["eval"]["eval/test/ridge/mrr"]
    run["shards"]["extra.npy"] = {"sha256": "3" * 64}
    del run["shards"]["val.parquet"]
    problems, _ = ref.compare(reference, run)
    assert problems[0].startswith("logged steps differ: ")
    assert "eval/test/ridge/mrr: missing from the run's metrics/eval.json" in problems[1]
    assert problems[2:] == [
        "shard file val.parquet: missing from the run's manifest",
        "shard files not in the reference: extra.npy",
    ]


def test_vector_sums_move_by_noise_only_a_little(tmp_path):
    """The two sums move ~1e-7 relative when each value moves by its last bits, and far more
    when the vectors change (here: one row replaced)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "b.npy", np.nextafter(x, np.float32(np.inf)))
    y = x.copy()
    y[0] = x[1]
    np.save(tmp_path / "c.npy", y)
    a, b, c = (ref._vector_sums(tmp_path / f"{n}.npy") for n in "abc")
    assert all(0 < ref._rel(b[k], a[k]) < 1e-6 for k in a)
    assert any(ref._rel(c[k], a[k]) > 1e-4 for k in a)


def test_the_refresh_command_explains_itself():
    out = subprocess.run(
        [sys.executable, "-m", "tools.reference", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ref.REFERENCE.parents[1],
    ).stdout
    assert "--refresh" in out and "tests/smoke_reference.json" in out and "relative 1e-05" in out
