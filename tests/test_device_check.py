"""The device_utilisation check and the step-time check's time per flow step, on synthetic
telemetry: a run without CUDA has nothing to judge, a busy GPU passes, an idle one warns or fails
and names the cause it measured (host syncs, short kernels, data waits) with its fix, and
synthetic figures are said to be synthetic."""

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.report.checks import (
    CHECK_ORDER,
    MEASURED_CHECKS,
    REMEASURE,
    WALL_CLOCK_CHECKS,
    check_device_utilisation,
    check_step_time,
    prepare_steps,
    resolve_params,
    run_checks,
    stability_metrics,
)
from pipeline.report.layout import CHECK_PLOTS, verdict_parts
from pipeline.report.plots import make_plots, plot_device, plot_step_time
from pipeline.report.render import render_markdown
from pipeline.report.units import fmt_value

# Flat synthetic step times have no rank trend: Spearman's rho is undefined (NaN), as it should be.
pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")]

N = 200
SYNTHETIC_SAID = "synthetic device figures from fault=sync_bound on a machine without a GPU"


def p(**overrides) -> dict:
    return resolve_params({"planned_steps": 10_000, **overrides})


def device_run(n: int = N, **cols) -> pd.DataFrame:
    """A GPU run's telemetry: one row per step, a busy GPU (0.9), one host read, 800 ops and 900
    kernels of 40 us per step, 1 % of the step waiting for data; `cols` replace columns (scalars
    broadcast)."""
    step = np.arange(1, n + 1)
    base = {
        "step": step,
        "perf/step_ms": 20.0,
        "perf/data_ms": 0.2,
        "perf/host_syncs": 1.0,
        "perf/ops": 800.0,
        "perf/kernels": 900.0,
        "perf/kernel_us": 40.0,
        "perf/gpu_busy": 0.9,
        "perf/busy_synthetic": 0.0,
    }
    base.update(cols)
    return prepare_steps(pd.DataFrame({k: np.broadcast_to(v, n) for k, v in base.items()}))


def judge(df: pd.DataFrame, **params) -> dict:
    return check_device_utilisation(df, p(**params))


# ---------------------------------------------------------------- when there is nothing to judge


def test_a_run_without_cuda_is_na_and_still_shows_its_counts():
    df = device_run(**{"perf/gpu_busy": np.nan, "perf/kernels": np.nan, "perf/kernel_us": np.nan, "perf/ops": 750.0})
    check = judge(df)
    assert check["status"] == "n/a" and check["pass"] is True and check["fix"] is None
    assert "perf/gpu_busy is NaN on every row (a run without CUDA)" in check["summary"]
    assert "nothing to judge" in check["summary"] and "1 host sync, 750 ops per step" in check["summary"]
    assert check["evidence"] == {"host_syncs_per_step": 1.0, "ops_per_step": 750.0}
    # n/a is not a check that passed or was skipped: the verdict line leaves it out.
    result = run_checks(df, [], p())
    assert "device_utilisation" not in verdict_parts(result)[1]


def test_without_the_busy_column_it_skips_and_says_what_to_log():
    check = judge(device_run().drop(columns=["perf/gpu_busy"]))
    assert check["status"] == "skip" and check["pass"] is True
    assert check["summary"] == "perf/gpu_busy not logged." and "perf/gpu_busy" in check["fix"]


def test_an_unmeasured_run_skips_it_with_the_other_measured_checks():
    result = run_checks(
        device_run(**{"perf/gpu_busy": 0.05}), [], p(), unmeasured="telemetry/train_perf.csv is missing"
    )
    check = result["checks"]["device_utilisation"]
    assert check["status"] == "skip" and check["fix"] == REMEASURE and "train_perf.csv is missing" in check["summary"]


# ---------------------------------------------------------------- thresholds


def test_a_busy_gpu_passes_with_its_figures():
    check = judge(device_run())
    assert check["status"] == "pass" and check["fix"] is None
    assert check["summary"].startswith("The GPU ran kernels 90 % of the sampled steps' wall time")
    assert "1 host sync, 900 kernels of 40.0 µs per step, 1 % of the step waiting for data." in check["summary"]
    ev = check["evidence"]
    assert ev["busy_fraction"] == 0.9 and ev["host_syncs_per_step"] == 1.0 and ev["kernels_per_step"] == 900.0
    assert ev["kernel_us"] == 40.0 and ev["data_wait_fraction"] == pytest.approx(0.01) and ev["ops_per_step"] == 800
    assert ev["synthetic"] is False and ev["causes"] == "none judged" and ev["rows"] == N - 10
    assert not (ev["sync_bound"] or ev["launch_bound"] or ev["data_bound"])


