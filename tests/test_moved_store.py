"""A checkout moves: copied with `cp -a`, moved, or pointed at another tracking store (the team
server). Its mlflow.db then names the old folder's artifacts, and its runs/*.json name runs of
the old store. A copied store is pointed at its own mlruns/ (the original is untouched); a run file
of another store finds the run there by id (a copy of the whole store), as a copy made by
`./dev team copy-store` (its tag), or by its output's digest, and otherwise stops with one
message saying what to run."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from pipeline.core.errors import PipelineError
from pipeline.tracking import store as tracking
from pipeline.tracking.relocate import relocate
from tests.helpers.small_store import make_small_store

pytestmark = pytest.mark.unit


def locations(db) -> list[str]:
    """Every artifact location of the store's own experiments (not MLflow's Default experiment,
    which it places under the directory it was started in)."""
    with sqlite3.connect(db) as con:
        return [
            *(r[0] for r in con.execute("SELECT artifact_location FROM experiments WHERE experiment_id != 0")),
            *(r[0] for r in con.execute("SELECT artifact_uri FROM runs")),
            *(r[0] for r in con.execute("SELECT artifact_location FROM logged_models")),
        ]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    folder = tmp_path_factory.mktemp("alice") / "checkout"
    uri, ids = make_small_store(folder)
    return folder, ids


def use(monkeypatch, folder, runs=None):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "RUNS_DIR", runs or folder / "runs")
    tracking._open_sqlite_store.cache_clear()


def test_a_copied_store_reads_and_writes_its_own_artifacts_and_leaves_the_original_alone(
    original, tmp_path, monkeypatch
):
    from mlflow import MlflowClient

    folder, ids = original
    before = locations(folder / "mlflow.db")
    assert all(str(folder / "mlruns") in loc for loc in before)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, symlinks=True)
    use(monkeypatch, copy)
    tracking.use_store()
    after = locations(copy / "mlflow.db")
    assert len(after) == len(before) and all(str(copy / "mlruns") in loc for loc in after), after
    assert not any(str(folder) + "/" in loc for loc in after)
    assert locations(folder / "mlflow.db") == before  # the original still names its own
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    listed = client.list_artifacts(ids["train"])
    assert listed, "the copy's run lists its artifacts from the copy's mlruns/"
    run = client.create_run(client.get_run(ids["train"]).info.experiment_id)
    assert run.info.artifact_uri.startswith((copy / "mlruns").as_uri())
    # Opened again: nothing more to rewrite.
    assert relocate(copy / "mlflow.db") == 0


def test_a_store_whose_artifacts_stayed_behind_on_purpose_is_left_as_it_is(original, tmp_path):
    folder, _ = original
    elsewhere = tmp_path / "db-only"
    elsewhere.mkdir()
    shutil.copy2(folder / "mlflow.db", elsewhere / "mlflow.db")  # no mlruns/ beside it: the old one is used
    relocate(elsewhere / "mlflow.db")
    # (MLflow's Default experiment is left out: it names the mlruns/ of the directory the store was
    # made in, the test's working directory, which may never have existed, and then it is rewritten.)
    assert locations(elsewhere / "mlflow.db") == locations(folder / "mlflow.db")


def write_train_pointer(run_id: str) -> None:
    tracking.write_run_file("train", {"run_id": run_id, "experiment_id": "1", "tracking_uri": tracking.tracking_uri()})


def test_a_run_file_of_another_store_finds_the_run_its_copy_or_stops_saying_what_to_run(
    original, tmp_path, monkeypatch
):
    from mlflow import MlflowClient

    from pipeline.tracking.store import COPIED_FROM

    folder, ids = original
    runs = tmp_path / "runs"
    use(monkeypatch, folder, runs)
    write_train_pointer(ids["train"])
    written = json.loads((runs / "train.json").read_text())
    assert written["store"] == f"sqlite:///{folder / 'mlflow.db'}"
    assert tracking.read_run_file("train")["run_id"] == ids["train"]

    # The team server (another store) with nothing of it: one message, the commands to run.
    server = tmp_path / "server"
    use(monkeypatch, server, runs)
    with pytest.raises(PipelineError) as e:
        tracking.read_run_file("train")
    said = str(e.value)
    assert ids["train"] in said and "./dev team copy-store" in said and "dvc repro -f train" in said, said
    assert tracking.read_run_file("train", required=False) == {}

    # After the copy: its copy, found by the tag the copy carries.
    client = MlflowClient(f"sqlite:///{server / 'mlflow.db'}")
    experiment = client.create_experiment("energy-flow", artifact_location=(server / "mlruns").as_uri())
    copied = client.create_run(experiment, tags={COPIED_FROM: ids["train"]}).info.run_id
    found = tracking.read_run_file("train")
    assert found["run_id"] == copied and found["store"] == tracking.store_key()

    # A store copied whole (same run ids): the run itself.
    whole = tmp_path / "whole"
    shutil.copytree(folder, whole, symlinks=True)
    use(monkeypatch, whole, runs)
    assert tracking.read_run_file("train")["run_id"] == ids["train"]


def test_the_project_store_is_the_same_store_wherever_the_checkout_is(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    here = tracking.store_key()
    assert here == tracking.PROJECT_STORE
    # A file written in the old folder (by a version before `store`): its absolute mlflow.db
    # path is another store; one written with `store` is the project's wherever it is read.
    assert tracking.recorded_store({"tracking_uri": "sqlite:////elsewhere/mlflow.db"}) != here
    assert tracking.recorded_store({"tracking_uri": "sqlite:////elsewhere/mlflow.db", "store": "project"}) == here
    assert tracking.recorded_store({"tracking_uri": tracking.project_store_uri()}) == here
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    tracking.write_run_file("train", {"run_id": "r1", "tracking_uri": tracking.tracking_uri()})
    assert json.loads((tmp_path / "runs" / "train.json").read_text())["store"] == "project"
