"""The committed default run, judged again: the report stage's checks on the telemetry that
dvc.lock records give the committed metrics/stability.json, byte for byte. It needs the run's
telemetry in the working tree (`dvc checkout`); without it, or with another run's, it is skipped.
Without the time and memory files the train stage writes beside it (telemetry/train_perf.*, no
DVC output), the checks of those are skipped and everything else must still be as committed."""

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline.core.atomic import write_json
from pipeline.core.config import load_config
from pipeline.report.checks import MEASURED_CHECKS, run_checks, stability_metrics
from pipeline.report.checks.params import run_params
from stages.report import read_inputs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TELEMETRY = ("telemetry/train_steps.csv", "telemetry/train_events.json")


def committed_telemetry_or_skip() -> None:
    deps = {d["path"]: d["md5"] for d in yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]["report"]["deps"]}
    for rel in TELEMETRY:
        path = ROOT / rel
        if not path.is_file():
            pytest.skip(f"{rel} is not in the working tree (dvc checkout brings it)")
        if hashlib.md5(path.read_bytes()).hexdigest() != deps[rel]:
            pytest.skip(f"{rel} is not the committed run's (dvc.lock records another)")


def test_the_committed_run_gives_the_committed_stability_metrics(tmp_path):
    committed_telemetry_or_skip()
    cfg = load_config([])
    inputs = read_inputs(cfg)
    params = run_params(cfg, inputs.train_metrics, len(inputs.steps))
    result = run_checks(inputs.steps, inputs.events, params, inputs.eval_metrics, unmeasured=inputs.unmeasured)
    write_json(tmp_path / "stability.json", stability_metrics(result))
    committed = ROOT / "metrics/stability.json"
    if not inputs.unmeasured:
        assert (tmp_path / "stability.json").read_bytes() == committed.read_bytes()
        return
    again, before = (json.loads(p.read_text()) for p in (tmp_path / "stability.json", committed))
    for name in MEASURED_CHECKS:
        assert again.pop(name)["status"] == "skip"
        before.pop(name)
    assert again == before
