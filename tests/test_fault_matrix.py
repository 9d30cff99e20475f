"""The fault matrix, as `python -m pipeline.report.fault_matrix` runs it: the smoke pipeline under
DVC once clean, once per fault preset, with the seeds' fp16 settings and once diverging; each
report must fail exactly the check its fault trips, with evidence at the injected step (about 4
minutes on 2 cores)."""
from __future__ import annotations

import pytest

from pipeline.paths import REPO_ROOT
from pipeline.report.fault_matrix import CASES, project_copy, run_matrix

ARTIFACTS = REPO_ROOT / "test-artifacts" / "fault_matrix"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    project = project_copy(tmp_path_factory.mktemp("fault-matrix"))
    return {r["case"]: r for r in run_matrix(project, CASES, out_dir=ARTIFACTS)}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_report_fails_exactly_the_check_its_fault_trips(matrix, case):
    res = matrix[case.name]
    assert not res["problems"], (res["problems"], res.get("verdict_line"), res.get("log", ""))


def test_clean_run_has_no_failed_check_and_every_fault_is_told_apart(matrix):
    clean = matrix["smoke:none"]
    assert clean["verdict"] == "stable" and clean["failed"] == []
    faults = [c for c in CASES if c.preset == "smoke" and c.fault != "none" and not c.label]
    tripped = {c.fault: tuple(matrix[c.name]["failed"]) for c in faults}
    # Five faults, five different diagnoses would be ideal; the two non-finite faults share one.
    assert tripped == {"nan_loss": ("nonfinite",), "inf_grad": ("nonfinite",), "loss_spike": ("loss_spikes",),
                       "lr_spike": ("loss_spikes",), "leak": ("memory_growth",)}


def test_reports_are_written_for_every_run(matrix):
    for case in CASES:
        folder = ARTIFACTS / case.name.replace(":", "-")
        html = (folder / "stability.html").read_text()
        assert html.index("Verdict:") < html.index("<table"), "the verdict comes first"
        assert (folder / "stability.md").read_text().startswith("# Stability report")
