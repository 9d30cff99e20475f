"""CI's smoke verdict (tools/verdict.py, pipeline/stats/reference_verdict.py) on item tables made
here or committed: a regression fails (exit 1) with the table, noise passes (an identical run, a
last-bit change, every other seed of the smoke preset's 20 committed ones), a run that cannot be
judged says why (exit 2), and the Markdown goes to $GITHUB_STEP_SUMMARY when it is set, else to
reports/. The check on real smoke runs is tests/test_verdict_e2e.py."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.stats import decision
from pipeline.stats import reference_verdict as rv
from pipeline.stats.item_sources import load_side
from pipeline.stats.item_tables import read_items, write_items
from pipeline.stats.metrics import METRICS
from pipeline.stats.seed_variance import find_reference
from tools import verdict as tool

pytestmark = pytest.mark.unit

REPLICATES = REPO_ROOT / "tests" / "data" / "replicates" / "smoke"  # the 20 seeds the smoke reference measured
LR_TENTH = REPO_ROOT / "tests" / "data" / "smoke_lr_tenth_items.parquet"  # a real run, train.lr=0.0003
RESAMPLES = 1000  # the tools' least: enough for a pass or a fail this clear, and quick


@pytest.fixture(autouse=True)
def report_in_tmp(tmp_path, monkeypatch):
    """Outside GitHub Actions the table goes to reports/smoke_verdict.md: here, to tmp_path's."""
    monkeypatch.delenv(rv.SUMMARY_VAR, raising=False)
    report = tmp_path / "reports" / "smoke_verdict.md"
    monkeypatch.setattr(rv, "REPORT", report)
    return report


def reference_table():
    return read_items(rv.REFERENCE_ITEMS)


def changed(tmp_path, name: str, change, meta_change=None) -> str:
    """The committed reference's table with `change` applied to it, as a file of its own."""
    table, meta = reference_table()
    table = change(table.copy())
    path = tmp_path / f"{name}.parquet"
    write_items(table, path, meta_change(meta) if meta_change else meta)
    return str(path)


def verdict_of(run: str) -> dict:
    return rv.judge(load_side(run), load_side(str(rv.REFERENCE_ITEMS)), resamples=RESAMPLES, seed=0)


def main(capsys, *args: str) -> tuple[int, str, str]:
    code = tool.main([*args, "--resamples", str(RESAMPLES), "--seed", "0"])
    out = capsys.readouterr()
    return code, out.out, out.err


def regression(table):
    """Worse on every item as a run of train.lr at a tenth of smoke's is (cosine 0.48 -> 0.10),
    and far off on mse too: a regression under any version of the rule."""
    table["cosine"] = table["cosine"] - 0.37
    table["mse"] = table["mse"] + 0.03
    table["rank"] = table["rank"] + 50
    table["group_rank"] = table["group_rank"] + 20
    return table


def test_the_committed_reference_items_are_the_smoke_reference_run():
    """reference/smoke_items.parquet is the run tests/smoke_reference.json holds (the same means),
    on the data of the smoke seed-variance reference, and git keeps it (not ignored)."""
    table, meta = reference_table()
    numbers = json.loads((REPO_ROOT / "tests" / "smoke_reference.json").read_text())["eval"]
    values = verdict_of(str(rv.REFERENCE_ITEMS))["metrics"]
    for m in METRICS:
        assert values[m]["a"] == pytest.approx(numbers[f"eval/test/model/{m}"], abs=1e-6), m
    assert len(table) == numbers["eval/test/items"]
    assert meta.preset == "smoke" and find_reference("smoke", meta.data) is not None
    ignored = subprocess.run(["git", "check-ignore", "-q", str(rv.REFERENCE_ITEMS)], cwd=REPO_ROOT)
    assert ignored.returncode == 1, f"{rv.REFERENCE_ITEMS} is git-ignored: it would not be committed"


def test_a_regression_fails_with_the_table(tmp_path, capsys, report_in_tmp):
    run = changed(tmp_path, "regressed", regression)
    code, out, err = main(capsys, run)
    assert code == 1
    assert out.startswith("FAIL: the smoke run is worse than the committed reference on ")
    assert "cosine (gate)" in out and "mse (gate)" in out and "worse: FAILS" in out
    assert "./dev reference --refresh" in out  # what to do if the change is intended
    page = report_in_tmp.read_text()
    assert page.startswith("### :x: Smoke verdict") and "| mse (gate) |" in page
    assert f"the table is in {report_in_tmp}" in err


