"""The report's newer checks (scaler, convergence, learning), per-step grad-norm zones, spike
severity, the params that govern them, and how their evidence is rendered and plotted."""

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from pipeline.core.errors import ConfigError
from pipeline.report.checks import (
    CHECK_ORDER,
    check_convergence,
    check_grad_norm,
    check_learning,
    check_loss_spikes,
    check_scaler,
    headline_verdict,
    prepare_steps,
    resolve_params,
    run_checks,
    scaler_history,
    zone_step_fractions,
)
from pipeline.report.layout import CHECK_PLOTS, STATUS_COLOURS, verdict_parts
from pipeline.report.plots import make_plots, plot_learning, plot_scaler
from pipeline.report.render import render_html, render_markdown
from pipeline.report.units import fmt, fmt_value, unit
from tests.helpers.synthetic import clean_run

pytestmark = pytest.mark.unit

PARAMS = {"planned_steps": 10_000}  # the rest: defaults (warm-up 10, spike k=4, window 50, ...)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GOOD_EVAL = {  # metrics/eval.json's keys: eval/<split>/<predictor or paired difference>/<metric>[/<part>]
    "eval/test/model/cosine": 0.88,
    "eval/test/model/top1": 0.8,
    "eval/test/model/top5": 0.95,
    "eval/test/model/mse": 0.001,
    "eval/test/model/group_top1": 0.9,
    "eval/test/model/group_top1/ci95_low": 0.87,
    "eval/test/model/group_top1/ci95_high": 0.93,
    "eval/test/nearest/cosine": 0.85,
    "eval/test/nearest/top1": 0.6,
    "eval/test/identity/cosine": 0.82,
    "eval/test/identity/top1": 0.7,
    "eval/test/ridge/cosine": 0.9,
    "eval/test/ridge/top1": 0.85,
    "eval/test/model_vs_ridge/cosine": -0.02,
    "eval/test/model_vs_ridge/cosine/ci95_low": -0.03,
    "eval/test/model_vs_ridge/cosine/ci95_high": -0.01,
    "eval/test/model_vs_ridge/cosine/p_value": 0.001,
    "eval/test/model_vs_ridge/group_top1": 0.01,
    "eval/test/model_vs_ridge/group_top1/ci95_low": -0.01,
    "eval/test/model_vs_ridge/group_top1/ci95_high": 0.03,
    "eval/test/model_vs_ridge/group_top1/p_value": 0.4,
    "eval/test/model_vs_identity/cosine": 0.06,
    "eval/test/model_vs_identity/cosine/ci95_low": 0.04,
    "eval/test/model_vs_identity/cosine/ci95_high": 0.08,
    "eval/test/model_vs_identity/cosine/p_value": 0.001,
}


def model_cosine(value: float, vs_identity: tuple[float, float, float] | None = None, split: str = "test") -> dict:
    """GOOD_EVAL with the model's cosine replaced, and its paired difference from identity (mean,
    CI low, CI high) when given, else dropped (the check then compares the means)."""
    out = {**GOOD_EVAL, f"eval/{split}/model/cosine": value}
    for part in ("", "/ci95_low", "/ci95_high", "/p_value"):
        out.pop(f"eval/{split}/model_vs_identity/cosine{part}", None)
    if vs_identity is not None:
        for part, v in zip(("", "/ci95_low", "/ci95_high", "/p_value"), (*vs_identity, 0.001)):
            out[f"eval/{split}/model_vs_identity/cosine{part}"] = v
    return out


BACKOFF = {
    "step": 40,
    "kind": "inf_grad",
    "module": "carrier",
    "action": "skipped; scaler backed off",
    "scale": 32768.0,
}
# Statistics with no unit by design (render.py: "pure statistics (p-values, R², rho) have none"),
# also under a series prefix (device_p_value).
PURE_STATISTICS = ("p_value", "r2", "spearman_rho", "spearman_p")


def p(**overrides):
    return resolve_params({**PARAMS, **overrides})


def steps_df(n: int, **cols) -> pd.DataFrame:
    """Rows at steps 1..n with the given columns (scalars broadcast), numeric as the checks see them."""
    return prepare_steps(pd.DataFrame({"step": np.arange(1, n + 1), **cols}))


def backoff(step: int, scale: float) -> dict:
    return {**BACKOFF, "step": step, "scale": scale}


# ---------------------------------------------------------------- scaler


def test_scaler_is_na_when_amp_scale_is_nan_throughout_and_no_event_has_a_scale():
    df = clean_run()
    df["amp/scale"] = np.nan
    events = [
        {"step": 100, "kind": "nan_grad", "module": "carrier", "action": "skipped"},  # no scale key
        {"step": 120, "kind": "inf_grad", "module": "carrier", "action": "skipped", "scale": None},
    ]
    assert scaler_history(prepare_steps(df), events).empty
    result = run_checks(df, events, PARAMS, GOOD_EVAL)
    check = result["checks"]["scaler"]
    assert check["status"] == "n/a" and check["pass"] is True
    assert check["evidence"] == {} and check["fix"] is None
    assert "No GradScaler" in check["summary"]
    assert "scaler" not in verdict_parts(result)[1]
    assert list(result["checks"])[-1] == "scaler"  # n/a sorts after pass


