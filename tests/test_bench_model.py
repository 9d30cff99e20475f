"""bench.model's measuring pieces, on the smoke preset: what they count is right, and the MFU's
peak is the best of the probes taken between its steps (no timing is asserted here; benchmarks
report ratios, tests check behaviour)."""

import pytest

from bench import model as bench
from pipeline.core.config import load_config
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration  # runs a stage or a bench: outside the ~2-minute unit tier


def test_checkpointing_saves_fewer_activation_bytes():
    res = bench.activation_bytes(load_config(["preset=smoke"]))
    assert 0 < res["activation_bytes_per_flow_step_checkpointed"] < res["activation_bytes_per_flow_step_plain"]


def test_flop_count_matches_the_matmuls_of_the_model():
    cfg = load_config(["preset=smoke"])
    res = bench.mfu(cfg)
    m = cfg.model
    c, nh, C, L = m.cell_state_dim, m.neuron_hidden, m.carrier_hidden, m.carrier_layers
    per_flow_step = (c + 4) * nh + nh * nh + sum(((nh if i == 0 else C) + C) * 3 * C for i in range(L)) + C * 4
    W, E, oh = m.lattice_width * m.lattice_height, 384, m.output_hidden
    per_sample = E * W + W * oh + oh * E
    forward = 2 * (per_flow_step * res["bench_flow_steps"] + per_sample * cfg.train.batch_size)
    # Backward costs about two forwards (grads w.r.t. inputs and weights); the first layer's input
    # needs no gradient, so a little less.
    assert 2.5 * forward <= res["step_gflops"] * 1e9 <= 3.0 * forward
    assert res["mfu"] > 0


def test_mfu_is_against_the_best_of_many_probes_taken_between_the_steps():
    probe = bench.Probe(n=64, reps=2)
    res = bench.mfu(load_config(["preset=smoke"]), rounds=3, probes_per_round=2, probe=probe)
    assert len(probe.times) == 3 * 2 and res["mfu_rounds"] == 3
    assert res["matmul_peak_gflops"] * 1e9 == pytest.approx(probe.peak_flops())
    assert res["mfu"] == pytest.approx(res["achieved_gflops"] / res["matmul_peak_gflops"])
    assert res["achieved_gflops"] == pytest.approx(res["step_gflops"] / res["bench_step_s"])
    assert res["bench_step_s"] <= res["bench_step_s_median"]  # the best step against the best probe
    assert res["mfu_probe_is_poor_reference"] == (res["mfu"] > 1)
    assert res["mfu_vs_burst_peak"] > 0 and res["matmul_burst_peak_gflops"] > 0 and res["mfu_median_paired"] > 0


def test_reference_speedup_is_measured_on_a_sub_batch_and_scaled():
    res = bench.speedup_vs_reference(load_config(["preset=smoke"]), sub_batch=2)
    assert res["reference_scaled_by_flow_steps"] and res["reference_timed_samples"] == 2
    assert res["reference_timed_flow_steps"] < res["full_batch_flow_steps"]
    assert res["speedup_vs_reference_probe_normalised"] > 0


@pytest.mark.slow  # a whole quick benchmark run (~1 min on 2 cores): the default suite keeps its 10 minutes
def test_quick_run_names_the_cpu_and_the_probes_spread():
    res = bench_json("bench.model", "--quick", "--device", "cpu", timeout=900)
    assert isinstance(res["cpu_model"], str) and res["cpu_model"]
    assert res["probe"]["probe_count"] >= 3 * 4 and res["probe"]["probe_spread_max_min"] >= 1.0
    assert res["mfu"] > 0 and isinstance(res["mfu_probe_is_poor_reference"], bool)
    assert "seed_preset_step_s" not in res  # --quick leaves the seed step out
