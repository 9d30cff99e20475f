"""The committed default run, judged again: the report stage's checks on the telemetry that
dvc.lock records give the committed metrics/stability.json, byte for byte. It needs the run's
files in the working tree (`dvc checkout`, and the time and memory files the train stage writes
beside them); without them, or with another run's, it is skipped."""

import hashlib
from pathlib import Path

import pytest
import yaml

from pipeline.core.atomic import write_json
from pipeline.core.config import load_config
from pipeline.report.checks import run_checks, stability_metrics
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
    if inputs.unmeasured:
        pytest.skip(f"the run's time and memory are not here: {inputs.unmeasured}")
    params = run_params(cfg, inputs.train_metrics, len(inputs.steps))
    result = run_checks(inputs.steps, inputs.events, params, inputs.eval_metrics, unmeasured=inputs.unmeasured)
    write_json(tmp_path / "stability.json", stability_metrics(result))
    assert (tmp_path / "stability.json").read_bytes() == (ROOT / "metrics/stability.json").read_bytes()