def test_scaler_without_amp_scale_column_is_na():
    check = check_scaler(prepare_steps(clean_run()), [], p())
    assert check["status"] == "n/a" and check["pass"] is True


def test_scaler_constant_finite_scale_without_backoffs_passes():
    df = steps_df(500, **{"amp/scale": 1024.0})
    check = check_scaler(df, [], p())
    assert check["status"] == "pass" and check["fix"] is None
    assert check["evidence"] == {
        "first_scale": 1024.0,
        "min_scale": 1024.0,
        "min_scale_step": 1,
        "final_scale": 1024.0,
        "backoffs": 0,
        "backoff_fraction": 0.0,
        "growths": 0,
        "total_steps": 500,
    }


def test_scaler_one_backoff_in_1000_steps_warns_with_exact_evidence():
    step = np.arange(1, 1001)
    df = steps_df(1000, **{"amp/scale": np.where(step < 40, 65536.0, 32768.0)})
    result = run_checks(df, [BACKOFF], PARAMS)
    check = result["checks"]["scaler"]
    assert check["status"] == "warn" and check["pass"] is True
    ev = check["evidence"]
    assert ev["first_scale"] == 65536.0
    assert ev["min_scale"] == 32768.0 and ev["min_scale_step"] == 40
    assert ev["final_scale"] == 32768.0
    assert ev["backoffs"] == 1 and ev["first_backoff_step"] == 40 and ev["backoff_steps"] == "40"
    assert ev["backoff_fraction"] == pytest.approx(1 / 1000)
    assert ev["total_steps"] == 1000 and ev["growths"] == 0
    assert "1 overflow backoff(s) (0.1 % of 1,000 steps, limit 5 %)" in check["summary"]
    assert "init_scale=1024" in check["fix"]
    assert "warnings: scaler" in verdict_parts(result)[1]


def test_scaler_history_orders_rows_before_the_backoff_event_of_the_same_step():
    df = steps_df(3, **{"amp/scale": [4.0, 2.0, 4.0]})
    hist = scaler_history(df, [backoff(2, 2.0)])
    assert hist["step"].tolist() == [1, 2, 2, 3]
    assert hist["backoff"].tolist() == [False, False, True, False]
    assert hist["scale"].tolist() == [4.0, 2.0, 2.0, 4.0]
    ev = check_scaler(df, [backoff(2, 2.0)], p())["evidence"]
    assert ev["growths"] == 1  # 2 -> 4 between rows; the event is not a row


def test_scaler_backoffs_above_the_allowed_fraction_fail():
    bad = list(range(10, 1000, 16))  # 62 backoffs in 1000 steps: 6.2 % > 5 %
    df = steps_df(1000, **{"amp/scale": 1024.0})
    check = check_scaler(df, [backoff(s, 512.0) for s in bad], p())
    assert check["status"] == "fail" and check["pass"] is False
    ev = check["evidence"]
    assert ev["backoffs"] == 62 and ev["backoff_fraction"] == pytest.approx(0.062)
    assert ev["first_backoff_step"] == 10 and ev["min_scale"] == 512.0 and ev["min_scale_step"] == 10
    assert ev["backoff_steps"].endswith("... (42 more)")
    # The same run under a looser limit only warns.
    assert check_scaler(df, [backoff(s, 512.0) for s in bad], p(scaler_max_backoff_fraction=0.1))["status"] == "warn"


def test_scaler_below_min_scale_fails_even_without_backoffs():
    scale = np.full(200, 8.0)
    scale[150:] = 0.5  # steps 151..200
    df = steps_df(200, **{"amp/scale": scale})
    check = check_scaler(df, [], p())
    assert check["status"] == "fail"
    ev = check["evidence"]
    assert ev["backoffs"] == 0 and "first_backoff_step" not in ev
    assert ev["min_scale"] == 0.5 and ev["min_scale_step"] == 151 and ev["final_scale"] == 0.5
    assert "fell below 1" in check["summary"] and "below 1 means" in check["fix"]
    assert check_scaler(df, [], p(scaler_min_scale=0.25))["status"] == "pass"


# ---------------------------------------------------------------- convergence

BOUNDS = {"step_cap": 12, "min_steps_to_arrive": 4}


