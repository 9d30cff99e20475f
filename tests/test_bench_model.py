"""bench.model's measuring pieces, on the smoke preset: what they count is right (no timing is
asserted here; benchmarks report ratios, tests check behaviour)."""
import pytest

from bench import model as bench
from pipeline.core.config import load_config

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


def test_reference_speedup_is_measured_on_a_sub_batch_and_scaled():
    res = bench.speedup_vs_reference(load_config(["preset=smoke"]), sub_batch=2)
    assert res["reference_scaled_by_flow_steps"] and res["reference_timed_samples"] == 2
    assert res["reference_timed_flow_steps"] < res["full_batch_flow_steps"]