@pytest.mark.parametrize(
    "busy, status", [(0.9, "pass"), (0.6, "pass"), (0.59, "warn"), (0.2, "warn"), (0.19, "fail"), (0.0, "fail")]
)
def test_busy_below_warn_warns_and_below_fail_fails(busy, status):
    check = judge(device_run(**{"perf/gpu_busy": busy}))
    assert check["status"] == status and check["pass"] is (status != "fail")
    assert (check["fix"] is None) is (status == "pass")


def test_the_thresholds_are_the_report_params():
    df = device_run(**{"perf/gpu_busy": 0.5})
    assert judge(df, device_busy_warn=0.4, device_busy_fail=0.1)["status"] == "pass"
    assert judge(df, device_busy_warn=0.9, device_busy_fail=0.55)["status"] == "fail"
    ev = judge(df, device_busy_warn=0.9, device_busy_fail=0.55)["evidence"]
    assert (ev["warn_below_fraction"], ev["fail_below_fraction"]) == (0.9, 0.55)


def test_warm_up_rows_are_left_out_and_only_sampled_rows_count():
    busy = np.where(np.arange(1, N + 1) <= 10, 0.01, 0.9)  # the first steps autotune
    busy[20::2] = np.nan  # rows whose window sampled no step
    check = judge(device_run(**{"perf/gpu_busy": busy}))
    assert check["status"] == "pass" and check["evidence"]["rows"] == 10 + (N - 20) // 2
    # A run shorter than its warm-up is judged on the rows it has.
    assert judge(device_run(n=8, **{"perf/gpu_busy": 0.1}))["status"] == "fail"


# ---------------------------------------------------------------- causes


def test_sync_bound_is_named_with_its_count_and_fix():
    check = judge(device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 12.0}))
    assert check["status"] == "fail"
    assert "sync-bound, 12 host syncs per step (more than report.device_max_syncs = 2)" in check["summary"]
    assert "train.flow_loop=masked" in check["fix"] and "read them once per step" in check["fix"]
    ev = check["evidence"]
    assert ev["causes"] == "sync-bound" and ev["sync_bound"] is True and ev["launch_bound"] is False
    # The limit is the report's: 12 reads are within a limit of 12.
    assert (
        "sync-bound"
        not in judge(device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 12.0}), device_max_syncs=12)["summary"]
    )


def test_launch_bound_is_named_with_kernels_and_their_length():
    check = judge(device_run(**{"perf/gpu_busy": 0.3, "perf/kernels": 3000.0, "perf/kernel_us": 6.0}))
    assert check["status"] == "warn"
    assert "launch-bound, 3,000 kernels of 6.0 µs per step" in check["summary"]
    assert "train.cuda_graph=always" in check["fix"] and "train.flow_loop=masked" in check["fix"]
    assert "batch_size" in check["fix"]
    assert check["evidence"]["causes"] == "launch-bound" and check["evidence"]["launch_bound"] is True


def test_data_bound_is_named_with_the_share_of_the_step_spent_waiting():
    check = judge(device_run(**{"perf/gpu_busy": 0.3, "perf/data_ms": 10.0}))
    assert check["status"] == "warn"
    assert "data-bound, 50 % of the step waiting for data (perf/data_ms / perf/step_ms" in check["summary"]
    assert "train.prefetch" in check["fix"] and "pinned" in check["fix"]
    assert check["evidence"]["causes"] == "data-bound" and check["evidence"]["data_wait_fraction"] == 0.5


def test_several_causes_are_listed_strongest_first():
    # 40 syncs is 20x its limit of 2; 10 us kernels are 2x short of 20 us: syncs first.
    df = device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 40.0, "perf/kernel_us": 10.0, "perf/data_ms": 8.0})
    check = judge(df)
    assert check["evidence"]["causes"] == "sync-bound, launch-bound, data-bound"
    summary = check["summary"]
    assert summary.index("sync-bound") < summary.index("launch-bound") < summary.index("data-bound")
    assert check["fix"].index("Sync-bound") < check["fix"].index("Launch-bound") < check["fix"].index("Data-bound")
    # 3 syncs are 1.5x their limit; 2 us kernels 10x short: launches first.
    df = device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 3.0, "perf/kernel_us": 2.0})
    assert judge(df)["evidence"]["causes"] == "launch-bound, sync-bound"


def test_an_idle_gpu_without_a_measured_cause_says_so_and_shows_the_numbers():
    check = judge(device_run(**{"perf/gpu_busy": 0.1}))
    assert check["status"] == "fail" and check["evidence"]["causes"] == "not identified"
    assert (
        ": cause not identified (1 host sync, 900 kernels of 40.0 µs per step, 1 % of the step waiting for data)."
        in check["summary"]
    )
    assert "torch.profiler" in check["fix"]


