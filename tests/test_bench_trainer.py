"""bench.trainer's measuring pieces: every host read of a run is counted (the optimizer's own
step counters alone left out, without changing the training), the RSS slope sees a leak, the CLI
answers --help.
No timing is asserted: the benchmark reports ratios, tests check behaviour."""

import json
import math
import subprocess
import sys

import pytest
import torch

from bench import trainer as bench
from pipeline.core.paths import REPO_ROOT
from pipeline.train.step_counters import optimizer_host_tensors
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration


def test_priming_the_optimizer_state_changes_nothing_of_the_training():
    # Two identical models and AdamWs, one primed: the same parameters after three real steps,
    # and the primed one's host-resident step counters existed before the first.
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
        return model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)

    plain, primed = make(), make()
    assert optimizer_host_tensors(primed[1]) == []
    bench.prime_optimizer_state(primed[1])
    counters = optimizer_host_tensors(primed[1])
    assert len(counters) == 4 and all(float(c) == 0.0 for c in counters)  # one per parameter, as fresh
    assert all(p.grad is None for p in primed[0].parameters()) and primed[1].param_groups[0]["lr"] == 0.1
    x = torch.randn(5, 4)
    for model, opt in (plain, primed):
        for _ in range(3):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(plain[0].parameters(), primed[0].parameters()):
        assert torch.equal(a, b)
    assert [id(c) for c in optimizer_host_tensors(primed[1])] == [id(c) for c in counters]  # updated in place
    assert all(float(c) == 3.0 for c in counters)


@pytest.mark.parametrize("log_every", [None, 1, 5])
def test_every_host_read_of_the_run_is_counted(log_every):
    # smoke's log_every 2 (None), every step a log step (1), and 5, where the 12th and last step
    # closes a 2-step window. Every read is counted, whoever makes it: the trainer's one
    # (StepHealth.step_readout's .tolist(), which on a log step carries the window's accumulators
    # in the same vector) and, on a CPU, the compacting flow loop's one per flow step. AdamW's
    # host-resident step counters are the one thing left out (no validation split is given: its
    # reads per epoch are outside the steps).
    res = bench.host_syncs(12, log_every)
    assert res["steps"] == 12 and res["flow_loop"] == "compact"
    assert res["flow_loop_iterations_per_step"] >= 1
    assert res["host_syncs_per_step"] == pytest.approx(1 + res["flow_loop_iterations_per_step"])
    assert res["ops_per_step"] > 100
    # Sites read "dir/file.py:line function op"; together they are every read of the run.
    assert sum(res["sites"].values()) == res["host_syncs_per_step"] * 12
    by_place = {}
    for site, n in res["sites"].items():
        where, function, op = site.split()
        key = (where.split(":")[0], function, op)
        by_place[key] = by_place.get(key, 0) + n
    readout = by_place.pop(("train/step_health.py", "step_readout", "tolist"))
    assert readout == 12  # one a step
    assert list(by_place) and all(k[0] == "model/energy_flow.py" and k[2] == "nonzero" for k in by_place)
    assert res["optimizer_host_tensors_excluded"] > 0


