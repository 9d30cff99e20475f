"""What a request to the answer model must hold, its signature and its errors.

An input the model cannot answer is refused with a message naming the column or row and what was
expected. The errors are MlflowException(INVALID_PARAMETER_VALUE), which the REST server returns
as HTTP 400 with the message (a plain exception would be a 500: the server's fault)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

QUESTION = "question"  # the input column
ANSWERS, SCORES = "answers", "scores"  # the output columns
DEFAULT_K = 5  # answers per question when the request does not say


def bad_input(message: str) -> MlflowException:
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def questions_of(model_input) -> list[str]:
    """The `question` column as a list of non-empty strings, or an error naming the row."""
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
    out = []
    for i, q in enumerate(model_input[QUESTION].tolist()):
        if not isinstance(q, str):
            got = f"{q!r} ({type(q).__name__})"
            raise bad_input(f"row {i} of column {QUESTION!r} is {got}; expected a non-empty string")
        if not q.strip():
            raise bad_input(f"row {i} of column {QUESTION!r} is empty ({q!r}); expected a question, a non-empty string")
        out.append(q)
    return out


def top_k(params: dict | None, bank_size: int) -> int:
    """The param k, checked; more than the bank holds gives the whole bank, ranked."""
    k = (params or {}).get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise bad_input(f"param k = {k!r}; expected an integer >= 1 (answers per question)")
    return min(int(k), bank_size)


def signature():
    """Input: a `question` string per row. Outputs: `answers` (k strings) and `scores` (k cosines),
    best first. Param: k (answers per question, default DEFAULT_K)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Array

    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string, QUESTION)]),
        outputs=Schema([ColSpec(Array(DataType.string), ANSWERS), ColSpec(Array(DataType.double), SCORES)]),
        params=ParamSchema([ParamSpec("k", DataType.long, DEFAULT_K)]),
    )
