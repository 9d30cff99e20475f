"""The project's server (./dev serve: tools/serve.py) under a bounded load on loopback: 200
requests, 8 at a time, good and bad mixed (a body over the limit, too many rows, too long a
question, malformed JSON, the wrong columns, an empty body). Each bad one gets its 4xx with the
message that names its limit or fault, each good one 200 with answers, and the one server process
answers to the end (no death, no restart). Latency p50/p99 are printed, not asserted. Small limits
keep the bad requests cheap; they are the same code paths as the defaults."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.model_server import post, project_server
from tests.helpers.answer_model import AnswerProject

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMITS = {"max_body_bytes": 20_000, "max_rows": 8, "max_question_chars": 2_000}
REQUESTS, CONCURRENCY = 200, 8
QUESTIONS = ["What is the capital of France?", "Which currency does Japan use?", "Where is Kabul?", "Peru's capital?"]
LONG = "Where is Kabul? " + "word " * 300  # within the length limit, past the teacher's 256 tokens


def split(questions: list[str], k: int = 3) -> bytes:
    return json.dumps(
        {"dataframe_split": {"columns": ["question"], "data": [[q] for q in questions]}, "params": {"k": k}}
    ).encode()


# kind -> (body, expected status, a part of the expected message)
CASES = {
    "good": (split(QUESTIONS[:2]), 200, None),
    "good-truncated": (split([QUESTIONS[2], LONG]), 200, None),
    "oversize-body": (split(["x" * 1_000] * 30), 413, "request body too large: 30"),
    "too-many-rows": (split(QUESTIONS * 3), 400, "the request holds 12 rows, the limit is 8 per request"),
    "long-question": (split(["y" * 2_500]), 400, "is too long: 2500 characters, the limit is 2000 per question"),
    "malformed-json": (b'{"dataframe_split": {"columns": ["question"], "data": [["Where', 400, "valid JSON"),
    "wrong-columns": (
        json.dumps({"dataframe_records": [{"query": "Where is Kabul?"}]}).encode(),
        400,
        "missing inputs ['question']",
    ),
    "empty-body": (b"", 400, "valid JSON"),
}
VARIABLES = {
    "oversize-body": "ENERGY_FLOW_SERVE_MAX_BODY_BYTES",
    "too-many-rows": "ENERGY_FLOW_SERVE_MAX_ROWS",
    "long-question": "ENERGY_FLOW_SERVE_MAX_QUESTION_CHARS",
}


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


def test_200_mixed_requests_8_at_a_time_each_answered_as_it_should_and_the_server_lives(project):
    kinds = [*CASES] * (REQUESTS // len(CASES))
    random.Random(0).shuffle(kinds)
    with project_server(project.run_uri, project.tracking_uri, LIMITS) as (base_url, server):

        def one(kind: str):
            t0 = time.perf_counter()
            status, body = post(base_url, CASES[kind][0])
            return kind, status, body, time.perf_counter() - t0

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            results = list(pool.map(one, kinds))
        alive = server.poll() is None and post(base_url, CASES["good"][0])[0] == 200
    wrong = []
    for kind, status, body, _ in results:
        expected_status, message = CASES[kind][1:]
        if status != expected_status:
            wrong.append(f"{kind}: HTTP {status} {str(body)[:300]}")
        elif expected_status == 200:
            rows = body["predictions"]
            if [len(r["answers"]) for r in rows] != [3, 3] or [r["truncated"] for r in rows] != [
                False,
                kind == "good-truncated",
            ]:
                wrong.append(f"{kind}: {str(body)[:300]}")
        elif message not in body.get("message", "") or (kind in VARIABLES and VARIABLES[kind] not in body["message"]):
            wrong.append(f"{kind}: {body.get('message', body)!s:.300}")
        elif "Failed to predict data" in body["message"]:  # the refusal alone, not the request echoed
            wrong.append(f"{kind}: the request is echoed: {body['message'][:300]}")
    assert not wrong, f"{len(wrong)} of {REQUESTS} answered wrongly:\n" + "\n".join(wrong[:20])
    assert alive, "the server died or stopped answering under the load"
    latency = {}
    for group, keep in (("all", lambda k: True), ("good", lambda k: k.startswith("good"))):
        ms = np.array([s for k, _, _, s in results if keep(k)]) * 1000
        latency[group] = {
            "count": len(ms),
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
        }
    print(f"\n[load] {REQUESTS} requests, {CONCURRENCY} at a time, 0 server deaths: {json.dumps(latency)}")
