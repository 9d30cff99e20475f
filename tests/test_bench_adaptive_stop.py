"""bench.adaptive_stop's measuring pieces, on the smoke preset: the fixed 50-step loop does the
model's work plus the extra steps, and the arms' counts and ratios are what they say (no timing is
asserted here; benchmarks report ratios, tests check behaviour)."""

import pytest
import torch

from bench import adaptive_stop as bench
from bench.probe import Probe
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel
from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration  # runs a bench: outside the ~2-minute unit tier


def test_fixed_loop_deposits_what_the_model_does_and_moves_every_flow_every_step():
    torch.manual_seed(0)
    model = EnergyFlowModel.from_config(load_config(["preset=smoke"]).model, bench.DIM)
    model.adaptive_stop = False
    x = torch.randn(8, bench.DIM)
    out = model(x)
    _, surface, steps, flow_steps = bench.fixed_steps_forward(model, x, 50)
    assert out.steps_used < steps == 50 and flow_steps == 50 * out.spawned
    torch.testing.assert_close(surface, out.surface)  # finished flows are only moved, never deposited again


def test_measure_runs_each_arm_on_each_batch_between_probes():
    probe = Probe(n=64, reps=2)
    res = bench.measure(load_config(["preset=smoke"]), batches=2, batch_size=8, fixed_steps=50, probe=probe)
    assert len(probe.times) == 2 * len(bench.ARMS) * 6  # 3 probes before and 3 after each timed span
    assert res["fixed_steps_used"] == [50, 50] and len(res["on_steps_used"]) == len(res["off_steps_used"]) == 2
    # Untrained, a batch's flows all finish within a step of each other: adaptive stopping (3 steps
    # of patience) has nothing to cut.
    assert res["on_steps_used"] == res["off_steps_used"]
    assert res["fixed_over_on_steps"] == 50 / res["on_steps_used_mean"]
    assert res["fixed_over_on_flow_steps"] == res["fixed_flow_steps_mean"] / res["on_flow_steps_mean"]
    for arm in ("off", "fixed"):
        assert res[f"{arm}_over_on_time_raw"] > 0 and res[f"{arm}_over_on_time_probe_normalised"] > 0
        assert res[f"{arm}_over_on_cpu_time"] > 0


def test_seed_preset_is_measured_by_default():
    assert "seed" in run_module("bench.adaptive_stop", "--help", timeout=120).stdout


@pytest.mark.slow  # a whole quick benchmark run (~10 s): the default suite keeps its 10 minutes
def test_quick_run_names_the_cpu_and_the_probes_spread():
    res = bench_json("bench.adaptive_stop", "--quick")
    assert isinstance(res["cpu_model"], str) and res["cpu_model"]
    assert res["probe"]["probe_count"] == 2 * 3 * 6 and res["probe"]["probe_spread_max_min"] >= 1.0
    assert res["preset"] == "smoke" and res["fixed_steps_used"] == [50, 50]
    assert res["fixed_over_on_steps"] > 1 and res["peak_rss_gb"] > 0


def test_the_cpu_time_ratios_need_three_pairs_that_agree():
    res = {"batches": 2, "fixed_over_on_cpu_time": 10.0, "fixed_over_on_cpu_time_pairs": [10.0, 10.0]}
    assert "at least 3" in bench.pairs_unreliable(res, "fixed")
    res |= {"batches": bench.MIN_PAIRS, "fixed_over_on_cpu_time_pairs": [9.8, 10.0, 10.2]}
    assert bench.pairs_unreliable(res, "fixed") is None
    res["fixed_over_on_cpu_time_pairs"] = [8.5, 10.0, 11.0]
    assert "max - min" in bench.pairs_unreliable(res, "fixed")
