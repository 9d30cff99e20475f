"""What one request to the answer model may hold (pipeline/serve/request.py, body_limit.py,
window.py) and ./dev ask's batching and progress, in this process: each limit refused with a
message naming the limit, the request's value and the variable that raises it; the body limit
answered before the app behind it reads a byte; a question longer than the teacher's window is
flagged."""

from __future__ import annotations

import asyncio
import io
import json

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlflow.exceptions import MlflowException

from pipeline.core.errors import ConfigError
from pipeline.serve.body_limit import BodyLimit
from pipeline.serve.request import BODY_VAR, CHARS_VAR, ROWS_VAR, Limits, check_question, questions_of
from tools.ask import batch_size, progress_bar, render

pytestmark = pytest.mark.unit


def frame(*questions) -> pd.DataFrame:
    return pd.DataFrame({"question": list(questions)}, dtype=object)


def refusal(fn, *args) -> str:
    with pytest.raises(MlflowException) as err:
        fn(*args)
    assert err.value.get_http_status_code() == 400
    return err.value.message


def test_too_many_rows_is_refused_before_any_row_is_read():
    limits = Limits(max_rows=3)
    # The rows past the limit are not even strings: the count is checked first.
    msg = refusal(questions_of, frame("a?", "b?", "c?", None), limits)
    assert "the request holds 4 rows, the limit is 3 per request" in msg and ROWS_VAR in msg
    assert questions_of(frame("a?", "b?", "c?"), limits) == ["a?", "b?", "c?"]


def test_too_long_a_question_names_its_row_length_limit_and_variable():
    limits = Limits(max_question_chars=10)
    msg = refusal(questions_of, frame("short?", "x" * 11), limits, 256)
    assert "row 1 of column 'question' is too long: 11 characters, the limit is 10 per question" in msg
    assert "the teacher reads only its first 256 tokens" in msg and CHARS_VAR in msg
    assert questions_of(frame("x" * 10), limits) == ["x" * 10]


def test_the_defaults_refuse_the_requests_that_ran_away():
    msg = refusal(questions_of, frame(*["Where is Kabul?"] * 100_000))
    assert "100000 rows, the limit is 256" in msg
    msg = refusal(questions_of, frame("Where " * 20_000 + "is Kabul?"))
    assert "too long: 120009 characters, the limit is 8192" in msg


def test_limits_come_from_the_environment_and_a_bad_value_names_its_variable():
    env = {ROWS_VAR: "1000", CHARS_VAR: "100", BODY_VAR: "1_000_000"}
    assert Limits.from_env(env) == Limits(max_rows=1000, max_question_chars=100, max_body_bytes=1_000_000)
    assert Limits.from_env({}) == Limits()
    for bad in ("0", "-5", "many", "1.5"):
        with pytest.raises(ConfigError, match=f"{ROWS_VAR}='{bad}': expected an integer >= 1 \\(default 256\\)"):
            Limits.from_env({ROWS_VAR: bad})


@given(st.text(max_size=40))
def test_any_text_is_either_a_question_or_refused_with_a_400(text):
    limits = Limits(max_question_chars=20)
    try:
        assert check_question(text, "question 1", limits) == text
    except MlflowException as e:
        assert e.get_http_status_code() == 400 and e.message.startswith("question 1 is ")
        assert (not text.strip()) or len(text) > 20


# The body limit, driven as uvicorn drives an ASGI app: receive() hands the body in chunks.


def call(app, body: bytes, chunk: int = 1000, headers: dict | None = None):
    """(status, JSON body, bytes the client sent that were read) of one POST through `app`."""
    sent = {"read": 0}
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]

    async def receive():
        if sent["read"] < len(parts):
            part = parts[sent["read"]]
            sent["read"] += 1
            return {"type": "http.request", "body": part, "more_body": sent["read"] < len(parts)}
        return {"type": "http.disconnect"}

    out = {}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        else:
            out["body"] = out.get("body", b"") + message.get("body", b"")

    hdrs = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": hdrs}
    asyncio.run(app(scope, receive, send))
    return out["status"], json.loads(out["body"]), sum(len(p) for p in parts[: sent["read"]])


