"""bench.scaling runs end to end (--quick: real torchrun, 1 and 2 gloo processes) and reports what it
promises; no timing is asserted (benchmarks report ratios, tests check behaviour)."""

import pytest

from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a whole quick benchmark run (11-20 s): the default suite keeps its 10 minutes
def test_quick_run_prints_one_json_line_with_the_figures():
    res = bench_json("bench.scaling", "--quick")
    assert res["samples_per_s_1"] > 0 and res["samples_per_s_2"] > 0
    assert res["ratio"] == res["samples_per_s_2"] / res["samples_per_s_1"]
    assert res["backend_2"] == "gloo" and res["device"] == "cpu"
    # Both arms use the machine's cores: 1 x N threads against 2 x N/2.
    assert res["threads_per_process_1"] == res["cores"]
    assert res["threads_per_process_2"] == max(1, res["cores"] // 2)


def test_help_explains_the_figures():
    out = run_module("bench.scaling", "--help", timeout=120).stdout
    assert "samples_per_s_1" in out and "ratio" in out and "threads_per_process" in out and "--quick" in out
