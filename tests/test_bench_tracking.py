"""bench.tracking runs end to end (--quick) and reports what it promises; no timing is asserted
(benchmarks report ratios, tests check behaviour)."""

import math
import time

import pytest

from bench import tracking as bench
from bench.probe import Probe, RowProbe
from bench.workloads import workload_threads
from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a whole quick benchmark run (~60 s on a busy 2-core machine): not in the default suite
def test_quick_run_prints_one_json_line_with_the_figures():
    res = bench_json("bench.tracking", "--quick")
    assert res["arms"] == ["off", "stage", "mlflow_async"] and res["reference_arm"] == "off"
    for key in (
        "overhead_per_step",
        "overhead_per_step_across_runs",
        "overhead_per_step_across_runs_raw",
        "fixed_cost_s",
        "fixed_cost_s_raw",
        "fixed_cost_s_in_run",
        "cpu_cost_s",
    ):
        assert set(res[key]) == {"stage", "mlflow_async"}, key
        assert all(math.isfinite(v) for v in res[key].values()), key
    assert all(v > 0 for v in res["overhead_per_step"].values())
    # The in-run A/B ran: each tracked run has sent segments with unsent neighbours, 0.05 s each.
    assert res["segment_s"] == 0.05
    assert all(n >= 1 for n in res["overhead_per_step_segments"].values())
    assert all(len(v) == res["rounds"] == 1 for v in res["overhead_per_step_runs"].values())
    assert all(len(v) == 1 for v in res["fixed_cost_s_rounds"].values())
    for arm in res["arms"]:
        per = res["per_arm"][arm]
        assert per["steady_step_ms"] > 0 and per["wall_s"] > 0 and per["probe_ms_median"] > 0
        assert per["setup_s"] >= 0 and per["teardown_s"] >= 0 and per["cpu_self_s"] > 0
    assert res["per_arm"]["off"]["metrics_logged_per_run"] == 0
    # Only the sent segments' rows reach the store: some, not all.
    for arm in ("stage", "mlflow_async"):
        per = res["per_arm"][arm]
        assert per["rows_per_run"] == 40 and 0 < per["rows_sent_per_run"] < 40
        # About 25 MLflow metrics a smoke row (pipeline/tracking/metric_names.py; the rest stays in the CSV).
        assert per["metrics_logged_per_run"] >= 20 * per["rows_sent_per_run"]
    assert res["throughput_metrics"] == 200 * 35  # every value pushed was counted as sent
    assert res["metrics_logged_per_s"] > 0 and res["metrics_logged_per_s_mlflow_async"] > 0
    assert res["arms_same_work"] is True  # tracking does not change what is trained
    assert res["threads"] == 1  # the smoke preset's train.threads: the probes ran with it too
    # Where it ran and how steady the machine was.
    assert isinstance(res["cpu_model"], str) and res["cpu_model"]
    probe = res["probe"]
    assert probe["probe_count"] >= 6 and probe["probe_threads"] == [1]
    assert probe["probe_ms_min"] <= probe["probe_ms_median"] <= probe["probe_ms_max"]
    assert probe["probe_spread_max_min"] >= probe["probe_spread_p90_p10"] >= 1.0
    assert res["goals"] == bench.GOALS and res["goals"]["overhead_per_step"] == 1.03
    # The smoke preset is not the default run: no fraction of it, so no such goal.
    assert set(res["goals_met"]) == {"overhead_per_step/stage", "overhead_per_step/mlflow_async"}
    assert all(isinstance(v, bool) for v in res["goals_met"].values())


@pytest.mark.slow  # a quick benchmark run with PostgreSQL and an MLflow server started for it (~90 s)
def test_the_server_arm_logs_into_a_team_server_and_is_set_against_sqlite_in_the_same_run():
    res = bench_json("bench.tracking", "--quick", "--arms", "off,stage,server")
    assert res["arms"] == ["off", "stage", "server"]
    for key in ("overhead_per_step", "overhead_per_step_cpu", "fixed_cost_s", "cpu_cost_s"):
        assert set(res[key]) == {"stage", "server"}, key
    per = res["per_arm"]["server"]
    assert per["rows_per_run"] == 40 and 0 < per["rows_sent_per_run"] < 40
    assert per["metrics_logged_per_run"] >= 20 * per["rows_sent_per_run"]
    assert res["metrics_logged_per_s_server"] > 0 and res["metrics_logged_per_s"] > 0
    assert res["arms_same_work"] is True
    ratio = res["server_over_sqlite_per_step_cpu"]
    assert ratio is None or ratio > 0


