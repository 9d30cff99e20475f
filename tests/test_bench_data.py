"""bench.data end to end in its --quick mode: it runs as a module, its last stdout line is one JSON
object with every figure, each finite, the two embed paths agree, the warm cache encodes only the
new texts, and the CLI answers --help. No timing is asserted: the benchmark reports ratios on a
shared machine, tests check behaviour."""

import math
import os

import pytest

from bench import data as bench
from pipeline.core.paths import REPO_ROOT
from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration


def env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def quick():
    return bench_json("bench.data", "--quick", env=env())


@pytest.mark.slow  # a whole quick benchmark run (11-20 s): the default suite keeps its 10 minutes
def test_quick_run_reports_every_figure_finite(quick):
    figures = [
        "embed_speedup_vs_sentence_transformers",
        "embed_texts_per_s_ours",
        "embed_texts_per_s_sentence_transformers",
        "embed_max_abs_diff",
        "incremental_fraction",
        "incremental_full_s",
        "incremental_s",
        "loader_rss_growth_mb",
        "loader_rss_anon_growth_mb_big",
        "loader_rss_anon_growth_mb_small",
        "data_wait_fraction",
    ]
    for key in figures:
        assert isinstance(quick[key], (int, float)) and math.isfinite(quick[key]), (key, quick.get(key))
    # The growth figures are also given under names that carry the row counts.
    assert quick["loader_rows_big"] == 200_000 and quick["loader_rows_small"] == 10_000
    assert quick["loader_rss_anon_growth_mb_200k"] == quick["loader_rss_anon_growth_mb_big"]
    assert quick["loader_rss_anon_growth_mb_10k"] == quick["loader_rss_anon_growth_mb_small"]
    assert quick["loader_rss_growth_mb"] == pytest.approx(
        quick["loader_rss_anon_growth_mb_big"] - quick["loader_rss_anon_growth_mb_small"]
    )
    for ratio in ("embed_speedup_vs_sentence_transformers", "incremental_fraction", "data_wait_fraction"):
        assert quick[ratio] > 0, ratio
    assert quick["embed_texts_per_s_ours"] > 0 and quick["embed_texts_per_s_sentence_transformers"] > 0
    assert 0 < quick["data_wait_fraction"] < 1
    assert quick["threads"] >= 1
    assert set(quick["goals_met"]) == set(bench.GOALS)
    assert all(isinstance(v, bool) for v in quick["goals_met"].values())


@pytest.mark.slow  # a whole quick benchmark run (11-20 s): the default suite keeps its 10 minutes
def test_quick_run_measures_the_same_work_in_both_arms(quick):
    # Same texts, same teacher: the two embed paths agree to float32 rounding.
    assert quick["embed_max_abs_diff"] < 1e-5
    assert len(quick["embed_round_ratios"]) == quick["embed_rounds"] == 2
    # The warm cache encodes exactly the appended texts and hands back the first run's vectors.
    assert quick["incremental_new_texts"] >= 1
    assert quick["incremental_embedded"] == quick["incremental_new_texts"]
    assert quick["incremental_encoder_texts"] == quick["incremental_new_texts"]
    assert quick["incremental_cached"] == quick["incremental_full_embedded"] == quick["embed_distinct_texts"]
    assert quick["incremental_cached_vectors_identical"] is True
    assert len(quick["incremental_s_runs"]) == 3 and 0 <= quick["incremental_encode_s"] <= quick["incremental_s"]
    # Every row of the synthetic split came through the loader, in whole batches of 256.
    assert quick["loader_batches_big"] == -(-200_000 // 256)
    assert quick["data_wait_steps"] >= 1 and quick["data_wait_telemetry_rows"] >= 1


def test_sample_texts_are_distinct_and_the_new_ones_unseen():
    questions, answers, distinct, new = bench.sample_texts(300)
    assert len(questions) == len(answers)
    assert distinct == list(dict.fromkeys([*questions, *answers])) and len(distinct) >= 300
    assert len(new) == round(0.01 * len(distinct)) and not set(new) & set(distinct)
    assert len(set(new)) == len(new)


def test_cli_help_runs_as_a_module():
    out = run_module("bench.data", "--help", timeout=120, env=env())
    assert out.returncode == 0, out.stderr
    for word in (
        "embed_speedup_vs_sentence_transformers",
        "incremental_fraction",
        "loader_rss_growth_mb",
        "data_wait_fraction",
        "--quick",
        "--loader-child",
    ):
        assert word in out.stdout


def test_the_wait_fraction_is_taken_per_window_of_consecutive_rows():
    rows = [{"perf/data_ms": float(i < 6), "perf/step_ms": 10.0} for i in range(12)]
    windows = bench.wait_windows(rows)
    assert len(windows) == bench.WAIT_WINDOWS and windows[:3] == [0.1] * 3 and windows[3:] == [0.0] * 3
    assert bench.wait_windows(rows[: bench.WAIT_WINDOWS - 1]) == []
