"""Copying a store's runs to another (`./dev team copy-store`, tools/team/copy_store.py), between
two SQLite stores: the copy compares equal field by field (tools/team/store_compare.py, what
`--verify` runs), a second copy adds nothing, an interrupted copy is redone, the comparison
names what differs, the source is not changed by a byte, and the command's errors name the store.
The same against the team stack's PostgreSQL server: tests/test_copy_store_team.py (slow)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, ViewType

from tests.helpers.small_store import START, make_small_store
from tools.team import cli
from tools.team.copy_store import copy_store
from tools.team.store_compare import store_differences
from tools.team.store_ids import COPIED_FROM, COPY_COMPLETE

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """One store with MLflow's tables and nothing else, copied for each test's destination: the
    tables' migrations take seconds, a file copy none."""
    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory, empty_store) -> tuple[str, dict[str, str], Path]:
    folder = tmp_path_factory.mktemp("source")
    shutil.copy(empty_store, folder / "mlflow.db")
    uri, ids = make_small_store(folder)
    return uri, ids, folder / "mlflow.db"


@pytest.fixture
def dest(tmp_path, empty_store) -> str:
    folder = tmp_path / "dest"
    folder.mkdir()
    shutil.copy(empty_store, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copies(uri: str) -> dict[str, list]:
    """The store's active runs, by the run they were copied from."""
    client = MlflowClient(uri)
    found: dict[str, list] = {}
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000):
        found.setdefault(run.data.tags.get(COPIED_FROM), []).append(run)
    return found


def test_a_copy_compares_equal_and_a_second_copy_adds_nothing(source, dest):
    uri, ids, db = source
    before = sha256(db)
    summary = copy_store(uri, dest, progress=False)
    assert (summary.copied, summary.skipped, summary.replaced) == (4, 0, 0)  # the deleted run is not copied
    assert (summary.params, summary.metric_values, summary.datasets, summary.models) == (151, 49, 2, 1)
    assert summary.artifact_files == 4  # two of the run, MLmodel and the weights of the model
    assert store_differences(uri, dest) == []

    # What the comparison compares, seen here directly for a few fields.
    made = copies(dest)
    assert ids["deleted"] not in made and set(made) == {ids[k] for k in ("embed", "train", "child", "failed")}
    client = MlflowClient(dest)
    train = made[ids["train"]][0]
    assert (train.info.run_name, train.info.start_time, train.info.end_time) == (
        "default",
        START + 20_000,
        START + 40_000,
    )
    assert made[ids["failed"]][0].info.status == "FAILED"
    assert made[ids["child"]][0].data.tags["mlflow.parentRunId"] == train.info.run_id
    assert train.data.tags[COPY_COMPLETE] == "true" and train.info.user_id == "alice"
    history = sorted((m.step, m.value) for m in client.get_metric_history(train.info.run_id, "train/grad_norm"))
    assert [s for s, _ in history] == [0, 1, 2, 3] and str(history[-1][1]) == "nan"
    [model] = client.search_logged_models([train.info.experiment_id])
    assert model.tags[COPIED_FROM] == ids["model"] and model.source_run_id == train.info.run_id
    mlmodel = Path(model.artifact_location.removeprefix("file://")) / "MLmodel"
    assert (
        f"run_id: {train.info.run_id}" in mlmodel.read_text() and f"model_id: {model.model_id}" in mlmodel.read_text()
    )
    view = MlflowClient(uri).get_experiment_by_name("energy-flow").tags
    assert client.get_experiment_by_name("energy-flow").tags == view  # the saved view came along

    again = copy_store(uri, dest, progress=False)
    assert (again.copied, again.skipped, again.metric_values) == (0, 4, 0)
    assert all(len(runs) == 1 for runs in copies(dest).values())
    assert len(client.search_logged_models([train.info.experiment_id])) == 1
    assert store_differences(uri, dest) == []
    assert sha256(db) == before, "copying changed the source store"


