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