class Echo:
    """The app behind the limit: answers 200 with the size of the body it read, whole."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"read": len(body)}).encode()})


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_gets_413_naming_the_limit_and_never_reaches_the_app(declared):
    app = Echo()
    limited = BodyLimit(app, max_bytes=5000)
    body = b"x" * 12_345
    status, answer, read = call(limited, body, headers={"content-length": len(body)} if declared else None)
    assert status == 413 and app.calls == 0 and answer["error_code"] == "INVALID_PARAMETER_VALUE"
    size = "12345 bytes" if declared else "12345 bytes"
    assert f"request body too large: {size}, the limit is 5000 bytes per request" in answer["message"]
    assert BODY_VAR in answer["message"] and "--max-body-bytes" in answer["message"]
    assert read == len(body)  # drained, so a client that sends it all still reads the answer


def test_a_client_that_waits_for_100_continue_is_answered_before_it_sends_the_body():
    app = Echo()
    body = b"x" * 12_345
    status, answer, read = call(
        BodyLimit(app, 5000), body, headers={"content-length": len(body), "expect": "100-continue"}
    )
    assert status == 413 and read == 0 and app.calls == 0


@pytest.mark.parametrize("size", [0, 1, 4999, 5000])
def test_a_body_within_the_limit_reaches_the_app_whole(size):
    app = Echo()
    status, answer, _ = call(BodyLimit(app, 5000), b"y" * size, chunk=333, headers={"content-length": size})
    assert status == 200 and answer == {"read": size} and app.calls == 1


def test_mlflows_bare_504_is_given_a_message_naming_the_timeout_setting():
    async def slow(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 504, "headers": []})
        await send({"type": "http.response.body", "body": b"Request processing time exceeded limit"})

    status, answer, _ = call(BodyLimit(slow, 5000, timeout_s=60), b"{}")
    assert status == 504 and "longer than the server's request timeout (60 s)" in answer["message"]
    assert "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT" in answer["message"] and ROWS_VAR in answer["message"]


# ./dev ask's batches, progress and its note on a truncated question.


def test_ask_batches_are_whole_train_batches_within_the_row_limit():
    assert batch_size(32, 256) == 256 and batch_size(48, 256) == 240 and batch_size(300, 256) == 256
    assert batch_size(0, 256) == 256  # a model that does not record it


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_when_there_is_more_than_one_batch():
    for stream, total, shown in ((Terminal(), 1000, True), (Terminal(), 100, False), (io.StringIO(), 1000, False)):
        with progress_bar(total, 256, stream) as bar:
            bar.update(256)
        assert ("256/1000" in stream.getvalue()) is shown, stream.getvalue()


def test_ask_says_which_question_the_teacher_read_only_in_part():
    text = render(["short?", "long?"], [["a"], ["b"]], [[0.9], [0.8]], [False, True], 256, confident=[True, True])
    assert text.splitlines() == [
        "Q: short?",
        "  1. 0.900  a",
        "",
        "Q: long?",
        "  (truncated: the teacher read only its first 256 tokens of it)",
        "  1. 0.800  b",
    ]


def test_truncated_flags_exactly_the_questions_longer_than_the_teachers_window():
    from pipeline.embed.teacher import load_teacher, truncated

    teacher = load_teacher("bundled")
    w = teacher.max_seq_length
    ids = lambda text: len(teacher.tokenizer(text)["input_ids"])  # noqa: E731 (special tokens included)
    fits = " ".join(["word"] * (w - 2))
    over = fits + " word"
    assert (ids(fits), ids(over)) == (w, w + 1)
    assert truncated(teacher, ["What is the capital of France?", fits, over]).tolist() == [False, False, True]
    assert truncated(teacher, []).tolist() == []


def test_a_refusal_is_not_buried_under_mlflows_echo_of_the_whole_request():
    refusal_text = "row 0 of column 'question' is too long: 9000 characters"

    async def refuses(scope, receive, send):
        await receive()
        echo = {
            "error_code": "INVALID_PARAMETER_VALUE",
            "message": f"Failed to predict data '{'x' * 9000}'. \nError: {refusal_text}",
        }
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"99999")]})
        await send({"type": "http.response.body", "body": json.dumps(echo).encode()})

    status, answer, _ = call(BodyLimit(refuses, 50_000), b"{}")
    assert status == 400 and answer == {"error_code": "INVALID_PARAMETER_VALUE", "message": refusal_text}


def test_malformed_json_is_answered_without_the_body_echoed():
    async def refuses(scope, receive, send):
        await receive()
        message = (
            "Invalid input. Ensure that input is a valid JSON formatted string. Error: 'x'\nInput: \nb'" + "z" * 9000
        )
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"message": message}).encode()})

    status, answer, _ = call(BodyLimit(refuses, 50_000), b"{")
    assert status == 400 and answer == {
        "message": "Invalid input. Ensure that input is a valid JSON formatted string. Error: 'x'"
    }


def test_json_nested_deeper_than_any_request_is_refused_with_400_before_the_app_parses_it():
    app = Echo()
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # MLflow's parser: RecursionError, 500
    status, answer, _ = call(BodyLimit(app, 10**7), deep, headers={"content-type": "application/json"})
    assert status == 400 and app.calls == 0, answer
    assert "nests JSON more than 32 levels deep" in answer["message"] and "dataframe_records" in answer["message"]
    # What the answer model takes passes, brackets inside its strings included.
    fine = json.dumps({"dataframe_split": {"columns": ["question"], "data": [["[" * 500 + ' "{"']]}}).encode()
    status, answer, _ = call(BodyLimit(app, 10**7), fine, headers={"content-type": "application/json"})
    assert status == 200 and app.calls == 1 and answer["read"] == len(fine)
    # A CSV body is not JSON: its brackets are text.
    status, _, _ = call(BodyLimit(app, 10**7), b"question\n" + b"[" * 100 + b"\n", headers={"content-type": "text/csv"})
    assert status == 200 and app.calls == 2