# ---------------------------------------------------------------- synthetic figures


def test_synthetic_figures_are_said_to_be_synthetic():
    """fault=sync_bound on a machine without a GPU: the trainer fills in a sync-bound GPU's
    figures (busy 0.05, one 5 us kernel per op) and marks them; the report must say so."""
    df = device_run(
        **{
            "perf/gpu_busy": 0.05,
            "perf/host_syncs": 43.0,
            "perf/ops": 1500.0,
            "perf/kernels": 1500.0,
            "perf/kernel_us": 5.0,
            "perf/busy_synthetic": 1.0,
        }
    )
    check = judge(df)
    assert check["status"] == "fail" and check["evidence"]["synthetic"] is True
    assert SYNTHETIC_SAID in check["summary"] and "43 host syncs per step" in check["summary"]
    assert check["evidence"]["causes"].startswith("sync-bound")
    # Measured figures are never called synthetic, nor are rows outside the judged ones.
    assert SYNTHETIC_SAID not in judge(device_run(**{"perf/gpu_busy": 0.05}))["summary"]
    early = np.where(np.arange(1, N + 1) <= 10, 1.0, 0.0)
    assert judge(device_run(**{"perf/gpu_busy": 0.05, "perf/busy_synthetic": early}))["evidence"]["synthetic"] is False


# ---------------------------------------------------------------- where the figures go


def test_only_the_counts_reach_the_dvc_metrics():
    """metrics/stability.json must be the same bits on every run: the busy share, kernel
    durations and data waits are wall-clock measurements and stay out; host syncs and ops per
    step are counts and stay in (dvc metrics diff shows what a change did to them)."""
    result = run_checks(device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 12.0}), [], p())
    dvc, full = stability_metrics(result), stability_metrics(result, measured=True)
    assert dvc["device_utilisation"] == {
        "pass": False,
        "status": "fail",
        "host_syncs_per_step": 12.0,
        "ops_per_step": 800.0,
        "synthetic": False,
    }
    assert full["device_utilisation"]["busy_fraction"] == 0.1 and full["device_utilisation"]["sync_bound"] is True
    assert "causes" not in full["device_utilisation"]  # text stays in the report
    assert "device_utilisation" in MEASURED_CHECKS and "device_utilisation" in WALL_CLOCK_CHECKS


def test_it_runs_after_the_step_time_check_and_renders_with_units():
    assert CHECK_ORDER.index("device_utilisation") == CHECK_ORDER.index("step_time_degradation") + 1
    assert CHECK_PLOTS["device_utilisation"] == "device"
    assert fmt_value("host_syncs_per_step", 42.0) == "42 host syncs per step"
    assert fmt_value("perf/kernels_per_step", 1200.0) == "1,200 kernels per step"
    assert fmt_value("ops_per_step", 800.0) == "800 ops per step"
    assert fmt_value("kernel_us", 5.0) == "5 µs"
    assert fmt_value("busy_fraction", 0.05) == "5 %"
    md = render_markdown(run_checks(device_run(**{"perf/gpu_busy": 0.1, "perf/host_syncs": 12.0}), [], p()), {}, {})
    assert "## device_utilisation: FAIL" in md and "- host_syncs_per_step: 12 host syncs per step" in md


def test_the_device_plot_draws_the_busy_share_against_its_lines(tmp_path):
    df = device_run(**{"perf/gpu_busy": 0.05, "perf/host_syncs": 43.0, "perf/busy_synthetic": 1.0})
    fig = plot_device(df, [], p())
    busy_axes, syncs_axes = fig.axes
    assert "synthetic" in busy_axes.get_title() and syncs_axes.get_ylabel() == "host syncs per step"
    labels = busy_axes.get_legend().get_texts()
    assert [t.get_text() for t in labels][-3:] == ["warns below 0.6", "fails below 0.2", "perf/host_syncs"]
    assert "device" in make_plots(df, [], p(), tmp_path)
    # Without GPU figures there is nothing to draw, and no stale PNG of another run is left.
    cpu = device_run(**{"perf/gpu_busy": np.nan})
    assert plot_device(cpu, [], p()) is None and "device" not in make_plots(cpu, [], p(), tmp_path)
    assert not (tmp_path / "device.png").exists()


# ---------------------------------------------------------------- step time per flow step


def flow_run(step_ms: np.ndarray, flow_steps: np.ndarray, per_flow: bool = True) -> pd.DataFrame:
    df = device_run(**{"perf/step_ms": step_ms, "flow/steps_used": flow_steps})
    if per_flow:
        df["perf/flow_step_ms"] = df["perf/step_ms"] / df["flow/steps_used"]
    return df


