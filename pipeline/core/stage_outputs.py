"""Reading the files an earlier stage wrote (metrics, telemetry, the run file): one that is
missing or damaged (edited by hand, cut short by a full disk, a merge conflict) is named, with the
stage that writes it and how to write it again, instead of a JSON or CSV parser's traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.paths import check_readable_inside


def _again(stage: str) -> str:
    return f"it is written by the {stage} stage: run it again (dvc repro {stage})"


def read_json(path: str | Path, stage: str, expect: type = dict) -> Any:
    path = check_readable_inside(path, f"the {stage} stage's output")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(f"{path} not found; {_again(stage)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path}: cannot be read ({e}); {_again(stage)}") from None
    except json.JSONDecodeError as e:
        raise PipelineError(
            f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); {_again(stage)}"
        ) from None
    if not isinstance(value, expect):
        wanted = "an object" if expect is dict else f"a {expect.__name__}"
        raise PipelineError(f"{path}: holds a JSON {type(value).__name__}, expected {wanted}; {_again(stage)}")
    return value


def read_csv(path: str | Path, stage: str, required: tuple[str, ...] = ()):
    import pandas as pd

    path = check_readable_inside(path, f"the {stage} stage's output")
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise PipelineError(f"{path} not found; {_again(stage)}") from None
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(f"{path}: not a readable CSV table ({first}); {_again(stage)}") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise PipelineError(f"{path}: lacks the column(s) {missing}; {_again(stage)}")
    return frame
