"""A SIGTERM at any moment of a stage ends it with at most one line, never a traceback: before,
during and after its work, while it reports an error and while it ends. A launcher stops the
other ranks when one rank fails first, so a rank that failed too is often stopped while it says
why; and a stop inside a library's cleanup (Hydra's config reader) must still read as the stop.
Under CPU load (a busy process beside it), which moves the moments around."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from pipeline.core.paths import REPO_ROOT
from tests.test_distributed_embed import leftovers, two_ranks_on_a_missing_dataset
from tools.fault_matrix import clean_env

pytestmark = pytest.mark.integration

BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def busy_core():
    """A second process spinning on a core for the test's duration."""
    proc = subprocess.Popen(BUSY)
    yield
    proc.kill()
    proc.wait()


def test_a_stop_at_a_random_moment_of_a_failing_stage_never_prints_a_traceback(busy_core):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.stop_anywhere_worker", "60", "7"],
        cwd=REPO_ROOT,
        env={**clean_env(), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # Every call ended as the stop (143) or as the failure (1), whichever came first; none let a
    # SIGTERM out: a stop after a call ended reached the worker's own handler, put back.
    assert set(seen["codes"]) <= {"1", "143"} and sum(seen["codes"].values()) == 60, seen
    assert seen["codes"].get("143", 0) >= 10, seen  # the stops did land inside the calls
    # Each line is a stage's own: its failure, its stop, or what the body printed.
    for line in proc.stderr.splitlines():
        assert re.fullmatch(r"\[report\] (error: |stopped by SIGTERM|some output).*", line), line


@pytest.mark.slow  # 6 two-rank runs, ~12 s each on 2 busy cores
@pytest.mark.parametrize("attempt", range(6))
def test_two_ranks_failing_on_a_bad_dataset_under_load_print_no_traceback(tmp_path, busy_core, attempt):
    proc, out, env = two_ranks_on_a_missing_dataset(tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert not out.exists() and leftovers(out, env) == []
