"""bench.serve runs end to end (--quick) on a real logged answer model and reports what it
promises; no timing is asserted (benchmarks report ratios, tests check behaviour)."""

import math

import pytest

from bench import serve as bench
from tests.helpers.answer_model import AnswerProject
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


@pytest.mark.slow  # a quick benchmark run with its own server (~30 s on 2 cores): not in the default suite
def test_quick_run_prints_one_json_line_with_the_figures(project):
    env = {**project.env, "MLFLOW_TRACKING_URI": project.tracking_uri}
    res = bench_json("bench.serve", "--quick", "--model", project.run_uri, env=env)
    assert res["model"] == project.run_uri and (res["batch"], res["singles"], res["rounds"]) == (8, 6, 2)
    for mode in ("in_process", "rest"):
        single = res[mode]["single"]
        assert single["count"] == 6 and 0 < single["p50_ms"] <= single["p99_ms"] and single["p50_probes"] > 0
        assert len(res[mode]["batch_s_rounds"]) == 2 and res[mode]["batch_questions_per_s"] > 0
    assert len(res["teacher_encode"]["batch_s_rounds"]) == 2
    assert len(res["in_process_batch_over_teacher_encode_rounds"]) == 2
    assert math.isfinite(res["in_process_batch_over_teacher_encode"]) and res["rest_batch_over_in_process_batch"] > 0
    assert set(res["parts_ms"]) == {"encode", "model", "topk"} and all(v > 0 for v in res["parts_ms"].values())
    assert res["train_batch_size"] == project.batch_size and res["bank_size"] > 0
    assert res["goals"] == bench.GOALS and isinstance(res["goals_met"]["in_process_batch_over_teacher_encode"], bool)
    assert isinstance(res["cpu_model"], str) and res["cpu_model"] and res["probe"]["probe_count"] >= 2 * 5 + 1


def test_percentiles_are_in_milliseconds():
    got = bench.percentiles_ms([0.001] * 99 + [0.101])
    assert got["count"] == 100 and got["p50_ms"] == pytest.approx(1.0) and 1.0 < got["p99_ms"] <= 101.0


def fake_result(busy: bool) -> dict:
    single = {"p50_ms": 10.0, "p99_ms": 20.0}
    return {
        "batch": 256,
        "busy": busy,
        "cpu": {
            "in_process_single": single,
            "teacher_encode_single": {"p50_ms": 5.0, "p99_ms": 6.0},
            "in_process_batch_s_median": 2.0,
            "teacher_encode_batch_s_median": 1.0,
            "parts_ms": {"encode": 900.0, "model": 90.0, "topk": 10.0},
            "load_s": 3.0,
        },
        "rest": {"single": single, "batch_questions_per_s": 100.0},
        "in_process_batch_over_teacher_encode": 2.0,
        "in_process_single_over_teacher_encode_single": 2.0,
        "parts_share": {"encode": 0.9, "model": 0.09, "topk": 0.01},
        "parts_share_spread": {"encode": 0.01, "model": 0.005, "topk": 0.0005},
        "rest_batch_over_in_process_batch": 1.1,
        "rest_ratio_spread": 0.05,
        "rss_mb": 700.0,
    }


def test_absolute_times_are_context_and_the_figures_are_ratios():
    res = fake_result(busy=False)
    ctx, head = bench.context(res), bench.headline(res)
    assert ctx["in_process_questions_per_s"] == 128.0 and ctx["load_s"] == 3.0 and ctx["rest_single_p50_ms"] == 10.0
    assert set(head["figures"]) == {
        "in_process_batch_over_teacher_encode",
        "in_process_single_over_teacher_encode_single",
        "parts_share",
        "rss_mb",
        "rest_batch_over_in_process_batch",
    }
    assert head["figures"]["rest_batch_over_in_process_batch"] == 1.1 and head["unreliable"] == {}


def test_the_rest_ratio_counts_cpu_seconds_so_a_busy_machine_does_not_null_it():
    head = bench.headline(fake_result(busy=True))
    assert head["figures"]["rest_batch_over_in_process_batch"] == 1.1 and head["unreliable"] == {}


def test_the_rest_ratio_is_null_when_its_rounds_spread_wider_than_two_runs_may_differ():
    res = {**fake_result(busy=False), "rest_ratio_spread": 0.5}
    head = bench.headline(res)
    assert head["figures"]["rest_batch_over_in_process_batch"] is None
    assert "spread within this run" in head["unreliable"]["rest_batch_over_in_process_batch"]
    few = bench.headline({**fake_result(busy=False), "rest_ratio_spread": None})
    assert few["figures"]["rest_batch_over_in_process_batch"] is None
    assert "too few samples" in few["unreliable"]["rest_batch_over_in_process_batch"]


def test_a_part_whose_share_spreads_over_the_rounds_is_null_and_the_others_stay():
    res = {**fake_result(busy=False), "parts_share_spread": {"encode": 0.01, "model": 0.03, "topk": 0.0005}}
    head = bench.headline(res)
    assert head["figures"]["parts_share"] == {"encode": 0.9, "model": None, "topk": 0.01}
    assert "spread within this run" in head["unreliable"]["parts_share.model"]