def test_convergence_passes_with_about_seven_steps_under_a_cap_of_twelve():
    step = np.arange(1, 501)
    df = steps_df(500, **{"flow/steps_used": np.where(step % 2 == 0, 6.0, 8.0)})
    check = check_convergence(df, p(warmup_steps=0, **BOUNDS))  # 100 early rows, 250 steady: even counts
    assert check["status"] == "pass" and check["fix"] is None
    ev = check["evidence"]
    assert ev["early_median_steps"] == 7.0 and ev["steady_median_steps"] == 7.0 and ev["steps_ratio"] == 1.0
    assert ev["min_steps"] == 6.0 and ev["max_steps"] == 8.0
    assert ev["step_cap"] == 12 and ev["frac_at_cap"] == 0.0 and ev["min_steps_to_arrive"] == 4
    assert "median_samples_per_s" not in ev
    assert check["summary"] == "Adaptive flow steps per batch: median 7 early -> 7 steady (arrival needs >= 4, cap 12)."


def test_convergence_energy_collapse_fails():
    step = np.arange(1, 501)
    df = steps_df(500, **{"flow/steps_used": np.where(step <= 100, 6.0, 1.0)})
    check = check_convergence(df, p(**BOUNDS))
    assert check["status"] == "fail" and check["pass"] is False
    ev = check["evidence"]
    assert ev["early_median_steps"] == 6.0 and ev["steady_median_steps"] == 1.0
    assert ev["steps_ratio"] == pytest.approx(1 / 6) and ev["min_steps"] == 1.0
    assert "energy collapses" in check["summary"] and "energy_min" in check["fix"]
    result = run_checks(df, [], {**PARAMS, **BOUNDS})
    assert "convergence" in result["failed"] and result["verdict"] == "unstable"


def test_convergence_warns_when_90_percent_of_steady_rows_sit_at_the_cap():
    # warm-up 0 and 200 rows: the steady half is exactly the last 100 rows.
    used = np.full(200, 12.0)
    used[100:110] = 10.0  # 90 of 100 steady rows at the cap
    check = check_convergence(steps_df(200, **{"flow/steps_used": used}), p(warmup_steps=0, **BOUNDS))
    assert check["evidence"]["frac_at_cap"] == pytest.approx(0.9)
    assert check["status"] == "warn" and "adaptive stopping never fires" in check["summary"]
    assert "convergence_threshold" in check["fix"]
    used[110] = 10.0  # 89 %: under the line, and no growth: pass
    check = check_convergence(steps_df(200, **{"flow/steps_used": used}), p(warmup_steps=0, **BOUNDS))
    assert check["evidence"]["frac_at_cap"] == pytest.approx(0.89) and check["status"] == "pass"


def test_convergence_warns_when_steps_per_batch_grow_more_than_1_5x():
    step = np.arange(1, 501)
    df = steps_df(500, **{"flow/steps_used": np.where(step <= 200, 4.0, 7.0)})
    check = check_convergence(df, p(**BOUNDS))
    assert check["status"] == "warn"
    assert check["evidence"]["steps_ratio"] == pytest.approx(1.75) and check["evidence"]["frac_at_cap"] == 0.0
    assert "grew 1.75x" in check["summary"] and "min_forward" in check["fix"]
    df = steps_df(500, **{"flow/steps_used": np.where(step <= 200, 4.0, 6.0)})  # exactly 1.5x: not more
    assert check_convergence(df, p(**BOUNDS))["status"] == "pass"


def test_convergence_skips_without_the_column():
    check = check_convergence(steps_df(100, **{"train/loss": 1.0}), p(**BOUNDS))
    assert check["status"] == "skip" and check["pass"] is True
    assert "flow/steps_used not logged" in check["summary"]
    nan = check_convergence(steps_df(100, **{"flow/steps_used": np.nan}), p(**BOUNDS))
    assert nan["status"] == "skip" and "no finite values" in nan["summary"]


def test_convergence_reports_throughput_when_samples_per_s_is_logged():
    step = np.arange(1, 501)
    df = steps_df(500, **{"flow/steps_used": 7.0, "perf/samples_per_s": np.where(step <= 250, 2000.0, 1000.0)})
    check = check_convergence(df, p(**BOUNDS))
    ev = check["evidence"]
    assert check["status"] == "pass"
    # After warm-up (10): 240 rows at 2000, 250 at 1000.
    assert ev["median_samples_per_s"] == 1000.0
    assert ev["early_samples_per_s"] == 2000.0 and ev["steady_samples_per_s"] == 1000.0
    assert "throughput 1,000 samples/s" in check["summary"]


def test_convergence_without_bounds_reports_no_cap_evidence():
    check = check_convergence(steps_df(100, **{"flow/steps_used": 7.0}), p())
    assert check["status"] == "pass"
    assert "step_cap" not in check["evidence"] and "frac_at_cap" not in check["evidence"]
    assert "min_steps_to_arrive" not in check["evidence"]


# ---------------------------------------------------------------- learning


def test_learning_skips_without_eval_metrics():
    for metrics in (None, {}):
        check = check_learning(metrics, p())
        assert check["status"] == "skip" and "evaluate" in check["fix"]
    check = check_learning({"train/loss": 1.0}, p())
    assert check["status"] == "skip"
    assert check["summary"] == "The evaluate metrics hold no eval/test/model/cosine or eval/val/model/cosine."
    assert run_checks(clean_run(), [], PARAMS)["checks"]["learning"]["status"] == "skip"


