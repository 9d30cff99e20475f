"""bench.probe, the reference workload every benchmark times between its runs: what it records
and how it summarises and normalises. No timing is asserted (benchmarks report ratios on a shared
machine; tests check behaviour)."""

import pytest
import torch

from bench import probe as bp

pytestmark = pytest.mark.unit


def test_cpu_model_is_named():
    name = bp.cpu_model()
    assert isinstance(name, str) and name and name != "unknown"


def test_probe_records_each_run_with_its_thread_count_and_restores_the_callers():
    before = torch.get_num_threads()
    p = bp.Probe(threads=1, n=32, reps=2)
    assert p.times == [] and p.threads == set()  # the warm-up is not kept
    seconds = p.take(3)
    assert len(seconds) == 3 and p.times == seconds and all(s > 0 for s in seconds)
    assert p.threads == {1} and torch.get_num_threads() == before
    assert p.flops == 2 * 32**3 * 2
    assert p.peak_flops() == pytest.approx(p.flops / min(seconds))


def test_spread_and_summary_shape():
    s = bp.spread([0.004, 0.002, 0.003, 0.010])
    assert s["probe_count"] == 4
    assert s["probe_ms_min"] == pytest.approx(2.0) and s["probe_ms_max"] == pytest.approx(10.0)
    assert s["probe_spread_max_min"] == pytest.approx(5.0)
    assert s["probe_ms_p10"] <= s["probe_ms_median"] <= s["probe_ms_p90"]
    assert s["probe_spread_p90_p10"] == pytest.approx(s["probe_ms_p90"] / s["probe_ms_p10"])
    assert bp.spread([], "x") == {"x_count": 0}
    p = bp.Probe(n=32, reps=1)
    p.take(2)
    info = bp.machine(p)
    assert info["cpu_model"] == bp.cpu_model() and info["cpu_count"] >= 1
    assert info["busy"] == (info["probe"]["probe_spread_p90_p10"] > bp.BUSY_SPREAD)
    for key in (
        "probe_workload",
        "probe_threads",
        "probe_peak_gflops",
        "probe_count",
        "probe_ms_min",
        "probe_ms_median",
        "probe_ms_max",
        "probe_spread_p90_p10",
        "probe_spread_max_min",
    ):
        assert key in info["probe"], key


def test_normaliser_brings_a_slow_moment_to_the_reference_speed():
    # Probes twice as slow as the reference: a span timed then counts half.
    assert bp.normaliser([0.02, 0.02, 0.5], reference_s=0.01) == pytest.approx(0.5)  # the median, not the outlier
    assert bp.normaliser([0.01], reference_s=0.01) == 1.0
