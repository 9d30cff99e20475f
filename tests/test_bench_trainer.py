"""bench.trainer's measuring pieces: the host-read counter attributes and counts what it should,
the trainer reads the host once per step, the RSS slope sees a leak, the CLI answers --help.
No timing is asserted: the benchmark reports ratios, tests check behaviour."""

import math
import subprocess
import sys

import pytest
import torch

from bench import trainer as bench
from pipeline.core.paths import REPO_ROOT
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration


def run_from(path, code, **names):
    """Run `code` as if it were a line of the file at `path` (the counter goes by the caller's file)."""
    exec(compile(code, str(path), "exec"), {"torch": torch, **names})


def test_host_reads_are_attributed_to_the_calling_file_and_unpatched_after():
    t = torch.ones(3)
    every_read = (
        "t.sum().item(); t.tolist(); t.cpu(); t.numpy(); t.nonzero(); bool(t[0]); float(t[0]); "
        "int(t[0]); torch.nonzero(t)"
    )
    with bench.HostReads() as reads:
        run_from(bench.PIPELINE_DIR / "any_loop_file.py", every_read, t=t)
        run_from(bench.MODEL_DIR / "any_model_file.py", "t.nonzero()", t=t)
        from torch.optim.optimizer import _get_value

        _get_value(torch.tensor(1.0))  # AdamW's CPU step counter: torch's own read
        t.tolist()  # from this file: neither ours nor torch's
        t.sum()  # not a read
    assert dict(reads.counts) == {"loop": 9, "model": 1, "torch": 1, "other": 1}
    assert sum(n for site, n in reads.sites.items() if site.startswith("loop pipeline/any_loop_file.py:1 ")) == 9
    assert not any(op in torch.Tensor.__dict__ for op in bench._TENSOR_READS)  # back to TensorBase's
    assert torch.nonzero is torch._C._VariableFunctions.nonzero
    with bench.HostReads() as reads:
        with pytest.raises(ZeroDivisionError):
            run_from(bench.PIPELINE_DIR / "x.py", "t.item(); 1 / 0", t=torch.ones(()))
    assert "item" not in torch.Tensor.__dict__  # restored on an error too


@pytest.mark.parametrize("log_every", [None, 1, 5])
def test_the_trainer_reads_the_host_once_per_step(log_every):
    # smoke's log_every 2 (None), every step a log step (1), and 5, where the 12th and last step
    # closes a 2-step window: each step makes exactly one read, StepHealth.step_readout's .tolist(),
    # which on a log step carries the window's accumulators in the same vector. Nothing else in
    # pipeline/ outside the model reads (no validation split is given: its two float() reads per
    # epoch are outside the steps).
    res = bench.host_syncs(steps=12, log_every=log_every)
    assert res["steps"] == 12
    assert res["host_syncs_per_step"] == 1.0
    # Sites read "kind file:line function op".
    loop_sites = {(site.split(":")[0], site.split()[2]) for site in res["sites"] if site.startswith("loop ")}
    assert loop_sites == {("loop pipeline/train/step_health.py", "step_readout")}
    # The flow loop reads once per flow step (which flows are still alive), and only there.
    assert res["model_syncs_per_step"] == pytest.approx(res["flow_loop_iterations_per_step"])
    assert res["model_syncs_per_step"] >= 1
    # AdamW reads each parameter's CPU step counter: counted apart, never as ours.
    assert res["torch_internal_reads_per_step"] > 0


@pytest.mark.slow  # two fresh smoke runs of the bench (11.5 s of the default suite's 603 s, idle AMD EPYC)
def test_the_rss_slope_sees_the_leak_and_not_the_clean_run():
    clean = bench.rss_slope_per_1k(bench.fresh_rows(100, bench.SMOKE_THREADS), after=20)
    leak = bench.rss_slope_per_1k(bench.fresh_rows(100, bench.SMOKE_THREADS, "fault=leak", "fault.step=1"), after=20)
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