def falling_loss(first: float = 1.0, last: float = 0.5, rows: int = 20) -> pd.DataFrame:
    """Telemetry whose training loss goes from `first` to `last`."""
    return pd.DataFrame({"step": np.arange(1, rows + 1) * 5, "train/loss": np.linspace(first, last, rows)})


def group_top1_vs(baseline: str, diff: float, low: float, high: float) -> dict:
    return {
        f"eval/test/model_vs_{baseline}/group_top1": diff,
        f"eval/test/model_vs_{baseline}/group_top1/ci95_low": low,
        f"eval/test/model_vs_{baseline}/group_top1/ci95_high": high,
        f"eval/test/model_vs_{baseline}/group_top1/p_value": 0.001,
    }


def test_learning_passes_when_the_model_is_worse_than_no_baseline_on_the_headline():
    check = check_learning(GOOD_EVAL, p(), falling_loss())
    assert check["status"] == "pass" and check["fix"] is None
    ev = check["evidence"]
    assert ev["split"] == "test" and ev["headline"] == "group_top1"
    assert ev["model_cosine"] == 0.88 and ev["nearest_cosine"] == 0.85
    assert ev["identity_cosine"] == 0.82 and ev["ridge_cosine"] == 0.9
    assert ev["loss_first"] == pytest.approx(1.0, abs=0.06) and ev["loss_drop"] > 0.4 and ev["min_drop"] == 0.05
    assert ev["model_top1"] == 0.8 and ev["model_top5"] == 0.95 and ev["nearest_top1"] == 0.6
    assert ev["identity_top1"] == 0.7 and ev["ridge_top1"] == 0.85 and ev["model_group_top1"] == 0.9
    assert "nearest_top5" not in ev and "ridge_group_top1" not in ev  # absent metrics are left out, not NaN
    assert (
        ev["vs_ridge_cosine"],
        ev["vs_ridge_cosine_ci95_low"],
        ev["vs_ridge_cosine_ci95_high"],
        ev["vs_ridge_cosine_p_value"],
    ) == (-0.02, -0.03, -0.01, 0.001)
    # The paired differences, in words: significant ones as "beats"/"trails" with their CI, the
    # rest as "no significant difference"; then which luck the intervals cover.
    assert check["summary"] == (
        "test group top-1 0.900 (): not worse than any baseline on group top-1. The model "
        "beats identity on cosine by +0.060 [+0.040, +0.080]; "
        "no significant difference from ridge on group top-1 (+0.010 [-0.010, +0.030]); "
        "trails ridge on cosine by -0.020 [-0.030, -0.010]. The intervals cover the test items only, not the "
        "training seed's luck (no seed-variance reference for this preset and data: ./dev seeds measures one)."
    ).replace("()", "(no baselines)")


def test_learning_warns_when_worse_than_a_baseline_on_the_headline_and_only_when_the_ci_says_so():
    worse = {**GOOD_EVAL, **group_top1_vs("identity", -0.82, -0.9, -0.75)}
    check = check_learning(worse, p(), falling_loss())
    assert check["status"] == "warn" and check["pass"] is True
    assert "worse than identity (-0.820 [-0.900, -0.750]) on group top-1" in check["summary"]
    assert "train.epochs" in check["fix"] and "model.residual=linear" in check["fix"]
    result = run_checks(clean_run(), [], PARAMS, worse)
    assert result["verdict"] == "stable" and headline_verdict(result) == "stable, with warnings"
    # A mean below a baseline whose interval holds 0 is noise, not a warning.
    check = check_learning({**GOOD_EVAL, **group_top1_vs("identity", -0.005, -0.012, 0.002)}, p(), falling_loss())
    assert check["status"] == "pass"
    assert "no significant difference from identity on group top-1 (-0.005 [-0.012, +0.002])" in check["summary"]
    # Worse on cosine only (not the headline): said, not warned.
    assert "trails ridge on cosine" in check["summary"]


def test_learning_says_when_its_intervals_cover_the_seed():
    covered = {**GOOD_EVAL, "eval/test/ci_covers_seeds": 1, "eval/test/seed_reference_seeds": 8}
    check = check_learning(covered, p(), falling_loss())
    assert check["evidence"]["ci_covers_seeds"] is True and check["evidence"]["seed_reference_seeds"] == 8
    assert check["summary"].endswith(
        "The intervals cover the test items and the training seed (the preset's seed-variance reference, 8 seeds)."
    )


