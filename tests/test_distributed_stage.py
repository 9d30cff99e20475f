"""`dvc exp run -S train.nproc=2` launches the train stage on 2 processes under torchrun (gloo):
the whole smoke pipeline completes, rank 0 alone prints, writes and logs, and the MLflow run says
how it was trained. Marked slow (the whole smoke pipeline through DVC, ~40 s): `./dev test -m slow`,
which CI runs too. The default suite launches 2 ranks through torchrun in test_distributed_train.py
and through the stage's own launcher in test_distributed_embed.py."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.verdicts import assert_clean_report
from tools.fault_matrix import clean_env, project_copy

from .conftest import dvc, sh

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def ddp_experiment(tmp_path_factory):
    root = project_copy(tmp_path_factory.mktemp("ddp-project"))
    out = sh(dvc("exp", "run", "-n", "smoke-ddp", "-S", "preset=smoke", "-S", "train.nproc=2"), root, clean_env())
    return root, out


def test_dvc_launches_two_ranks_and_the_pipeline_completes(ddp_experiment):
    root, out = ddp_experiment
    assert "[train] 2 processes under torchrun" in out
    train = json.loads((root / "metrics/train.json").read_text())
    assert train["train/processes"] == 2 and train["train/effective_batch"] == 64
    # 480 train rows / 64 a step = 7 steps an epoch, 2 epochs
    assert train["train/steps"] == 14 and train["train/skipped_steps"] == 0
    assert json.loads((root / "metrics/eval.json").read_text())["eval/test/model/cosine"] > 0
    assert_clean_report(json.loads((root / "metrics/stability.json").read_text()))


def test_each_epoch_summary_is_printed_once_and_rank_1_is_quiet(ddp_experiment):
    _, out = ddp_experiment
    for epoch in (1, 2):
        assert out.count(f"] epoch {epoch}/2 ") == 1, out[-4000:]
    assert out.count("[train] trained 14 steps") == 1
    assert "[train rank 1]" not in out  # no warnings in a clean run, and nothing else from rank 1


def test_one_mlflow_run_records_the_processes_and_the_backend(ddp_experiment):
    root, _ = ddp_experiment
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.stage = 'train'")
    [run] = runs
    assert run.info.run_name == "smoke-ddp" and run.info.status == "FINISHED"
    assert run.data.params["train.nproc"] == "2" and run.data.params["train.processes"] == "2"
    assert run.data.params["train.effective_batch"] == "64"
    assert run.data.tags["distributed.backend"] == "gloo" and run.data.tags["train.processes"] == "2"
    # A row every 2 steps and the run's summary at the last step, from rank 0 alone: no copies.
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "curves/loss"))
    assert steps == [2, 4, 6, 8, 10, 12, 14, 14]