def test_the_comparison_names_the_run_and_field_that_differ(source, dest):
    uri, ids, _ = source
    copy_store(uri, dest, progress=False)
    client = MlflowClient(dest)
    train = copies(dest)[ids["train"]][0].info.run_id
    client.log_batch(train, metrics=[Metric("train/loss", 9.0, START + 99_000, 40)])
    client.set_tag(train, "arm", "lr=0.1")
    client.log_text(train, "changed\n", "summary.txt")
    [model] = client.search_logged_models([client.get_experiment_by_name("energy-flow").experiment_id])
    client.set_logged_model_tags(model.model_id, {"flavor": "other"})
    found = "\n".join(store_differences(uri, dest))
    label = f"run {ids['train']} ('default')"
    assert f"{label}: history of metric 'train/loss'" in found
    assert f"{label}: tags: {{'arm': ('lr=0.1', 'lr=0.003')}} (copy, source)" in found
    assert f"{label}: artifacts" in found
    assert f"logged model {ids['model']} ('model') of run {ids['train']}: tags" in found
    assert len(found.splitlines()) == 4, found  # the runs nobody touched compare equal


def test_a_copy_an_interruption_left_partial_is_made_again(source, dest):
    uri, ids, _ = source
    copy_store(uri, dest, progress=False)
    client = MlflowClient(dest)
    partial = copies(dest)[ids["train"]][0].info.run_id
    client.delete_tag(partial, COPY_COMPLETE)  # as if the copy had stopped before its last step
    again = copy_store(uri, dest, progress=False)
    assert (again.copied, again.skipped, again.replaced) == (1, 3, 1)
    assert client.get_run(partial).info.lifecycle_stage == "deleted"
    assert [r.info.run_id != partial for r in copies(dest)[ids["train"]]] == [True]
    deleted = client.search_runs(
        [client.get_experiment_by_name("energy-flow").experiment_id], run_view_type=ViewType.DELETED_ONLY
    )
    assert [r.info.run_id for r in deleted] == [partial]
    assert store_differences(uri, dest) == []


def test_the_command_copies_verifies_and_names_the_store_it_cannot_use(source, dest, tmp_path, capsys):
    uri, _, _ = source
    assert (
        cli.main(["copy-store", "--from", uri, "--to", dest, "--experiment", "energy-flow", "--verify", "--quiet"]) == 0
    )
    err = capsys.readouterr().err
    assert "copied 3 runs from" in err and "verified: the copy of 3 runs compares equal" in err
    assert set(copies(dest)) - {None} == {r.data.tags[COPIED_FROM] for rs in copies(dest).values() for r in rs}

    missing = tmp_path / "nowhere" / "mlflow.db"
    assert cli.main(["copy-store", "--from", f"sqlite:///{missing}", "--to", dest, "--quiet"]) == 1
    assert f"{missing}: no such file; expected the SQLite store" in capsys.readouterr().err
    assert not missing.exists(), "a missing source store was made"

    assert cli.main(["copy-store", "--from", uri, "--to", dest, "--experiment", "nope", "--quiet"]) == 1
    assert "no active experiment named 'nope'; it has 'Default', 'energy-flow', 'energy-flow-embed'" in (
        capsys.readouterr().err
    )

    nobody = tmp_path / "no-team"
    assert cli.main(["copy-store", "--from", uri, "--dir", str(nobody), "--quiet"]) == 1
    assert f"no team stack runs in {nobody} to copy to" in capsys.readouterr().err


def test_a_copy_of_a_copy_is_marked_anew(source, dest, tmp_path, empty_store):
    """Runs moved on from one server to another: each copy names the run it was copied from, and
    the mark of the first copy does not make a partial second copy look whole."""
    uri, ids, _ = source
    copy_store(uri, dest, ["energy-flow-embed"], progress=False)
    third = tmp_path / "third"
    third.mkdir()
    shutil.copy(empty_store, third / "mlflow.db")
    onward = f"sqlite:///{third / 'mlflow.db'}"
    assert copy_store(dest, onward, ["energy-flow-embed"], progress=False).copied == 1
    [middle] = copies(dest)[ids["embed"]]
    [last] = copies(onward)[middle.info.run_id]
    assert last.data.tags[COPY_COMPLETE] == "true"
    assert store_differences(dest, onward, ["energy-flow-embed"]) == []
