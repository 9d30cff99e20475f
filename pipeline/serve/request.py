"""What a request to the answer model must hold, its limits, its signature and its errors.

An input the model cannot answer is refused with a message naming the column or row and what was
expected, as MlflowException(INVALID_PARAMETER_VALUE), which the REST server returns as HTTP 400
(a plain exception would be a 500: the server's fault). The limits (Limits; docs/serving.md,
"What a request may hold") each have an environment variable that raises them, read where the
model is loaded, and a refusal names that variable, the limit and the request's value."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from pipeline.core.errors import ConfigError

QUESTION = "question"  # the input column
ANSWERS, SCORES, CONFIDENT, TRUNCATED = "answers", "scores", "confident", "truncated"  # the output columns
DEFAULT_K = 5  # answers per question when the request does not say

ROWS_VAR = "ENERGY_FLOW_SERVE_MAX_ROWS"
CHARS_VAR = "ENERGY_FLOW_SERVE_MAX_QUESTION_CHARS"
BODY_VAR = "ENERGY_FLOW_SERVE_MAX_BODY_BYTES"
WHERE = "(the environment of the server, or of ./dev ask)"  # where the variables are read


@dataclass(frozen=True)
class Limits:
    """What one request may hold. The served model reads no params.yaml (it loads without the
    repository), so its defaults live here and the environment raises them."""

    # Questions per request: a request this long at the teacher's full window is answered well
    # inside the scoring server's request timeout on one core; more is a client's loop to make.
    max_rows: int = 256
    # Characters per question: the teacher reads only its first max_seq_length tokens (256 for
    # the bundled one, about a thousand characters of prose); this leaves room for a teacher
    # with a longer window while bounding the tokenizer's work on text it would never read.
    max_question_chars: int = 8192
    # Request body: the largest request the two limits above admit, with JSON's escapes, fits.
    max_body_bytes: int = 16 * 1024 * 1024

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Limits":
        """The defaults, each raised (or lowered) by its environment variable, an integer >= 1."""
        environ = os.environ if environ is None else environ
        values = {}
        for field, var in (("max_rows", ROWS_VAR), ("max_question_chars", CHARS_VAR), ("max_body_bytes", BODY_VAR)):
            raw = environ.get(var, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value < 1:
                raise ConfigError(f"{var}={raw!r}: expected an integer >= 1 (default {getattr(cls, field)})")
            values[field] = value
        return cls(**values)


def bad_input(message: str):
    """The MlflowException a refused request raises. MLflow is imported here, not at the top: ./dev
    ask loads a local model without it (importing it takes seconds), and only a refusal needs it."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def check_rows(n: int, limits: Limits) -> None:
    if n > limits.max_rows:
        raise bad_input(
            f"too many questions: the request holds {n} rows, the limit is {limits.max_rows} per request; "
            f"send them in several requests, or raise the limit with {ROWS_VAR} {WHERE}"
        )


def check_question(q, where: str, limits: Limits, window: int | None = None) -> str:
    """`q` if it is a non-empty string within the length limit, else an error naming `where`
    (e.g. "row 3 of column 'question'"). `window`: the teacher's max_seq_length, for the message."""
    if not isinstance(q, str):
        raise bad_input(f"{where} is {q!r} ({type(q).__name__}); expected a non-empty string")
    if not q.strip():
        raise bad_input(f"{where} is empty ({q!r}); expected a question, a non-empty string")
    if len(q) > limits.max_question_chars:
        reads = f" (the teacher reads only its first {window} tokens)" if window else ""
        raise bad_input(
            f"{where} is too long: {len(q)} characters, the limit is {limits.max_question_chars} per "
            f"question{reads}; shorten it, or raise the limit with {CHARS_VAR} {WHERE}"
        )
    return q


def questions_of(model_input, limits: Limits | None = None, window: int | None = None) -> list[str]:
    """The `question` column as a list of non-empty strings within `limits` (the defaults when
    None), or an error naming the row or the limit. The row count is checked first: nothing of a
    request over the limit is looked at."""
    limits = limits or Limits()
    if not isinstance(model_input, pd.DataFrame):
        raise bad_input(
            f"expected a table (pandas DataFrame) with a {QUESTION!r} column of strings, "
            f"got {type(model_input).__name__}"
        )
    if QUESTION not in model_input.columns:
        raise bad_input(
            f"the input has no {QUESTION!r} column (its columns: {[str(c) for c in model_input.columns]}); "
            f"expected one row per question in a column named {QUESTION!r}"
        )
    check_rows(len(model_input), limits)
    return [
        check_question(q, f"row {i} of column {QUESTION!r}", limits, window)
        for i, q in enumerate(model_input[QUESTION].tolist())
    ]


def top_k(params: dict | None, bank_size: int) -> int:
    """The param k, checked; more than the bank holds (`bank_size`: its distinct facts) gives the
    whole bank, ranked."""
    k = (params or {}).get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise bad_input(f"param k = {k!r}; expected an integer >= 1 (answers per question)")
    return min(int(k), bank_size)


def signature():
    """Input: a `question` string per row. Outputs: `answers` (k strings, k distinct facts) and
    `scores` (k cosines), best first, `confident` (the top answer passes the confidence rule
    calibrated on val; null for a model logged without one) and `truncated` (the teacher read
    only the question's first max_seq_length tokens). Param: k (answers per question, default
    DEFAULT_K)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Array

    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string, QUESTION)]),
        outputs=Schema(
            [
                ColSpec(Array(DataType.string), ANSWERS),
                ColSpec(Array(DataType.double), SCORES),
                ColSpec(DataType.boolean, CONFIDENT, required=False),  # null: the model has no rule
                ColSpec(DataType.boolean, TRUNCATED),
            ]
        ),
        params=ParamSchema([ParamSpec("k", DataType.long, DEFAULT_K)]),
    )
