"""The answer model behind the real REST server: `mlflow models serve -m runs:/<id>/<model name>
--env-manager local` on 127.0.0.1 and a free port (bench/model_server.py; its process group is
always ended). It answers /invocations in both DataFrame layouts with what the model answers in
process, and a request it cannot answer gets a 4xx whose message says what was expected."""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest

from bench.model_server import invoke, model_server, questions_payload
from tests.helpers.answer_model import AnswerProject

pytestmark = pytest.mark.integration

QUESTIONS = ["What is the capital of France?", "Which currency does Japan use?", "Where is Kabul?"]


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


@pytest.fixture(scope="module")
def server(project):
    with model_server(project.run_uri, project.tracking_uri) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def in_process(project):
    """The same questions answered by the model loaded in this process (the reference)."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(project.tracking_uri):
        model = mlflow.pyfunc.load_model(project.run_uri)
    return model.predict(pd.DataFrame({"question": QUESTIONS}), params={"k": 3})


def test_dataframe_split_and_records_get_the_models_answers(server, in_process):
    status, body = invoke(server, questions_payload(QUESTIONS, k=3))
    assert status == 200, body
    rows = body["predictions"]
    assert [r["answers"] for r in rows] == list(in_process["answers"])
    assert [r["confident"] for r in rows] == in_process["confident"].tolist() == [True] * len(rows)
    for r, scores in zip(rows, in_process["scores"]):
        assert r["scores"] == pytest.approx(scores, abs=1e-6) and r["scores"] == sorted(r["scores"], reverse=True)
    status, body = invoke(server, {"dataframe_records": [{"question": q} for q in QUESTIONS], "params": {"k": 3}})
    assert status == 200 and [r["answers"] for r in body["predictions"]] == list(in_process["answers"])
    status, body = invoke(server, {"dataframe_records": [{"question": QUESTIONS[0]}]})  # k: the default, 5
    assert status == 200 and len(body["predictions"][0]["answers"]) == 5


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"dataframe_records": [{"query": "Where is Kabul?"}]}, "missing inputs ['question']"),
        ({"dataframe_records": [{"question": "Where is Kabul?"}, {"question": " "}]}, "row 1 of column 'question'"),
        (questions_payload(["Where is Kabul?"], k=0), "param k = 0; expected an integer >= 1"),
    ],
    ids=["no-question-column", "blank-question", "k-zero"],
)
def test_a_request_it_cannot_answer_gets_a_4xx_saying_what_was_expected(server, payload, message):
    status, body = invoke(server, payload)
    assert 400 <= status < 500 and body["error_code"] == "INVALID_PARAMETER_VALUE", body
    assert message in body["message"], body["message"]
