"""CI's smoke verdict on real smoke runs, as a GitHub Actions job runs it: `python -m tools.verdict
NAME` on the session's three smoke experiments (tests/conftest.py: smoke-a is a plain smoke run,
smoke-b and smoke-c ran with other train.lr values), GITHUB_STEP_SUMMARY set, against the
committed reference/smoke_items.parquet. The whole path with its own smoke run (`./dev verdict
--smoke`, what .ci/run does) trains one more and is in the slow tier, below."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import EXPERIMENTS

pytestmark = pytest.mark.e2e


def verdict(root, env, *args: str, summary=None) -> tuple[int, str, str]:
    # (the suite may itself run under GitHub Actions: its own job summary is not the test's)
    env = {k: v for k, v in env.items() if k != "GITHUB_STEP_SUMMARY"}
    env.update({"GITHUB_STEP_SUMMARY": str(summary)} if summary else {})
    proc = subprocess.run(
        [sys.executable, "-m", "tools.verdict", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow  # reads the three smoke experiments (tests/conftest.py: three smoke runs to make)
def test_the_smoke_experiments_verdicts_go_to_the_job_summary(smoke_experiments, tmp_path):
    root, env = smoke_experiments.root, smoke_experiments.env
    summary = tmp_path / "step_summary.md"
    found = {}
    for name in EXPERIMENTS:
        code, out, err = verdict(root, env, name, "--json", summary=summary)
        assert code in (0, 1), f"{name}: exit {code}\n{err[-3000:]}"
        found[name] = v = json.loads(out)
        assert code == (0 if v["passed"] else 1) and v["run"]["spec"] == name and v["items"] == 62, name
        assert f"the table is in {summary}" in err
    # smoke-a is the reference's own configuration and seed: the same run, to the last bits or
    # within them.
    a = found["smoke-a"]
    assert a["passed"] and all(r["outcome"] != "worse" for r in a["metrics"].values())
    assert abs(a["metrics"]["cosine"]["difference"]) < 1e-4
    # smoke-c (train.lr 0.001, a third of smoke's) learns less in smoke's few steps.
    assert found["smoke-c"]["metrics"]["cosine"]["difference"] < -0.05
    page = summary.read_text()
    assert page.count("Smoke verdict") == 3 and all(f"Run {name} (arm " in page for name in EXPERIMENTS)
    assert not (root / "reports" / "smoke_verdict.md").exists()  # the summary, not the reports/ file
    # Without GITHUB_STEP_SUMMARY the same table goes to reports/smoke_verdict.md.
    code, out, err = verdict(root, env, "smoke-a")
    assert code == 0 and out.startswith("PASS: ") and "cosine (gate)" in out
    assert (root / "reports" / "smoke_verdict.md").read_text().startswith("### :white_check_mark: Smoke verdict")


@pytest.mark.slow  # trains a smoke run (about a minute and a half on 2 cores)
def test_dev_verdict_smoke_runs_the_experiment_and_judges_it(tmp_path):
    """What .ci/run does on a fresh clone: the smoke experiment under --temp (the workspace left
    as it was), then its verdict, in the job summary."""
    from tools import reference as smoke_reference
    from tools.fault_matrix import project_copy

    (tmp_path / "project").mkdir()
    root = project_copy(tmp_path / "project")
    env = smoke_reference.reference_env()
    summary = tmp_path / "step_summary.md"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    code, out, err = verdict(root, env, "--smoke", summary=summary)
    assert code == 0, f"exit {code}\n{out}\n{err[-4000:]}"
    assert out.startswith("PASS: ") and "smoke-verdict-" in out
    assert "Smoke verdict" in summary.read_text()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout == status