def test_learning_fails_when_the_training_loss_did_not_fall():
    check = check_learning(GOOD_EVAL, p(), falling_loss(1.0, 0.98))
    assert check["status"] == "fail" and check["pass"] is False
    assert check["evidence"]["loss_drop"] == pytest.approx(0.02, abs=0.005)
    assert "learned nothing" in check["summary"] and "LR" in check["fix"]
    # The threshold is the param: asking for a 1 % fall passes.
    assert check_learning(GOOD_EVAL, p(learning_min_drop=0.01), falling_loss(1.0, 0.98))["status"] == "pass"
    flat = clean_run()
    flat["train/loss"] = 0.7
    result = run_checks(flat, [], PARAMS, GOOD_EVAL)
    assert result["failed"] == ["learning"] and result["verdict"] == "unstable"
    # Without a loss curve the fall is not judged.
    assert check_learning(GOOD_EVAL, p())["status"] == "pass"


def test_learning_nan_model_cosine_fails():
    check = check_learning(model_cosine(float("nan")), p())
    assert check["status"] == "fail"
    assert math.isnan(check["evidence"]["model_cosine"])
    assert "not finite" in check["fix"]
    assert "test cosine of the trained model is nan" in check["summary"]


def test_learning_uses_test_split_and_falls_back_to_val():
    val_bad = {"eval/val/model/cosine": 0.0, "eval/val/nearest/cosine": 0.0}
    assert check_learning({**GOOD_EVAL, **val_bad}, p())["evidence"]["split"] == "test"
    assert check_learning({**GOOD_EVAL, **val_bad}, p())["status"] == "pass"
    val_only = {k.replace("eval/test/", "eval/val/"): v for k, v in GOOD_EVAL.items()}
    check = check_learning(val_only, p())
    assert check["status"] == "pass" and check["evidence"]["split"] == "val"
    assert check["evidence"]["model_cosine"] == 0.88 and check["summary"].startswith("val group top-1 0.900")


# ---------------------------------------------------------------- grad_norm: per-step zone counts


def counted_rows() -> pd.DataFrame:
    """7 rows of 4 optimizer steps each (28 steps); the row at step 12 holds one critical step,
    whose window mean norm (12) is itself above grad_critical (10)."""
    steps = np.arange(4, 29, 4)
    df = pd.DataFrame(
        {
            "step": steps,
            "grad/global_norm": np.where(steps == 12, 12.0, 1.0),
            "grad/steps_healthy": np.where(steps == 12, 3, 4),
            "grad/steps_warning": 0,
            "grad/steps_critical": np.where(steps == 12, 1, 0),
            "grad/steps_exploded": 0,
        }
    )
    return prepare_steps(df)


def test_one_critical_step_in_28_passes_though_its_row_mean_is_critical():
    check = check_grad_norm(counted_rows(), p())
    assert check["status"] == "pass"
    ev = check["evidence"]
    assert ev["source"] == "per-step zone counts" and ev["steps"] == 28
    assert ev["frac_critical"] == pytest.approx(1 / 28) and ev["frac_healthy"] == pytest.approx(27 / 28)
    assert ev["frac_warning"] == 0.0 and ev["frac_exploded"] == 0.0
    assert ev["first_bad_step"] == 12 and ev["max_norm"] == 12.0
    assert "critical (> 10) in 3.6 % of the finite steps (limit 5 %) of 28" in check["summary"]


def test_zone_fractions_are_per_step_not_per_row():
    df = prepare_steps(
        pd.DataFrame(
            {
                "step": [10, 11],
                "grad/global_norm": [7.0, 1.0],
                "grad/steps_healthy": [0, 1],
                "grad/steps_warning": [10, 0],
                "grad/steps_critical": [0, 0],
                "grad/steps_exploded": [0, 0],
            }
        )
    )
    frac, n, source = zone_step_fractions(df, p())
    assert (n, source) == (11, "per-step zone counts")
    assert frac == pytest.approx({"healthy": 1 / 11, "warning": 10 / 11, "critical": 0.0, "exploded": 0.0})
    assert check_grad_norm(df, p())["status"] == "warn"  # 91 % of steps in the warning zone (rows: 50 %)


def test_grad_norm_without_count_columns_falls_back_to_rows():
    df = counted_rows().drop(columns=[c for c in counted_rows().columns if c.startswith("grad/steps_")])
    check = check_grad_norm(df, p())
    ev = check["evidence"]
    assert ev["source"] == "logged rows (window means)" and ev["steps"] == 7
    assert ev["frac_critical"] == pytest.approx(1 / 7)
    assert check["status"] == "fail"  # 14 % of rows > 5 %: the window mean is all the check can see


def test_zone_counts_that_sum_to_zero_fall_back_to_rows():
    df = counted_rows()
    for c in ("grad/steps_healthy", "grad/steps_critical"):
        df[c] = 0.0
    assert zone_step_fractions(df, p())[2] == "logged rows (window means)"


# ---------------------------------------------------------------- loss_spikes severity


def spiked(factor: float, step: int = 300) -> pd.DataFrame:
    """clean_run with the loss at `step` set to `factor` x the trailing mean the check computes
    (mean of the 50 finite losses before it)."""
    df = clean_run()
    i = int(np.flatnonzero(df["step"].to_numpy() == step)[0])
    df.loc[i, "train/loss"] = factor * df["train/loss"].iloc[i - 50 : i].mean()
    return df


