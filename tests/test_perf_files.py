"""telemetry/train_perf.*: the report uses a run's time and memory only when they were measured
under its own settings and data (DVC can restore a cached train stage and leave an earlier run's
measurements in place)."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import load_config
from pipeline.train import perf_files
from pipeline.train.perf_files import SETTINGS_KEY, current_settings, manifest_digest, read_perf, settings_digest

pytestmark = pytest.mark.unit

MANIFEST = {
    "format_version": 2,
    "dim": 384,
    "dtype": "float32",
    "splits": {"train": {"rows": 10}},
    "files": {},
    "source_sha256": "ab" * 32,
}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """Shards with a manifest, and the perf files pointed into tmp_path."""
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps(MANIFEST))
    monkeypatch.setattr(perf_files, "PERF_CSV", tmp_path / "train_perf.csv")
    monkeypatch.setattr(perf_files, "PERF_JSON", tmp_path / "train_perf.json")
    cfg = load_config(["preset=smoke", f"embed.out_dir={shards}", "run.allow_external_paths=true"])
    return cfg, tmp_path


def write_perf(folder, digest):
    (folder / "train_perf.csv").write_text("step,perf/step_ms,mem/rss_mb\n1,20.0,1500.0\n2,21.0,1501.0\n")
    doc = {"perf/samples_per_s": 1600.0, "train/seconds": 3.5}
    if digest is not None:
        doc[SETTINGS_KEY] = digest
    (folder / "train_perf.json").write_text(json.dumps(doc))


def test_measurements_of_this_config_are_read(workspace):
    cfg, folder = workspace
    write_perf(folder, current_settings(cfg))
    perf = read_perf(cfg)
    assert perf.missing == ""
    assert perf.totals == {"perf/samples_per_s": 1600.0, "train/seconds": 3.5}  # the digest is not a metric
    assert list(perf.steps["perf/step_ms"]) == [20.0, 21.0]


@pytest.mark.parametrize("override", ["fault=leak", "train.lr=0.01", "run.seed=1", "model.carrier_hidden=32"])
def test_measurements_of_other_settings_are_refused(workspace, override):
    cfg, folder = workspace
    write_perf(folder, current_settings(cfg))
    other = load_config(
        ["preset=smoke", f"embed.out_dir={cfg.embed.out_dir}", "run.allow_external_paths=true", override]
    )
    perf = read_perf(other)
    assert perf.steps is None and perf.totals == {}
    assert "measured under other settings" in perf.missing and "train_perf.json" in perf.missing


def test_measurements_of_other_data_are_refused(workspace):
    cfg, folder = workspace
    write_perf(folder, current_settings(cfg))
    manifest = folder / "shards" / "manifest.json"
    manifest.write_text(json.dumps({**MANIFEST, "source_sha256": "cd" * 32}))
    assert "measured under other settings" in read_perf(cfg).missing


def test_missing_or_unlabelled_measurements_say_so(workspace):
    cfg, folder = workspace
    assert "train_perf.csv or train_perf.json is missing" in read_perf(cfg).missing
    write_perf(folder, None)
    assert "does not say which settings" in read_perf(cfg).missing


def test_the_digest_is_stable_and_ignores_key_order():
    cfg = load_config(["preset=smoke"])
    data = manifest_digest(MANIFEST)
    assert data == manifest_digest(dict(reversed(list(MANIFEST.items()))))
    assert settings_digest(cfg, data) == settings_digest(load_config(["preset=smoke"]), data)
    assert len(settings_digest(cfg, data)) == 16
    # Settings that only change where things go do not change it.
    assert settings_digest(cfg, data) == settings_digest(load_config(["preset=smoke", "run.tracking=disabled"]), data)


def test_missing_time_and_memory_files_are_read_from_the_models_run_when_they_are_its_own(tmp_path, monkeypatch):
    """A clone that pulled the model has no telemetry/train_perf.* (no DVC output): the report reads
    the copies the train run logged (train/train_perf.*), under the same settings check."""
    import pandas as pd
    from mlflow import MlflowClient

    from pipeline.tracking import store as tracking
    from pipeline.train.perf_files import Perf
    from stages.report import perf_of_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracking._open_sqlite_store.cache_clear()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("energy-flow", artifact_location=(tmp_path / "mlruns").as_uri())
    run = client.create_run(experiment).info.run_id
    logged = tmp_path / "logged"
    logged.mkdir()
    pd.DataFrame({"step": [1, 2], "perf/step_ms": [1.5, 2.5]}).to_csv(logged / "train_perf.csv", index=False)
    (logged / "train_perf.json").write_text(json.dumps({SETTINGS_KEY: "abc", "train/seconds": 3.0}))
    for name in ("train_perf.csv", "train_perf.json"):
        client.log_artifact(run, str(logged / name), "train")
    local = Perf(missing="train_perf.csv or train_perf.json is missing from telemetry")

    monkeypatch.setattr(perf_files, "current_settings", lambda cfg: "abc")
    got = perf_of_run(None, run, local)
    assert list(got.steps["step"]) == [1, 2] and list(got.steps["perf/step_ms"]) == [1.5, 2.5]
    assert got.totals == {"train/seconds": 3.0} and got.missing == ""
    # Measured under other settings (another run's): not used, the local reason stands.
    monkeypatch.setattr(perf_files, "current_settings", lambda cfg: "other")
    assert perf_of_run(None, run, local) is local
    # A run that logged none (trained before the files were logged): the same.
    assert perf_of_run(None, client.create_run(experiment).info.run_id, local) is local
