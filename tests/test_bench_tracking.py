"""bench.tracking runs end to end (--quick) and reports what it promises; no timing is asserted
(benchmarks report ratios, tests check behaviour)."""
import json
import math
import subprocess
import sys

import pytest

from pipeline.core.paths import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a whole quick benchmark run (11-20 s): the default suite keeps its 10 minutes
def test_quick_run_prints_one_json_line_with_the_figures():
    proc = subprocess.run([sys.executable, "-m", "bench.tracking", "--quick"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["logging_overhead"] > 0 and res["metrics_logged_per_s"] > 0
    assert res["logging_overhead_whole_run"] > 0 and math.isfinite(res["logging_fixed_cost_s_per_run"])
    assert res["throughput_metrics"] == 200 * 35  # every value pushed was counted as sent
    assert res["arms_same_work"] is True  # tracking does not change what is trained
    assert res["metrics_per_s_during_training"] > 0 and res["goals"]["logging_overhead"] == 1.03
    assert set(res["goals_met"]) == {"logging_overhead"}


def test_help_explains_the_figures():
    out = subprocess.run([sys.executable, "-m", "bench.tracking", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    assert "logging_overhead" in out and "metrics_logged_per_s" in out and "--quick" in out