def test_recovered_spike_at_1_2x_warns():
    check = run_checks(spiked(1.2), [], PARAMS)["checks"]["loss_spikes"]
    ev = check["evidence"]
    assert check["status"] == "warn"
    assert ev["count"] == 1 and ev["first_step"] == 300 and ev["recovered"] is True
    assert ev["max_ratio"] == pytest.approx(1.2) and ev["max_ratio_step"] == 300
    assert ev["severe"] == 0 and ev["fail_factor"] == 3.0
    assert "(worst at step 300: 1.2x the trailing mean loss)" in check["summary"]


def test_recovered_spike_at_fail_factor_fails():
    check = run_checks(spiked(3.2), [], PARAMS)["checks"]["loss_spikes"]
    ev = check["evidence"]
    assert check["status"] == "fail" and check["pass"] is False
    assert ev["recovered"] is True and ev["unrecovered"] == 0
    assert ev["severe"] == 1 and ev["max_ratio"] == pytest.approx(3.2)
    assert "1 at >= 3x (fails)" in check["summary"]
    # The factor is the param: a 1.2x spike fails under spike_fail_factor=1.1.
    assert (
        run_checks(spiked(1.2), [], {**PARAMS, "spike_fail_factor": 1.1})["checks"]["loss_spikes"]["status"] == "fail"
    )


def test_loss_spike_event_loss_over_threshold_sets_max_ratio_and_its_step():
    events = [{"step": 77, "kind": "loss_spike", "module": None, "action": "flagged", "loss": 2500.0, "threshold": 2.5}]
    check = run_checks(spiked(1.2), events, PARAMS)["checks"]["loss_spikes"]
    ev = check["evidence"]
    assert check["status"] == "fail"
    assert ev["max_ratio"] >= 1000 and ev["max_ratio_step"] == 77
    assert ev["from_events"] == 1 and ev["from_rows"] == 1 and ev["steps"] == "77, 300"
    assert ev["largest_spike_step"] == 300  # rows only: an event's loss is not a row


def test_spike_first_step_is_the_earliest_of_rows_and_events():
    late_event = [{"step": 450, "kind": "loss_spike", "module": None, "action": "flagged"}]
    ev = run_checks(spiked(1.2), late_event, PARAMS)["checks"]["loss_spikes"]["evidence"]
    assert ev["first_step"] == 300 and ev["count"] == 2
    early_event = [{"step": 120, "kind": "loss_spike", "module": None, "action": "flagged"}]
    ev = run_checks(spiked(1.2), early_event, PARAMS)["checks"]["loss_spikes"]["evidence"]
    assert ev["first_step"] == 120 and ev["steps"] == "120, 300"
    assert ev["max_ratio_step"] == 300  # the event has no loss/threshold: severity from the row


def test_loss_spike_event_without_threshold_is_not_scored():
    df = prepare_steps(clean_run())
    events = [
        {"step": 77, "kind": "loss_spike", "loss": 5.0, "threshold": 0.0},
        {"step": 88, "kind": "loss_spike", "loss": float("nan"), "threshold": 1.0},
    ]
    check = check_loss_spikes(df, events, p())
    assert check["status"] == "warn" and check["evidence"]["count"] == 2
    assert math.isnan(check["evidence"]["max_ratio"]) and check["evidence"]["max_ratio_step"] == 77


# ---------------------------------------------------------------- resolve_params


def test_resolve_params_fills_defaults_and_converts_types():
    # Ranges are refused by the config schema at load (tests/test_config.py), not here.
    defaults = resolve_params(None)
    assert defaults["spike_fail_factor"] == 3.0 and defaults["scaler_min_scale"] == 1.0
    assert defaults["scaler_max_backoff_fraction"] == 0.05 and defaults["learning_min_drop"] == 0.05
    assert defaults["step_cap"] is None and defaults["min_steps_to_arrive"] is None
    assert resolve_params({"scaler_max_backoff_fraction": 1})["scaler_max_backoff_fraction"] == 1.0
    assert resolve_params({"step_cap": "12"})["step_cap"] == 12
    with pytest.raises(ConfigError, match="step_cap"):
        resolve_params({"step_cap": "twelve"})


