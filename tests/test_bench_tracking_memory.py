"""bench.tracking_memory re-measures the memory estimate's TRACKING_MB: one fresh interpreter's
RSS before and after opening a tracked run, printed as one JSON line."""

from __future__ import annotations

import pytest

from pipeline.train.memory_estimate import TRACKING_MB
from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a whole bench run in a fresh interpreter (8.9 s): with the other quick bench runs
def test_one_round_prints_the_measured_figure_beside_the_constant():
    res = bench_json("bench.tracking_memory", "--rounds", "1", timeout=300)
    assert res["tracking_mb_constant"] == TRACKING_MB and len(res["tracking_mb_rounds"]) == 1
    # Importing MLflow and opening a store costs tens of MB at least; the constant is meant to be
    # an estimate of it, so the two must be of one size (within 2x either way).
    assert res["tracking_mb"] > 10
    assert 0.5 <= res["constant_over_measured"] <= 2.0
    assert res["cpu_model"]


def test_rounds_below_one_are_refused():
    proc = run_module("bench.tracking_memory", "--rounds", "0", timeout=60)
    assert proc.returncode == 2 and "--rounds must be >= 1" in proc.stderr