LATE = np.arange(1, N + 1) > N // 2


def test_more_flow_steps_per_batch_is_not_a_slower_loop():
    """Step time doubles because the model takes twice the flow steps: time per flow step is flat."""
    check = check_step_time(flow_run(np.where(LATE, 40.0, 20.0), np.where(LATE, 8.0, 4.0)), p())
    assert check["status"] == "pass" and check["fix"] is None
    ev = check["evidence"]
    assert ev["judged"] == "time per flow step" and ev["ratio"] == pytest.approx(1.0)
    assert ev["step_ratio"] == pytest.approx(2.0) and ev["flow_steps_ratio"] == pytest.approx(2.0)
    assert (ev["early_flow_step_ms"], ev["steady_flow_step_ms"]) == (5.0, 5.0)
    assert check["summary"].startswith("Steady-state median time per flow step 5 ms is 1.00x the early median 5 ms")
    assert "per training step 40.0 ms is 2.00x the early 20.0 ms, with 2.00x the flow steps" in check["summary"]


def test_a_slower_flow_step_fails():
    check = check_step_time(flow_run(np.where(LATE, 40.0, 20.0), np.full(N, 4.0)), p())
    assert check["status"] == "fail" and check["evidence"]["ratio"] == pytest.approx(2.0)
    assert "time per flow step 10 ms is 2.00x" in check["summary"] and ".item()" in check["fix"]
    # Also when the flow steps fell and the step still got slower.
    check = check_step_time(flow_run(np.where(LATE, 32.0, 20.0), np.where(LATE, 2.0, 4.0)), p())
    assert check["status"] == "fail" and check["evidence"]["step_ratio"] == pytest.approx(1.6)


def test_fewer_flow_steps_with_a_step_no_slower_warns():
    """Half the flow steps in a step that takes as long: per-step work that does not scale with
    flow steps, spread over fewer of them, doubles the time per flow step with nothing slower."""
    check = check_step_time(flow_run(np.full(N, 20.0), np.where(LATE, 2.0, 4.0)), p())
    assert check["status"] == "warn" and check["pass"] is True
    assert check["evidence"]["ratio"] == pytest.approx(2.0) and check["evidence"]["step_ratio"] == pytest.approx(1.0)
    assert "The time per training step stayed within the limit" in check["summary"]
    assert "convergence" in check["fix"]


def test_the_step_time_plot_shows_the_time_it_judged():
    per_flow = plot_step_time(flow_run(np.where(LATE, 40.0, 20.0), np.where(LATE, 8.0, 4.0)), [], p())
    assert len(per_flow.axes) == 2 and per_flow.axes[1].get_ylabel() == "ms per flow step"
    assert "judged per flow step" in per_flow.axes[0].get_title()
    per_step = plot_step_time(flow_run(np.full(N, 20.0), np.full(N, 4.0), per_flow=False), [], p())
    assert len(per_step.axes) == 1 and per_step.axes[0].get_title() == "Step time"


def test_telemetry_without_time_per_flow_step_is_judged_per_step_as_before():
    df = flow_run(np.where(LATE, 34.0, 20.0), np.where(LATE, 5.0, 3.0), per_flow=False)
    check = check_step_time(df, p())
    assert check["status"] == "warn" and check["evidence"]["judged"] == "time per training step"
    assert "step_ratio" not in check["evidence"] and "1.67x the flow steps" in check["summary"]
    # A column of NaN (a trainer that could not divide) is no time per flow step either.
    df["perf/flow_step_ms"] = np.nan
    assert check_step_time(df, p())["evidence"]["judged"] == "time per training step"


# ---------------------------------------------------------------- the params


def test_the_device_params_are_checked_when_the_config_loads():
    cfg = load_config([])
    assert (cfg.report.device_busy_warn, cfg.report.device_busy_fail, cfg.report.device_max_syncs) == (0.6, 0.2, 2)
    for override, message in (
        ("report.device_busy_warn=1.5", "parameter 'report.device_busy_warn' = 1.5: expected a fraction in [0, 1]"),
        ("report.device_busy_fail=0.7", "parameter 'report.device_busy_fail' = 0.7: expected a fraction in [0, "),
        ("report.device_max_syncs=-1", "parameter 'report.device_max_syncs' = -1: expected an integer >= 0"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config([override])
        assert message in str(err.value), str(err.value)


def test_params_resolve_to_numbers():
    q = resolve_params({"device_max_syncs": "3", "device_busy_warn": "0.5"})
    assert q["device_max_syncs"] == 3 and isinstance(q["device_max_syncs"], int) and q["device_busy_warn"] == 0.5
    assert math.isclose(resolve_params({})["device_busy_fail"], 0.2)