# ---------------------------------------------------------------- render


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("slope_mb_per_1k_steps", 12.3, "12.3 MB per 1k steps"),
        ("projected_mb", 2000.0, "2,000 MB"),
        ("frac_healthy", 0.95, "95 %"),
        ("backoff_fraction", 0.001, "0.1 %"),
        ("first_step", 15, "step 15"),
        ("min_scale_step", 40, "step 40"),
        ("max_ratio_step", 77, "step 77"),
        ("ratio", 1.2, "1.2x"),
        ("steps_ratio", 1.75, "1.75x"),
        ("fail_factor", 3.0, "3x"),
        ("early_median_ms", 20.5, "20.5 ms"),
        ("median_samples_per_s", 1600.0, "1,600 samples/s"),
        ("first_scale", 65536.0, "65,536 (loss scale)"),
        ("backoffs", 3, "3 steps"),
        ("steady_median_steps", 7.0, "7 flow steps per batch"),
        ("step_cap", 12, "12 flow steps per batch"),
        ("min_steps_to_arrive", 4, "4 flow steps per batch"),
        ("model_top1", 0.8, "80 %"),
        ("loss_drop", 0.46, "46 %"),
        ("seed_reference_seeds", 8, "8 seeds"),
        ("vs_identity", -0.32, "-0.32 (cosine)"),
        ("test/cosine", 0.88, "0.88 (cosine)"),
        ("largest_spike_sigma", 6.5, "6.5 std above the trailing mean"),
        ("p_value", 0.5, "0.5"),
        ("recovered", True, "yes"),
        ("split", "test", "test"),
    ],
)
def test_fmt_value_gives_units(key, value, shown):
    assert fmt_value(key, value) == shown


def test_unit_of_pure_statistics_is_empty():
    for key in PURE_STATISTICS + ("device_p_value", "rss_r2"):
        assert unit(key) == ("", 1.0)


def full_run():
    """A fp16 run with one recovered spike, one scaler backoff and eval metrics: every check has
    evidence to render."""
    df = spiked(1.2)
    df["amp/scale"] = np.where(df["step"] < 40, 65536.0, 32768.0)
    df["flow/flow_steps"] = 40.0
    df["grad/steps_healthy"], df["grad/steps_warning"] = 4, 0
    df["grad/steps_critical"], df["grad/steps_exploded"] = 0, 0
    events = [BACKOFF]
    params = {**PARAMS, **BOUNDS}
    return df, events, params, run_checks(df, events, params, GOOD_EVAL)


