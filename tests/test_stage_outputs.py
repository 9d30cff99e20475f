"""A file an earlier stage wrote, damaged (edited by hand, cut short, a merge conflict left in it):
the stage that reads it names the file and the stage that writes it, never a parser traceback."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.stage_outputs import read_csv, read_json
from stages import report

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "not found"),
        ('{"train/loss": 0.1,', "not valid JSON (line 1, column 20"),
        ("<<<<<<< HEAD\n{}\n", "not valid JSON (line 1, column 1"),
        ("[1, 2]", "holds a JSON list, expected an object"),
        (b"\xff\xfe{}", "cannot be read"),
    ],
)
def test_a_damaged_json_output_is_named_with_its_stage(tmp_path, content, fragment):
    path = tmp_path / "train.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PipelineError) as exc:
        read_json(path, "train")
    msg = str(exc.value)
    assert msg.startswith(str(path)) and fragment in msg, msg
    assert msg.endswith("it is written by the train stage: run it again (dvc repro train)")


def test_a_damaged_csv_output_is_named_with_its_stage(tmp_path):
    path = tmp_path / "train_steps.csv"
    path.write_text('step,train/loss\n1,"0.5\n')
    with pytest.raises(PipelineError, match=r"train_steps.csv: not a readable CSV table"):
        read_csv(path, "train")
    path.write_text("loss\n0.5\n")
    with pytest.raises(PipelineError, match=r"lacks the column\(s\) \['step'\]"):
        read_csv(path, "train", required=("step",))


def test_the_report_stage_names_a_damaged_metrics_file(tmp_path, monkeypatch, capsys):
    models, telemetry, metrics = tmp_path / "models", tmp_path / "telemetry", tmp_path / "metrics"
    for d in (models, telemetry, metrics):
        d.mkdir()
    (models / "run.json").write_text(json.dumps({"run_id": "0" * 32}))
    (telemetry / "train_steps.csv").write_text("step,train/loss\n1,0.5\n")
    (telemetry / "train_events.json").write_text("[]")
    (metrics / "train.json").write_text('{"train/loss": 0.5,')  # cut short
    monkeypatch.setattr(report, "TELEMETRY_DIR", telemetry)
    monkeypatch.setattr(report, "METRICS_DIR", metrics)
    monkeypatch.setattr(report, "build_report", lambda *a, **kw: pytest.fail("the report was built"))
    assert report.main([f"train.out_dir={models}", "run.allow_external_paths=true", "run.tracking=disabled"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"[report] error: {metrics / 'train.json'}: not valid JSON") and "Traceback" not in err, err