@pytest.mark.xfail(
    not hasattr(decision, "GUARD_MULTIPLE"),
    strict=True,
    reason="the two-mode guard lets a difference far beyond the widest seed gap through only with the decision "
    "rule of issue 40 (pipeline/stats/decision.py: GUARD_MULTIPLE); before it, one smoke run is never worse on cosine",
)
def test_a_real_run_at_a_tenth_of_the_learning_rate_fails_on_cosine():
    v = verdict_of(str(LR_TENTH))
    cosine = v["metrics"]["cosine"]
    assert cosine["difference"] == pytest.approx(-0.377, abs=0.001) and cosine["ci_high"] < 0
    assert v["failed"] == ["cosine"] and not v["passed"]


def test_an_identical_run_passes_and_says_so(capsys, report_in_tmp, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("### an earlier step's summary\n")
    monkeypatch.setenv(rv.SUMMARY_VAR, str(summary))
    code, out, err = main(capsys, str(rv.REFERENCE_ITEMS))
    assert code == 0 and out.startswith("PASS: the smoke run is identical to the committed reference")
    assert all(line.endswith("identical") for line in out.splitlines() if line.startswith(METRICS))
    page = summary.read_text()
    assert page.startswith("### an earlier step's summary\n### :white_check_mark: Smoke verdict")  # appended
    assert "| cosine (gate) | 0.477 | 0.477 | +0.000 | - | identical |" in page
    assert not report_in_tmp.exists() and f"the table is in {summary}" in err


def test_noise_passes_last_bits_and_every_other_seed(tmp_path, report_in_tmp):
    last_bits = changed(tmp_path, "last-bits", lambda t: t.assign(cosine=t["cosine"] * (1 + 1e-7)))
    v = verdict_of(last_bits)
    assert v["passed"] and not v["identical"] and v["metrics"]["cosine"]["outcome"] != "worse"
    # The smoke preset's other seeds (its seed-variance reference measured these 20 runs; seed 0
    # is the reference run of an older commit): luck, never a regression.
    failed = {}
    for path in sorted(REPLICATES.glob("seed-*.parquet")):
        v = verdict_of(str(path))
        if not v["passed"]:
            failed[path.stem] = v["failed"]
    assert failed == {}
    rv.publish(rv.render_markdown(v))  # no GITHUB_STEP_SUMMARY: the reports/ file
    assert report_in_tmp.read_text().startswith("### :white_check_mark: Smoke verdict")


def test_retrieval_rates_never_gate(tmp_path):
    """Smoke's group top-1 sits at its floor (0 or 1 hit of 62): a run that loses its one hit, or
    every top-5 hit, is shown but passes."""
    table, _ = reference_table()
    hits = int((table["group_rank"] <= 5).sum())
    assert 0 < hits <= 5  # the floor: a handful of items
    run = changed(tmp_path, "no-hits", lambda t: t.assign(rank=t["rank"] + 10, group_rank=t["group_rank"] + 10))
    v = verdict_of(run)
    assert v["passed"] and set(v["gates"]) == {"cosine", "mse"}
    assert v["metrics"]["group_top5"]["difference"] == pytest.approx(-hits / len(table), abs=1e-6)


def test_a_run_that_cannot_be_judged_says_what_to_do(tmp_path, capsys, report_in_tmp):
    other_preset = changed(tmp_path, "default", lambda t: t, lambda m: replace(m, preset="default"))
    code, _, err = main(capsys, other_preset)
    assert code == 2 and "is a run of preset 'default'; the verdict judges a smoke run" in err
    assert "CANNOT JUDGE" in report_in_tmp.read_text()

    other_data = changed(tmp_path, "data", lambda t: t, lambda m: replace(m, data="d2"))
    code, _, err = main(capsys, other_data)
    assert code == 2 and "other data (digest d2)" in err and "./dev reference --refresh" in err

    fewer = changed(tmp_path, "fewer", lambda t: t.iloc[:50])
    code, _, err = main(capsys, fewer)
    assert code == 2 and "the run holds 50 test items and the reference 62" in err

    code, _, err = main(capsys, str(rv.REFERENCE_ITEMS), "--reference", str(tmp_path / "none.parquet"))
    assert code == 2 and "none.parquet: no reference item table; write it with ./dev reference --refresh" in err


def test_json_holds_what_the_table_shows(capsys):
    code, out, _ = main(capsys, str(REPLICATES / "seed-3.parquet"), "--json")
    v = json.loads(out)
    assert code == 0 and v["passed"] and v["gates"] == ["cosine", "mse"] and v["items"] == 62
    assert set(v["metrics"]) == set(METRICS) and all(np.isfinite(v["metrics"][m]["ci_low"]) for m in METRICS)
    assert "reference/seed_variance/smoke.json" in v["covers"]