def test_rendered_report_shows_every_evidence_number_with_a_unit():
    df, events, params, result = full_run()
    md = render_markdown(result, {}, {}, GOOD_EVAL)
    html_text = render_html(result, {}, {}, GOOD_EVAL)
    numbers = 0
    for name, check in result["checks"].items():
        assert check["evidence"], name
        for key, value in check["evidence"].items():
            shown = fmt_value(key, value)
            assert f"- {key}: {shown}" in md, (name, key)
            assert f"<li>{key}: {shown}</li>" in html_text, (name, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or key.endswith(PURE_STATISTICS):
                continue
            numbers += 1
            assert shown != fmt(value) and unit(key)[0], f"{name}.{key}={value!r} renders without a unit: {shown}"
    assert numbers > 60
    ev = result["checks"]["scaler"]["evidence"]
    assert "- min_scale_step: step 40" in md and "- first_scale: 65,536 (loss scale)" in md
    assert f"- backoff_fraction: {fmt(ev['backoff_fraction'] * 100)} %" in md


def test_verdict_line_counts_only_applicable_checks():
    df = clean_run()
    result = run_checks(df, [], {**PARAMS, **BOUNDS}, GOOD_EVAL)  # no amp/scale: scaler n/a
    assert result["checks"]["scaler"]["status"] == "n/a"
    assert all(c["status"] == "pass" for n, c in result["checks"].items() if n != "scaler")
    assert verdict_parts(result) == ("STABLE", f"all {len(CHECK_ORDER) - 1} checks passed")
    assert "all 9 checks passed" in render_markdown(result, {}, {})
    df["amp/scale"] = 1024.0
    result = run_checks(df, [], {**PARAMS, **BOUNDS}, GOOD_EVAL)
    assert verdict_parts(result) == ("STABLE", "all 10 checks passed")
    df["perf/gpu_busy"] = np.nan  # a run without CUDA: device_utilisation does not apply either
    result = run_checks(df, [], {**PARAMS, **BOUNDS}, GOOD_EVAL)
    assert verdict_parts(result) == ("STABLE", "all 9 checks passed")


def test_verdict_line_lists_fail_warn_skip_but_never_na():
    result = run_checks(spiked(3.2), [], PARAMS)  # spike fails, learning skips, scaler n/a
    verdict, rest = verdict_parts(result)
    assert verdict == "UNSTABLE"
    assert rest == "failed: loss_spikes; skipped: learning"


def test_html_shows_the_verdict_banner_before_the_check_table():
    _, _, _, result = full_run()
    page = render_html(result, {}, {}, GOOD_EVAL)
    banner = page.index('<p class="verdict"')
    assert banner < page.index("<table>") and banner < page.index("<section>")
    # The backoff is an inf_grad step too, so nonfinite warns beside the scaler: stable, with
    # warnings, in amber (green is for a run with no warning at all).
    assert (
        f'<p class="verdict" style="background:{STATUS_COLOURS["warn"]}"><strong>Verdict: STABLE, WITH WARNINGS'
        "</strong> — warnings: nonfinite, loss_spikes, scaler</p>"
    ) in page
    unstable = render_html(run_checks(spiked(3.2), [], PARAMS), {}, {})
    banner = unstable.index(f'<p class="verdict" style="background:{STATUS_COLOURS["fail"]}"><strong>Verdict: UNSTABLE')
    assert banner < unstable.index("<table>")
    assert f'class="badge" style="background:{STATUS_COLOURS["n/a"]}">N/A</span>' in unstable  # the scaler's badge


def test_every_check_has_its_plot():
    assert set(CHECK_PLOTS) == set(CHECK_ORDER)
    assert CHECK_PLOTS["scaler"] == "scaler" and CHECK_PLOTS["convergence"] == "adaptive_steps"
    assert CHECK_PLOTS["learning"] == "learning"


# ---------------------------------------------------------------- plots


def test_plot_scaler_draws_the_scale_on_a_log2_axis_with_backoffs_marked():
    step = np.arange(1, 101)
    df = steps_df(100, **{"amp/scale": np.where(step < 40, 65536.0, 32768.0)})
    fig = plot_scaler(df, [BACKOFF], p())
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.yaxis.get_transform().base == 2
    labels = [h.get_label() for h in ax.get_legend().legend_handles]
    assert labels == ["amp/scale", "overflow backoff (1)", "collapse (< 1)"]
    steps_line = ax.get_lines()[0]
    assert steps_line.get_xdata().tolist() == list(range(1, 41)) + [40] + list(range(41, 101))
    marker = ax.collections[0].get_offsets()
    assert marker.tolist() == [[40.0, 32768.0]]


def test_plot_scaler_is_none_without_a_scaler():
    df = steps_df(50, **{"amp/scale": np.nan})
    assert plot_scaler(df, [{"step": 3, "kind": "nan_grad", "module": "x", "action": "skipped"}], p()) is None


def test_plot_learning_bars_match_the_metrics_with_ci_whiskers():
    metrics = {**GOOD_EVAL, "eval/test/ridge/top1": float("nan")}
    fig = plot_learning(metrics, p())
    ax = fig.axes[0]
    assert ax.get_title() == "Learning: trained model vs baselines (test split, 95 % CIs)"
    # The model's metrics present in the file, in a fixed order (group top-5 and MRR are absent here).
    assert [t.get_text() for t in ax.get_xticklabels()] == ["group top-1", "cosine", "top-1"]
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    heights = {name: [round(b.get_height(), 6) for b in c] for name, c in bars.items()}
    assert heights == {
        "model": [0.9, 0.88, 0.8],
        "identity": [0.0, 0.82, 0.7],
        "ridge": [0.0, 0.9, 0.0],  # NaN and absent metrics are drawn at 0, unlabelled
        "nearest": [0.0, 0.85, 0.6],
    }
    # The model's group top-1 carries its CI [0.87, 0.93] as a whisker; metrics without a CI get none.
    whiskers = bars["model"].errorbar.lines[2][0].get_segments()
    assert [round(float(y), 6) for y in whiskers[0][:, 1]] == [0.87, 0.93]
    assert all(seg[0, 1] == seg[1, 1] for seg in whiskers[1:])
    annotated = sorted(t.get_text() for t in ax.texts)
    assert annotated == sorted(["0.90", "0.88", "0.80", "0.85", "0.60", "0.82", "0.70", "0.90"])
    assert plot_learning(None, p()) is None and plot_learning({"train/loss": 1.0}, p()) is None
    val = plot_learning({"eval/val/model/cosine": 0.5}, p())
    assert "(val split, 95 % CIs)" in val.axes[0].get_title()


def test_make_plots_writes_scaler_and_learning_then_removes_them_when_their_data_is_gone(tmp_path):
    out = tmp_path / "plots"
    step = np.arange(1, 121)
    fp16 = steps_df(120, **{"train/loss": 2 + np.exp(-step / 30), "amp/scale": 1024.0, "flow/steps_used": 7.0})
    plots = make_plots(fp16, [backoff(60, 512.0)], PARAMS, out, eval_metrics=GOOD_EVAL)
    assert set(plots) == {"loss", "scaler", "learning", "adaptive_steps"}
    for name in ("scaler", "learning"):
        assert plots[name] == out / f"{name}.png" and plots[name].read_bytes()[:8] == PNG_SIGNATURE
    stale = out / "memory.png"
    stale.write_bytes(PNG_SIGNATURE)  # another run's plot whose data this run lacks

    fp32 = fp16.assign(**{"amp/scale": np.nan})
    plots = make_plots(fp32, [], PARAMS, out)
    assert set(plots) == {"loss", "adaptive_steps"}
    assert sorted(f.name for f in out.iterdir()) == ["adaptive_steps.png", "loss.png"]


def test_a_backoff_event_without_a_step_does_not_crash_the_checks():
    df = clean_run().assign(**{"amp/scale": 1024.0})
    result = run_checks(df, [{"kind": "inf_grad", "module": "carrier", "scale": 512.0}], PARAMS)
    assert result["checks"]["scaler"]["status"] in ("pass", "warn")