def test_steady_step_time_leaves_out_the_probes():
    def slow_probe():  # stands in for a probe that takes 50 ms
        time.sleep(0.05)
        return 0.05

    seen = []
    clock = RowProbe(slow_probe, inner=lambda metrics, step: seen.append(step), every_s=0.0)  # every row
    for step in (2, 4, 6, 8, 10):
        clock({}, step)
    assert seen == [2, 4, 6, 8, 10] and clock.probes == [0.05] * 5 and clock.probe_s >= 0.25
    assert [s for s, _ in clock.stamps] == seen
    # The stamps' clock has the probes taken out: 5 x 50 ms of probing, yet the rows are close.
    assert clock.stamps[-1][1] - clock.stamps[0][1] < 0.05
    assert clock.steady_ms(skip=0.0) == pytest.approx(1000 * (clock.stamps[-1][1] - clock.stamps[0][1]) / 8)
    assert clock.steady_ms(skip=0.5) == pytest.approx(1000 * (clock.stamps[-1][1] - clock.stamps[2][1]) / 4)


def test_the_in_run_ab_sends_alternate_segments_and_compares_each_with_its_neighbours():
    now = [0.0]
    sent = []
    clock = RowProbe(lambda: 0.0, inner=lambda metrics, step: sent.append(step), every_s=1e9, segment_s=1.0)
    clock.clock = lambda: now[0]
    # 40 rows, 2 steps each, 0.25 s apart: segments of 4 rows; a sent row costs its next span 0.05 s more.
    for i in range(40):
        clock({}, 2 * (i + 1))
        now[0] += 0.25 + (0.05 if clock.sent[-1] else 0.0)
    modes = clock.sent
    assert modes[:4] == [True] * 4 and modes[4:8] == [False] * 4  # switches at the first row past each second
    assert sent == [2 * (i + 1) for i, m in enumerate(modes) if m]
    segs = clock.segments(skip=0.0)
    assert [m for m, _ in segs] == [True, False] * (len(segs) // 2) + [True] * (len(segs) % 2)
    assert all(ms == pytest.approx(150.0) for m, ms in segs if m)  # (0.25 + 0.05) s / 2 steps
    assert all(ms == pytest.approx(125.0) for m, ms in segs if not m)
    ratios = clock.segment_ratios(skip=0.0)
    assert len(ratios) == len(segs) - 1 and ratios == pytest.approx([1.2] * len(ratios))  # one per boundary
    assert clock.sent_ms(skip=0.0) == pytest.approx(150.0)
    # A slow machine: rows 1.5 s apart, 1 s segments. A segment still holds 4 rows (3 spans count).
    slow = RowProbe(lambda: 0.0, inner=lambda metrics, step: None, every_s=1e9, segment_s=1.0)
    slow.clock = lambda: now[0]
    for i in range(24):
        slow({}, i)
        now[0] += 1.5
    assert slow.sent == ([True] * 4 + [False] * 4) * 3
    assert len(slow.segment_ratios(skip=0.0)) == 5
    # Without segments every row is sent, and there is no in-run A/B.
    plain = RowProbe(lambda: 0.0, inner=lambda metrics, step: None, every_s=1e9)
    for i in range(6):
        plain({}, i)
    assert all(plain.sent) and plain.segment_ratios(skip=0.0) == []


def test_probes_follow_the_workloads_thread_count():
    from bench.workloads import config

    assert workload_threads(config("smoke", 10)[0]) == 1  # smoke sets train.threads=1
    p = Probe(threads=workload_threads(config("smoke", 10)[0]), n=32, reps=1)
    p.take(2)
    assert p.threads == {1}


def test_default_run_steps_come_from_the_recorded_default_run():
    steps, source = bench.default_run_steps()
    assert (steps is None) == ("train/planned_steps" not in source)
    if steps is not None:
        assert steps > 0 and "metrics/train.json" in source


def test_help_explains_the_figures():
    out = run_module("bench.tracking", "--help", timeout=120).stdout
    for word in (
        "overhead_per_step",
        "fixed_cost_s",
        "mlflow_async",
        "stage",
        "metrics_logged_per_s",
        "--quick",
        "--preset",
        "--arms",
        "--segment-s",
    ):
        assert word in out, word


def test_a_per_arm_cpu_figure_is_null_where_an_arm_spreads_and_whole_where_none_does():
    res = {
        "overhead_per_step_cpu": {"stage": 1.2, "mlflow_async": 1.2},
        "overhead_per_step_cpu_spread": {"stage": 0.01, "mlflow_async": 0.5},
        "cpu_cost_s": {"stage": 2.0, "mlflow_async": 2.0},
        "cpu_cost_s_spread": {"stage": 0.1, "mlflow_async": None},
    }
    head = bench.headline(res)
    assert head["figures"] == {"overhead_per_step_cpu": None, "cpu_cost_s": None}
    assert set(head["unreliable"]) == {"overhead_per_step_cpu", "cpu_cost_s"}
    assert head["unreliable"]["cpu_cost_s"].startswith("mlflow_async: too few")
    res["overhead_per_step_cpu_spread"]["mlflow_async"] = 0.01
    assert bench.headline(res)["figures"]["overhead_per_step_cpu"] == {"stage": 1.2, "mlflow_async": 1.2}