def test_host_reads_part_reports_both_flow_loops(capsys):
    res = bench.main(["--parts", "host_reads", "--sync-steps", "6"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == res
    assert res["sync_steps"] == 6 and res["host_syncs_flow_loop"] == "compact"  # a CPU's choice
    assert res["host_syncs_per_step"] > 1  # one read per flow step: the goal is missed on a CPU
    assert res["goals_met"]["host_syncs_per_step"] is False
    assert res["host_sync_sites"] and "optimizer_host_tensors" in res["host_syncs_excluded"]
    assert res["host_syncs_per_step_masked"] == 1.0  # the trainer's own read, nothing else
    assert res["goals_met"]["host_syncs_per_step_masked"] is True


@pytest.mark.slow  # two fresh smoke runs of the bench (11.5 s of the default suite's 603 s, idle AMD EPYC)
def test_the_rss_slope_sees_the_leak_and_not_the_clean_run():
    clean = bench.rss_slope_per_1k(bench.fresh_run(100, bench.SMOKE_THREADS)["rows"], after=20)
    leak = bench.rss_slope_per_1k(
        bench.fresh_run(100, bench.SMOKE_THREADS, "fault=leak", "fault.step=1")["rows"], after=20
    )
    # Each leaked step keeps its graph (~0.15-0.2 MB on the smoke model); the clean run settles.
    assert leak > 50 and leak > 10 * max(clean, 1.0), (clean, leak)


def test_slope_and_window_helpers():
    rows = [
        {"step": s, "mem/rss_mb": 300 + 0.004 * s + (0.5 if s == 10 else 0), "perf/step_ms": float(s)}
        for s in range(2, 202, 2)
    ]
    assert bench.rss_slope_per_1k(rows, after=20) == pytest.approx(4.0)  # the bump at step 10 is before the fit
    assert bench.median_between(rows, "perf/step_ms", 20, 120) == 70.0
    with pytest.raises(ValueError):
        bench.rss_slope_per_1k(rows, after=198)


def test_drift_is_divided_by_the_probes_of_the_same_windows(monkeypatch):
    # Steps 400-500 run 1.5x slower than 20-120, and so do the probes taken there: the machine,
    # not the loop, slowed down, and the drift says so. The raw ratio keeps the 1.5.
    def fake_run(steps, *overrides, probe_every=0):
        assert probe_every == bench.DRIFT_PROBE_EVERY and bench.SMOKE_THREADS in overrides
        slow = lambda s: 1.5 if s >= 300 else 1.0  # noqa: E731
        rows = [
            {"step": s, "perf/step_ms": 6.0 * slow(s), "flow/flow_steps": 40.0, "mem/rss_mb": 300.0}
            for s in range(2, steps + 1, 2)
        ]
        return {"rows": rows, "probes": [[s, 0.003 * slow(s)] for s in range(10, steps + 1, 10)], "probe_threads": [1]}

    monkeypatch.setattr(bench, "fresh_run", fake_run)
    res = bench.drift_and_rss(steps=500, repeats=2)
    assert res["step_time_drift_raw"] == pytest.approx(1.5)
    assert res["step_time_drift"] == pytest.approx(1.0)
    assert res["step_time_drift_runs"] == pytest.approx([1.0, 1.0])
    assert res["drift_probe_late_ms"] == pytest.approx(1.5 * res["drift_probe_early_ms"])
    assert res["drift_probe"]["probe_count"] == 2 * 50  # the fake's probes, every 10 steps
    assert res["drift_probe"]["probe_spread_max_min"] == pytest.approx(1.5)


def test_a_smoke_run_takes_its_probes_between_windows_on_the_runs_thread():
    run = bench.smoke_run(40, bench.SMOKE_THREADS, probe_every=2)
    rows, probes = run["rows"], run["probes"]
    assert len(rows) == 20 and len(probes) == 10
    assert [s for s, _ in probes] == [r["step"] for r in rows][1::2]  # every 2nd row, at its step
    assert all(p > 0 for _, p in probes) and run["probe_threads"] == [1]  # the trainer's thread count
    assert bench.smoke_run(10)["probes"] == []


@pytest.mark.slow  # a quick run of the overhead rounds and one drift run (~1-2 min on a busy 2-core machine)
def test_quick_run_reports_the_split_overhead_drift_cpu_and_probes():
    res = bench_json("bench.trainer", "--quick", "--parts", "overhead,drift", timeout=900)
    for key in (
        "telemetry_overhead_per_step",
        "telemetry_overhead_per_step_across_runs",
        "telemetry_overhead_per_step_across_runs_raw",
        "telemetry_fixed_s",
        "telemetry_fixed_s_raw",
        "telemetry_fixed_s_in_run",
        "telemetry_cpu_s_per_run",
        "gradient_health_overhead",
        "bare_loop_step_ms",
        "step_time_drift",
        "step_time_drift_raw",
    ):
        assert isinstance(res[key], float) and math.isfinite(res[key]), key
    assert res["overhead_arms_same_work"] is True and res["overhead_pairs"] == 1
    assert res["overhead_segment_s"] == 0.5
    # How many sent/unsent segment pairs a quick run holds depends on the machine's speed (a busy
    # machine's quick run may hold none); with none, the per-step figure is the across-runs one.
    segments = res["telemetry_overhead_per_step_segments"]
    assert isinstance(segments, int) and segments >= 0
    if segments == 0:
        assert res["telemetry_overhead_per_step"] == res["telemetry_overhead_per_step_across_runs"]
    assert set(res["overhead_per_arm"]) == {"off", "stage", "bare"}
    # The tracked arm stored telemetry, the others none.
    assert res["overhead_per_arm"]["stage"]["metrics_logged_per_run"] > 0
    assert res["overhead_per_arm"]["off"]["metrics_logged_per_run"] == 0
    # The fixed part is judged against the default run's length: its steps as recorded, its step time as measured.
    if res["default_run_steps"]:
        assert res["default_run_s"] > 0 and "metrics/train.json" in res["default_run_steps_source"]
        assert res["telemetry_fixed_fraction_of_default_run"] == pytest.approx(
            res["telemetry_fixed_s"] / res["default_run_s"]
        )
        assert res["telemetry_overhead"] == pytest.approx(
            res["telemetry_overhead_per_step"] + res["telemetry_fixed_fraction_of_default_run"]
        )
        assert "telemetry_fixed_fraction_of_default_run" in res["goals_met"]
    assert len(res["step_time_drift_runs"]) == 1 and res["drift_probe"]["probe_threads"] == [1]
    assert isinstance(res["cpu_model"], str) and res["cpu_model"]
    for probe in (res["probe"], res["drift_probe"]):
        assert probe["probe_count"] > 0 and probe["probe_ms_min"] <= probe["probe_ms_median"] <= probe["probe_ms_max"]
        assert probe["probe_spread_max_min"] >= probe["probe_spread_p90_p10"] >= 1.0
    # Only the parts that ran are judged; every verdict is a bool.
    assert {"telemetry_overhead_per_step", "step_time_drift", "rss_growth_mb_per_1k_steps"} <= set(res["goals_met"])
    assert "host_syncs_per_step" not in res["goals_met"]
    assert all(isinstance(v, bool) for v in res["goals_met"].values())
    assert set(res["goals"]) == set(bench.GOALS)


def test_cli_help_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "bench.trainer", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for word in (
        "telemetry_overhead_per_step",
        "telemetry_fixed_fraction_of_default_run",
        "host_syncs_per_step",
        "step_time_drift",
        "rss_growth_mb_per_1k_steps",
        "cpu_model",
        "--pairs",
        "--quick",
        "--parts",
    ):
        assert word in out.stdout, word


def test_drift_in_cpu_time_compares_the_runs_own_cpu_seconds_per_step(monkeypatch):
    # The machine slows down late (wall and probes 1.5x), but the run's CPU seconds per step rise
    # only 1.2x: that is the loop's own drift.
    def fake_run(steps, *overrides, probe_every=0):
        late = lambda s: s >= 300  # noqa: E731
        rows = [
            {"step": s, "perf/step_ms": 6.0 * (1.5 if late(s) else 1.0), "flow/flow_steps": 40.0, "mem/rss_mb": 300.0}
            for s in range(2, steps + 1, 2)
        ]
        cpu, t = [], 0.0
        for r in rows:
            t += 2 * 0.005 * (1.2 if late(r["step"]) else 1.0)
            cpu.append([r["step"], t])
        probes = [[s, 0.003 * (1.5 if late(s) else 1.0)] for s in range(10, steps + 1, 10)]
        return {"rows": rows, "probes": probes, "cpu": cpu, "probe_threads": [1]}

    monkeypatch.setattr(bench, "fresh_run", fake_run)
    res = bench.drift_and_rss(steps=500, repeats=2)
    assert res["step_time_drift_cpu"] == pytest.approx(1.2)
    assert res["step_time_drift_cpu_runs"] == pytest.approx([1.2] * 2)
    assert res["step_time_drift_raw"] == pytest.approx(1.5)


def test_a_smoke_run_keeps_its_cpu_seconds_at_every_row():
    run = bench.smoke_run(20, bench.SMOKE_THREADS, probe_every=2)
    assert [s for s, _ in run["cpu"]] == [r["step"] for r in run["rows"]]
    assert all(b >= a for (_, a), (_, b) in zip(run["cpu"], run["cpu"][1:]))


def test_the_per_run_cpu_cost_stands_only_when_its_rounds_agree():
    assert bench.per_run_unreliable({}) is None
    assert bench.per_run_unreliable({"telemetry_cpu_s_per_run": 0.5, "telemetry_cpu_s_per_run_spread": 0.01}) is None
    assert "max - min" in bench.per_run_unreliable(
        {"telemetry_cpu_s_per_run": 0.5, "telemetry_cpu_s_per_run_spread": 0.3}
    )
