"""An ASGI wrapper that bounds a request's body before the app behind it reads it.

MLflow's scoring server reads the whole body into memory, parses it and only then calls the
model. BodyLimit sits in front of it: a body over `max_bytes` (by its Content-Length, or counted as
it arrives) is answered with HTTP 413 and a JSON message in MLflow's error shape naming the limit,
the body's size and how to raise it (docs/serving.md, "What a request may hold"); a body within
the limit is handed to the app whole. The oversized body is read and dropped (constant memory)
before the answer, so that a client that sends its whole body before reading the answer gets the
413 rather than a reset connection; one that asked `Expect: 100-continue` is answered at once.

It also gives MLflow's bare 504 on a request timeout a message naming the setting, and cuts
MLflow's echo of the whole request from a 400's message ("Failed to predict data '<every row>'.
Error: ...", "Input: <the body>"): the answer to a large bad request is what was wrong, not the request."""

from __future__ import annotations

import json
import re

from pipeline.serve.request import BODY_VAR, ROWS_VAR

TIMEOUT_VAR = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"
# Matched by text: what reaches this middleware is MLflow's HTTP answer, a JSON body whose only
# fields are error_code (shared by every kind of bad input) and the message.
ECHO_START, ECHO_END = "Failed to predict data '", "'. \nError: "  # MLflow's prefix to a model's refusal
INPUT_ECHO = "\nInput: "  # what MLflow appends to "not valid JSON": the whole body


def too_large_message(size: int | None, limit: int) -> str:
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return (
        f"request body too large: {got}, the limit is {limit} bytes per request; send fewer or shorter "
        f"questions per request, or raise the limit with {BODY_VAR} (./dev serve --max-body-bytes)"
    )


def timeout_message(timeout_s: float | None) -> str:
    after = f" ({timeout_s:g} s)" if timeout_s else ""
    return (
        f"the request took longer than the server's request timeout{after}: send fewer questions per "
        f"request (the limit is {ROWS_VAR}), or raise {TIMEOUT_VAR} where the model is served"
    )


# JSON nested deeper than this is refused before MLflow parses it: its parser gives up on a body
# nested a few thousand levels deep with a RecursionError, which its server answers as a bare
# HTTP 500. A request the answer model takes nests 3 levels ({"dataframe_split": {"data": [[..]]}}).
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text `body` nests arrays and objects more than `limit` levels deep
    (brackets inside strings do not count). Only the brackets are visited, so a large body of
    flat rows costs about as much as reading it."""
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
        if m.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def too_deep_message() -> str:
    return (
        f"request body nests JSON more than {MAX_JSON_DEPTH} levels deep; expected the questions as "
        '{"dataframe_records": [{"question": "..."}]} or {"dataframe_split": {"columns": ["question"], '
        '"data": [["..."]]}} (docs/serving.md)'
    )


async def _answer(send, status: int, message: str) -> None:
    body = json.dumps({"error_code": "INVALID_PARAMETER_VALUE", "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyLimit:
    """ASGI middleware: `app` sees only requests whose body is at most `max_bytes` bytes."""

    def __init__(self, app, max_bytes: int, timeout_s: float | None = None):
        if max_bytes < 1:
            raise ValueError(f"max_bytes = {max_bytes}; expected >= 1")
        self.app, self.max_bytes, self.timeout_s = app, int(max_bytes), timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = _content_length(headers.get(b"content-length"))
        if declared is not None and declared > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":
                await _drain(receive)
            return await _answer(send, 413, too_large_message(declared, self.max_bytes))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client went away: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                chunks.clear()
                more = message.get("more_body", False)
                size += await _drain(receive) if more else 0
                return await _answer(send, 413, too_large_message(size, self.max_bytes))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, handed = b"".join(chunks), False
        if b"json" in headers.get(b"content-type", b"").lower() and too_deep(body):
            return await _answer(send, 400, too_deep_message())

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, self._explained(send))

    def _explained(self, send):
        """`send`, with MLflow's bare 504 replaced by a message naming the timeout setting and a
        400's echo of the request cut from its message."""
        state = {"status": None, "body": []}

        async def wrapped(message):
            if message["type"] == "http.response.start" and message["status"] in (400, 504):
                state["status"], state["start"] = message["status"], message
                return None
            if state["status"] is None or message["type"] != "http.response.body":
                return await send(message)
            state["body"].append(message.get("body", b""))
            if message.get("more_body", False):
                return None
            if state["status"] == 504:
                return await _answer(send, 504, timeout_message(self.timeout_s))
            body = _without_echo(b"".join(state["body"]))
            headers = [(k, v) for k, v in state["start"].get("headers", []) if k.lower() != b"content-length"]
            await send({**state["start"], "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        return wrapped


def _without_echo(body: bytes) -> bytes:
    """A JSON error body whose message is MLflow's echo of the data then the model's refusal:
    the refusal alone. Any other body as it was."""
    try:
        error = json.loads(body)
        message = error["message"]
    except (ValueError, TypeError, KeyError):
        return body
    if not isinstance(message, str):
        return body
    if message.startswith(ECHO_START) and ECHO_END in message:
        message = message[message.rindex(ECHO_END) + len(ECHO_END) :]
    elif "valid JSON" in message and INPUT_ECHO in message:
        message = message[: message.index(INPUT_ECHO)]
    else:
        return body
    return json.dumps({**error, "message": message}).encode()


def _content_length(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None  # counted as it arrives instead


async def _drain(receive) -> int:
    """Read and drop the rest of a request's body; the bytes dropped."""
    dropped = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return dropped
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return dropped
