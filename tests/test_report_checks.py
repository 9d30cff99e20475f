"""Stability checks on synthetic telemetry: a clean run raises no alarm, each injected fault is
flagged by its own check, missing data is a skip and never a crash."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from pipeline.report.checks import CHECK_ORDER, prepare_steps, resolve_params, run_checks, spike_scan, stability_metrics
from tests.helpers.synthetic import clean_run

pytestmark = pytest.mark.unit

N = 500
PARAMS = {"planned_steps": 10_000, "step_cap": 12, "min_steps_to_arrive": 4}  # the rest: defaults
# A model that learned: above the identity baseline.
EVAL = {
    "eval/test/model/cosine": 0.88,
    "eval/test/model/top1": 0.8,
    "eval/test/identity/cosine": 0.82,
    "eval/test/ridge/cosine": 0.9,
}


def nan_events(steps, module="carrier.gru.0"):
    return [{"step": int(s), "kind": "nan_grad", "module": module, "action": "skipped"} for s in steps]


def with_nan_loss(df, steps):
    df = df.copy()
    df.loc[df["step"].isin(steps), "train/loss"] = np.nan
    df.loc[df["step"].isin(steps), "train/skipped"] = 1
    return df


@pytest.mark.parametrize("seed", range(5))
def test_clean_run_is_stable_every_check_passes(seed):
    result = run_checks(clean_run(seed=seed), [], PARAMS, EVAL)
    assert result["verdict"] == "stable"
    assert result["failed"] == []
    assert list(result["checks"]) and set(result["checks"]) == set(CHECK_ORDER)
    for name, check in result["checks"].items():
        # fp32 telemetry: no loss scale, so the scaler check does not apply.
        assert check["status"] == ("n/a" if name == "scaler" else "pass"), (name, check["summary"])
        assert check["pass"] is True and check["fix"] is None
        assert check["summary"].endswith(".")


def test_memory_climb_fails_with_slope_near_truth():
    df = clean_run()
    df["mem/rss_mb"] = 1500 + 0.2 * df["step"] + np.random.default_rng(1).uniform(-5, 5, N)  # +200 MB/1k
    result = run_checks(df, [], PARAMS)
    check = result["checks"]["memory_growth"]
    assert check["status"] == "fail" and check["pass"] is False
    assert result["verdict"] == "unstable" and result["failed"] == ["memory_growth"]
    ev = check["evidence"]
    assert ev["series"] == "rss"
    assert abs(ev["slope_mb_per_1k_steps"] - 200) / 200 < 0.10
    assert ev["p_value"] < 1e-6 and ev["r2"] > 0.9
    assert ev["projected_mb"] == pytest.approx(1500 + 0.2 * 10_000, rel=0.05)
    assert re.search(r"~(19\d|2[01]\d) MB per 1k steps", check["fix"]) and "retain_graph=True" in check["fix"]
    assert "device_slope_mb_per_1k_steps" in ev  # the flat series is still reported, prefixed
    assert next(iter(result["checks"])) == "memory_growth"  # failed checks come first


def test_memory_device_climb_is_caught_when_host_is_flat():
    df = clean_run()
    df["mem/device_allocated_mb"] = 800 + 0.1 * df["step"]
    check = run_checks(df, [], PARAMS)["checks"]["memory_growth"]
    assert check["status"] == "fail" and check["evidence"]["series"] == "device"


def test_memory_significant_but_small_slope_passes():
    # 5 MB per 1k steps with tiny noise: p is ~0 but 5 < memory_min_mb_per_1k (20).
    df = clean_run()
    df["mem/rss_mb"] = 1500 + 0.005 * df["step"] + np.random.default_rng(2).uniform(-0.1, 0.1, N)
    check = run_checks(df, [], PARAMS)["checks"]["memory_growth"]
    assert check["evidence"]["p_value"] < 0.01
    assert check["status"] == "pass"


def test_memory_on_cpu_ignores_zero_device_series():
    df = clean_run()
    df["mem/device_allocated_mb"] = 0.0
    df["mem/device_peak_mb"] = 0.0
    check = run_checks(df, [], PARAMS)["checks"]["memory_growth"]
    assert check["status"] == "pass"
    assert "constant" in check["evidence"]["not_tested"]
    assert "device_peak_max_mb" not in check["evidence"]


def test_memory_of_a_resumed_run_is_fitted_on_the_last_process_only():
    # Killed at step 400, resumed: the new process holds 120 MB more than the old one did (it
    # loaded a checkpoint) and is flat from then on. Across both processes the second-half fit
    # reads the step as a leak; the last process alone, after its warm-up, is flat.
    df = clean_run()
    after = df["step"] > 400
    df.loc[after, "mem/rss_mb"] += 120
    assert run_checks(df, [], PARAMS)["checks"]["memory_growth"]["status"] == "fail"
    check = run_checks(df, [], {**PARAMS, "resumed_from_step": 400, "warmup_steps": 20})["checks"]["memory_growth"]
    assert check["status"] == "pass" and check["evidence"]["first_step"] > 420


def test_memory_with_too_few_rows_after_warmup_skips():
    check = run_checks(clean_run(n=13), [], PARAMS)["checks"]["memory_growth"]
    assert check["status"] == "skip" and check["pass"] is True
    assert "need 5" in check["summary"]


def test_step_time_doubling_fails():
    df = clean_run()
    df.loc[df["step"] > 100, "perf/step_ms"] *= 2
    result = run_checks(df, [], PARAMS)
    check = result["checks"]["step_time_degradation"]
    assert check["status"] == "fail"
    assert check["evidence"]["ratio"] == pytest.approx(2.0, rel=0.1)
    assert check["evidence"]["spearman_rho"] > 0.3 and check["evidence"]["spearman_p"] < 0.01
    assert "empty_cache" in check["fix"] and ".item()" in check["fix"]
    assert result["failed"] == ["step_time_degradation"]


def test_step_time_rise_that_more_flow_steps_explain_warns_and_says_so():
    """After a bad update the model can take more adaptive flow steps per training step: its steps
    take longer with nothing wrong in the loop (measured: 3 -> 5 flow steps, 1.72x step time)."""
    df = clean_run()
    df["flow/steps_used"] = np.where(df["step"] > 250, 5, 3)
    df["perf/step_ms"] = np.where(df["step"] > 250, 1.7, 1.0) * df["perf/step_ms"]
    check = run_checks(df, [], PARAMS)["checks"]["step_time_degradation"]
    assert check["status"] == "warn" and check["pass"] is True
    assert check["evidence"]["flow_steps_ratio"] == pytest.approx(5 / 3)
    assert "1.67x the flow steps" in check["summary"] and "convergence" in check["fix"]
    # The same rise with flat flow steps is degradation; so is one far beyond what they explain.
    df["flow/steps_used"] = 4
    assert run_checks(df, [], PARAMS)["checks"]["step_time_degradation"]["status"] == "fail"
    df["flow/steps_used"] = np.where(df["step"] > 250, 5, 3)
    df["perf/step_ms"] = np.where(df["step"] > 250, 3.0, 1.0) * df["perf/step_ms"]
    assert run_checks(df, [], PARAMS)["checks"]["step_time_degradation"]["status"] == "fail"


def test_step_time_slow_warmup_is_not_degradation():
    df = clean_run()
    df.loc[df["step"] <= 10, "perf/step_ms"] = 900  # compile / autotune on the first steps
    assert run_checks(df, [], PARAMS)["checks"]["step_time_degradation"]["status"] == "pass"


def test_rare_recovered_nonfinite_warns():
    bad = [120, 240, 360]  # 3 / 500 = 0.6 % <= 1 %
    result = run_checks(with_nan_loss(clean_run(), bad), nan_events(bad), PARAMS)
    check = result["checks"]["nonfinite"]
    assert check["status"] == "warn" and check["pass"] is True
    ev = check["evidence"]
    assert ev["count"] == 3 and ev["recovered"] is True and ev["first_module"] == "carrier.gru.0"
    assert ev["first_step"] == 120 and "step 120 nan_grad in carrier.gru.0 (skipped)" in ev["event_list"]
    assert "2**10" in check["fix"] and "bf16" in check["fix"]
    assert result["verdict"] == "stable"  # a warning does not make the run unstable


def test_frequent_nonfinite_fails():
    bad = list(range(50, 500, 10))  # 45 / 500 = 9 %
    check = run_checks(with_nan_loss(clean_run(), bad), nan_events(bad), PARAMS)["checks"]["nonfinite"]
    assert check["status"] == "fail" and check["evidence"]["count"] == len(bad)


def test_rare_nonfinite_without_recovery_fails():
    bad = [498, 499, 500]  # the run ended in NaN
    check = run_checks(with_nan_loss(clean_run(), bad), nan_events(bad), PARAMS)["checks"]["nonfinite"]
    assert check["status"] == "fail" and check["evidence"]["recovered"] is False


def test_nan_loss_rows_without_events_are_still_counted():
    df = with_nan_loss(clean_run(), [200])
    check = run_checks(df, [], PARAMS)["checks"]["nonfinite"]
    assert check["status"] == "warn" and check["evidence"]["count"] == 1


def test_mostly_critical_grad_norms_fail():
    df = clean_run()
    df["grad/global_norm"] = np.random.default_rng(3).uniform(11, 50, N)
    df.loc[df["step"] == 250, "grad/global_norm"] = np.inf
    check = run_checks(df, [], PARAMS)["checks"]["grad_norm"]
    ev = check["evidence"]
    assert check["status"] == "fail"
    assert ev["frac_critical"] == pytest.approx(499 / 500) and ev["frac_exploded"] == pytest.approx(1 / 500)
    assert math.isfinite(ev["max_norm"]) and ev["max_norm"] <= 50
    assert "clip" in check["fix"].lower()


def test_warning_zone_grad_norms_warn():
    df = clean_run()
    df.loc[df["step"] % 2 == 0, "grad/global_norm"] = 7.0  # half the rows in the warning zone
    check = run_checks(df, [], PARAMS)["checks"]["grad_norm"]
    assert check["status"] == "warn" and check["evidence"]["frac_warning"] == pytest.approx(0.5)


def test_injected_loss_spike_is_found_at_its_step_and_recovers():
    df = clean_run()
    df.loc[df["step"] == 300, "train/loss"] = 2.6  # ~1.3x the trailing mean of ~2.0: mild
    check = run_checks(df, [], PARAMS)["checks"]["loss_spikes"]
    ev = check["evidence"]
    assert check["status"] == "warn"
    assert ev["count"] == 1 and ev["steps"] == "300" and ev["largest_spike_step"] == 300
    assert ev["recovered"] is True and ev["largest_spike_sigma"] > 4
    assert 1.2 < ev["max_ratio"] < 1.4 and ev["severe"] == 0


def test_severe_loss_spike_fails_even_when_the_loss_recovers():
    df = clean_run()
    df.loc[df["step"] == 300, "train/loss"] = 10.0  # 5x the trailing mean (limit 3x)
    check = run_checks(df, [], PARAMS)["checks"]["loss_spikes"]
    ev = check["evidence"]
    assert check["status"] == "fail" and ev["recovered"] is True
    assert ev["severe"] == 1 and ev["max_ratio_step"] == 300 and ev["max_ratio"] > 4.5


def test_loss_spike_that_never_recovers_fails():
    df = clean_run()
    df.loc[df["step"] >= 300, "train/loss"] += 5.0  # jumps and stays up: divergence
    check = run_checks(df, [], PARAMS)["checks"]["loss_spikes"]
    assert check["status"] == "fail" and check["evidence"]["steps"].startswith("300")
    assert check["evidence"]["recovered"] is False


def test_loss_spike_events_are_included():
    events = [{"step": 77, "kind": "loss_spike", "module": None, "action": "flagged"}]
    check = run_checks(clean_run(), events, PARAMS)["checks"]["loss_spikes"]
    assert check["status"] == "warn" and check["evidence"]["steps"] == "77"
    assert check["evidence"]["from_events"] == 1


def test_only_step_column_skips_without_crashing():
    df = pd.DataFrame({"step": np.arange(1, 101)})
    result = run_checks(df, [], {})
    statuses = {n: c["status"] for n, c in result["checks"].items()}
    assert statuses == {
        "memory_growth": "skip",
        "step_time_degradation": "skip",
        "device_utilisation": "skip",
        "nonfinite": "pass",
        "grad_norm": "skip",
        "loss_spikes": "skip",
        "loss_regression": "skip",
        "scaler": "n/a",
        "convergence": "skip",
        "learning": "skip",
    }
    assert result["verdict"] == "stable"
    for check in result["checks"].values():
        assert check["summary"] and (check["status"] != "skip" or check["fix"])


@pytest.mark.parametrize("column", [c for c in clean_run(n=20).columns if c != "step"])
def test_each_missing_column_is_survivable(column):
    result = run_checks(clean_run().drop(columns=[column]), nan_events([200]), PARAMS)
    assert result["verdict"] in ("stable", "unstable")
    json.dumps(stability_metrics(result), allow_nan=False)


def test_empty_telemetry_and_no_events():
    result = run_checks(pd.DataFrame({"step": []}), None, None)
    assert {c["status"] for n, c in result["checks"].items() if n != "scaler"} == {"skip"}
    assert result["checks"]["scaler"]["status"] == "n/a"


def test_telemetry_without_step_column_is_an_error():
    with pytest.raises(ValueError, match="step"):
        run_checks(pd.DataFrame({"train/loss": [1.0]}), [], {})


def test_stability_metrics_is_flat_strict_json():
    df = clean_run()
    df["grad/global_norm"] = np.inf  # median/max finite norm become NaN
    metrics = stability_metrics(run_checks(df, nan_events([100]), PARAMS))
    assert metrics["verdict"] == "unstable"
    assert list(metrics)[1:] == list(CHECK_ORDER)
    # Every norm inf: judged once, by nonfinite (500 non-finite steps); grad_norm shows the share.
    assert metrics["nonfinite"]["status"] == "fail" and metrics["nonfinite"]["count"] == N
    assert metrics["grad_norm"]["frac_exploded"] == 1.0 and metrics["grad_norm"]["status"] == "pass"
    assert metrics["grad_norm"]["max_norm"] is None
    assert "event_list" not in metrics["nonfinite"]  # strings stay in the report, not the metrics
    json.dumps(metrics, allow_nan=False)


def test_params_from_dictconfig():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create(
        {**{k: v for k, v in resolve_params({}).items() if v is not None}, "step_time_max_ratio": 3.0}
    )
    df = clean_run()
    df.loc[df["step"] > 100, "perf/step_ms"] *= 2
    assert run_checks(df, [], cfg)["checks"]["step_time_degradation"]["status"] == "pass"


def test_params_are_read_not_judged():
    # Ranges are the config schema's to refuse, at load (tests/test_config.py); a plain mapping
    # is read as it is, so the checks judge synthetic telemetry with any thresholds.
    p = resolve_params({"grad_warning": 20.0, "grad_critical": 10.0, "memory_alpha": 1.5, "spike_window": "5"})
    assert (p["grad_warning"], p["grad_critical"], p["memory_alpha"], p["spike_window"]) == (20.0, 10.0, 1.5, 5)


def test_a_spike_window_shorter_than_the_minimum_judges_once_full():
    # Only a plain mapping can hold one (the schema refuses train.spike_window < 10): the scan
    # waits for the whole window, as the trainer's detector does, instead of failing.
    df = clean_run()
    df.loc[df["step"] == 200, "train/loss"] *= 100
    scan = spike_scan(prepare_steps(df), resolve_params({**PARAMS, "spike_window": 5}))
    assert scan["threshold"].isna().sum() == 5  # the first 5 rows have no full window before them
    assert 200 in scan.loc[scan["spike"], "step"].tolist()


def test_allocator_warmup_that_plateaus_is_not_a_leak():
    # What a clean default run shows: RSS climbs over the first part of the run while the heap
    # grows, then stays flat (modelled below). A leak keeps climbing; this does not.
    df = clean_run()
    step = df["step"].to_numpy()
    df["mem/rss_mb"] = 630 + 250 * np.minimum(step / 200, 1.0) + np.random.default_rng(2).uniform(-3, 3, N)
    check = run_checks(df, [], PARAMS)["checks"]["memory_growth"]
    assert check["status"] == "pass", check["summary"]


def test_a_short_final_window_is_not_a_spike():
    # Rows are means over 5 steps; the run's last row covers one step, so it is noisier.
    rng = np.random.default_rng(3)
    steps = list(range(5, 1416, 5)) + [1416]
    loss = 0.1 + rng.normal(0, 0.002, len(steps))
    loss[-1] = 0.1 + 0.012  # 6 sigma of a 5-step mean, 2.7 sigma of a single step
    df = pd.DataFrame({"step": steps, "train/loss": loss})
    assert run_checks(df, [], PARAMS)["checks"]["loss_spikes"]["status"] == "pass"
    loss[-1] = 0.1 + 0.04  # 9 sigma even for a single step: still a spike
    df = pd.DataFrame({"step": steps, "train/loss": loss})
    assert run_checks(df, [], PARAMS)["checks"]["loss_spikes"]["evidence"]["count"] == 1


def test_learning_check_states_each_paired_difference_with_its_interval():
    from pipeline.report.checks import check_learning

    ev = {
        **EVAL,
        "eval/test/model/group_top1": 0.61,
        "eval/test/ridge/group_top1": 0.58,
        "eval/test/model_vs_ridge/group_top1": 0.031,
        "eval/test/model_vs_ridge/group_top1/ci95_low": 0.012,
        "eval/test/model_vs_ridge/group_top1/ci95_high": 0.049,
        "eval/test/model_vs_ridge/group_top1/p_value": 0.002,
        "eval/test/model_vs_identity/cosine": 0.004,
        "eval/test/model_vs_identity/cosine/ci95_low": -0.003,
        "eval/test/model_vs_identity/cosine/ci95_high": 0.011,
        "eval/test/model_vs_identity/cosine/p_value": 0.3,
    }
    res = check_learning(ev, resolve_params(PARAMS))
    assert res["status"] == "pass"
    assert "beats ridge on group top-1 by +0.031 [+0.012, +0.049]" in res["summary"]
    assert "no significant difference from identity on cosine (+0.004 [-0.003, +0.011])" in res["summary"]
    assert res["evidence"]["vs_ridge_group_top1_p_value"] == 0.002
    # Below identity with an interval that holds 0 is not "below identity": no warning for noise.
    noisy = {
        **ev,
        "eval/test/model/cosine": 0.81,
        "eval/test/model_vs_identity/cosine": -0.01,
        "eval/test/model_vs_identity/cosine/ci95_low": -0.03,
        "eval/test/model_vs_identity/cosine/ci95_high": 0.01,
    }
    assert check_learning(noisy, resolve_params(PARAMS))["status"] == "pass"
    # Below identity on cosine, but not on the headline (group top-1): said, not warned.
    below = {**noisy, "eval/test/model_vs_identity/cosine/ci95_high": -0.002}
    res = check_learning(below, resolve_params(PARAMS))
    assert res["status"] == "pass" and "trails identity on cosine by -0.010" in res["summary"]
    # Below a baseline on the headline: a warning (not a green "stable"), naming it.
    worse = {
        **ev,
        "eval/test/model_vs_ridge/group_top1": -0.05,
        "eval/test/model_vs_ridge/group_top1/ci95_low": -0.08,
        "eval/test/model_vs_ridge/group_top1/ci95_high": -0.02,
    }
    res = check_learning(worse, resolve_params(PARAMS))
    assert res["status"] == "warn" and "worse than ridge (-0.050 [-0.080, -0.020]) on group top-1" in res["summary"]


def test_unmeasured_run_skips_memory_and_step_time_and_says_why():
    """When the time and memory files belong to another run (or are missing), a leak in them
    must not be pinned on this run: both checks are skipped with the reason and what to do."""
    df = clean_run()
    df["mem/rss_mb"] = 1500 + 0.2 * df["step"]  # a leak that must not be judged
    result = run_checks(df, [], PARAMS, EVAL, unmeasured="telemetry/train_perf.json was measured under other settings")
    for name in ("memory_growth", "step_time_degradation"):
        check = result["checks"][name]
        assert check["status"] == "skip" and check["pass"] is True and check["evidence"] == {}
        assert "measured under other settings" in check["summary"]
        assert "dvc repro --force --single-item train" in check["fix"]
    assert result["verdict"] == "stable" and result["failed"] == []
    assert result["checks"]["loss_spikes"]["status"] == "pass"  # the rest is judged as usual


def test_stability_metrics_leave_time_and_memory_out_unless_measured():
    df = clean_run()
    df["mem/rss_mb"] = 1500 + 0.2 * df["step"] + np.random.default_rng(1).uniform(-5, 5, N)
    result = run_checks(df, [], PARAMS, EVAL)
    dvc = stability_metrics(result)
    full = stability_metrics(result, measured=True)
    # The DVC metric: the verdict of each check, none of its measured figures.
    assert dvc["memory_growth"] == {"pass": False, "status": "fail"}
    assert set(dvc["step_time_degradation"]) == {"pass", "status"}
    assert abs(full["memory_growth"]["slope_mb_per_1k_steps"] - 200) / 200 < 0.10
    assert "slope_mb_per_1k_steps" not in dvc["memory_growth"]
    # Checks that are not measurements keep their figures in both.
    assert dvc["loss_spikes"] == full["loss_spikes"] and dvc["learning"] == full["learning"]
    assert len(dvc["loss_spikes"]) > 2


def test_the_runs_table_gets_a_handful_of_stability_numbers_not_the_evidence():
    from pipeline.report.build import summary_metrics

    def result(verdict, *statuses):
        checks = {f"c{i}": {"status": s} for i, s in enumerate(statuses)}
        return {"verdict": verdict, "checks": checks, "failed": [n for n, c in checks.items() if c["status"] == "fail"]}

    assert summary_metrics(result("stable", "pass", "pass", "skip")) == {
        "stability/verdict_code": 0.0,
        "stability/failed_checks": 0.0,
        "stability/warned_checks": 0.0,
        "stability/checks_run": 2.0,
    }
    warned = summary_metrics(result("stable", "pass", "warn", "n/a"))
    assert warned["stability/verdict_code"] == 1 and warned["stability/warned_checks"] == 1
    failed = summary_metrics(result("unstable", "fail", "fail", "warn", "pass"))
    assert failed["stability/verdict_code"] == 2 and failed["stability/failed_checks"] == 2
    assert failed["stability/checks_run"] == 4


def _vs_mlp(value, low, high, covers=1, mlp=0.60, margin=0.011):
    return {
        **EVAL,
        "eval/test/model/group_top1": 0.61,
        "eval/test/ridge/group_top1": 0.55,
        "eval/test/model_vs_ridge/group_top1": 0.06,
        "eval/test/model_vs_ridge/group_top1/ci95_low": 0.03,
        "eval/test/model_vs_ridge/group_top1/ci95_high": 0.09,
        "eval/test/model_vs_ridge/group_top1/p_value": 0.001,
        "eval/test/mlp/group_top1": mlp,
        "eval/test/mlp/replicates": 5,
        "eval/test/model_vs_mlp/group_top1": value,
        "eval/test/model_vs_mlp/group_top1/ci95_low": low,
        "eval/test/model_vs_mlp/group_top1/ci95_high": high,
        "eval/test/model_vs_mlp/group_top1/p_value": 0.4,
        "eval/test/model_vs_mlp/ci_covers_seeds": covers,
        "eval/test/margin/group_top1": margin,
    }


@pytest.mark.parametrize(
    "diff, covers, status, words",
    [
        ((0.02, 0.012, 0.03), 1, "pass", "the model is ahead of it (+0.020 [+0.012, +0.030]"),
        ((0.002, -0.006, 0.009), 1, "pass", "the model is equivalent to it (+0.002 [-0.006, +0.009], within +-0.011"),
        ((0.004, -0.007, 0.014), 1, "pass", "undecided (+0.004 [-0.007, +0.014]; the interval straddles 0"),
        ((-0.03, -0.05, -0.01), 1, "warn", "the model is BEHIND it (-0.030 [-0.050, -0.010]"),
        # Ahead on the items alone, the model's seed luck not covered: not called ahead.
        ((0.02, 0.012, 0.03), 0, "pass", "undecided (+0.020 [+0.012, +0.030]; training luck is not covered"),
        ((0.002, -0.006, 0.009), 0, "pass", "undecided"),
    ],
)
def test_the_learning_check_says_where_the_model_stands_against_the_strongest_baseline(diff, covers, status, words):
    from pipeline.report.checks import check_learning

    res = check_learning(_vs_mlp(*diff, covers=covers), resolve_params(PARAMS))
    assert res["status"] == status, res["summary"]
    assert "Strongest baseline on group top-1: mlp (5 seeds), 0.600: " + words in res["summary"], res["summary"]
    e = res["evidence"]
    assert e["strongest_baseline"] == "mlp" and e["vs_strongest"] == diff[0]
    assert e["vs_strongest_covers_seeds"] == bool(covers)
    if status == "warn":
        assert "worse than mlp" in res["summary"] and res["fix"]


def test_the_strongest_baseline_is_the_one_highest_on_the_headline():
    from pipeline.report.checks import check_learning

    ev = _vs_mlp(0.002, -0.006, 0.009, mlp=0.50)  # ridge (0.55) is now the strongest
    res = check_learning({**ev, "eval/test/ci_covers_seeds": 1}, resolve_params(PARAMS))
    assert res["evidence"]["strongest_baseline"] == "ridge"
    # ridge has no training luck: its comparison covers the seeds when the model's reference did.
    assert "Strongest baseline on group top-1: ridge, 0.550: the model is ahead of it" in res["summary"]
    res = check_learning(ev, resolve_params(PARAMS))  # without the model's reference: not called ahead
    assert "ridge, 0.550: undecided" in res["summary"]
