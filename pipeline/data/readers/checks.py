"""The checks every format's rows go through (texts, ids, groups) and the frame they become, so a
bad row is reported the same way whatever the file format."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from pipeline.core.errors import DatasetError
from pipeline.data.readers.common import Table

# Characters no text may hold: NUL (binary data, or a JSON "\u0000" escape) and lone UTF-16
# surrogates (an unpaired "\ud800" JSON escape), which UTF-8 cannot encode.
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")

ID_SEP = "\x1f"  # ASCII unit separator: cannot be confused with text that merely contains a space


def content_id(input_text: str, target_text: str) -> str:
    """Stable id for a pair without an id column: equal pairs get equal ids on every machine."""
    digest = hashlib.sha256((input_text + ID_SEP + target_text).encode("utf-8"))
    return digest.hexdigest()[:16]


def _bad_char(path: Path, where: str, text: str) -> DatasetError | None:
    """A NUL or a lone surrogate in `text`, named with its position; None if there is none."""
    m = _BAD_CHAR.search(text)
    if m is None:
        return None
    pos, ch = m.start(), m.group()
    before = f", after {text[max(0, pos - 20) : pos]!r}" if pos else ""
    if ch == "\x00":
        return DatasetError(
            f"{path}: {where}: NUL character (U+0000) at character {pos + 1} of the text{before}; expected text "
            'without NUL characters (a JSON "\\u0000" escape, or binary data in the file?)'
        )
    return DatasetError(
        f"{path}: {where}: lone surrogate U+{ord(ch):04X} at character {pos + 1} of the text{before}; expected "
        'valid Unicode text (a JSON "\\ud800"-style escape is only valid as half of a surrogate pair, and '
        "UTF-8 cannot encode it alone)"
    )


def _check_text(path: Path, table: Table, field: str, skip: set[int] | None = None) -> list[str]:
    """The field's texts. A null, empty or whitespace-only text is an error naming the row, or,
    with `skip` (a set), its row index is added there and the row is dropped later. A text
    holding a NUL or a lone surrogate is always an error."""
    values = table.columns[field]
    hint = " (or set embed.empty_text=skip to drop such rows and count them)"
    for i, v in enumerate(values):
        if isinstance(v, str):
            if not v.strip():
                if skip is not None:
                    skip.add(i)
                    continue
                what = "empty" if v == "" else "whitespace-only"
                raise DatasetError(
                    f"{path}: {table.label(i)}, field {field!r}: text is {what}"
                    f"{table.empty_note(i, field)}; expected non-empty text{hint}"
                )
            continue
        if v is None:
            if skip is not None:
                skip.add(i)
                continue
            raise DatasetError(
                f"{path}: {table.label(i)}, field {field!r}: value is null; expected non-empty text{hint}"
            )
        raise DatasetError(
            f"{path}: {table.label(i)}, field {field!r}: found {type(v).__name__}"
            f"{table.type_note.get(field, '')}, expected a string"
        )
    _check_chars(path, table, field, values, "field")
    return values


def _check_chars(path: Path, table: Table, field: str, values: list, what: str) -> None:
    """Refuse the first text holding a NUL or a lone surrogate. One search over the column
    joined (fast, in C); the row is looked for only when there is one."""
    if not _BAD_CHAR.search("\n".join(v for v in values if isinstance(v, str))):
        return
    for i, v in enumerate(values):
        if isinstance(v, str):
            err = _bad_char(path, f"{table.label(i)}, {what} {field!r}", v)
            if err is not None:
                raise err


def _check_ids(path: Path, table: Table, field: str) -> list[str]:
    # Integer ids are common in JSON/Parquet exports and convert to text without ambiguity;
    # floats (1.0 vs 1) and bools do not, so those are rejected.
    ids: list[str] = []
    first_row: dict[str, int] = {}
    for i, v in enumerate(table.columns[field]):
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if v is None:
            raise DatasetError(
                f"{path}: {table.label(i)}, id field {field!r}: value is null; "
                "expected a non-empty string or integer id"
            )
        if not isinstance(v, str):
            raise DatasetError(
                f"{path}: {table.label(i)}, id field {field!r}: found {type(v).__name__}"
                f"{table.type_note.get(field, '')}, expected a string or integer id"
            )
        if not v.strip():
            raise DatasetError(
                f"{path}: {table.label(i)}, id field {field!r}: id is empty"
                f"{table.empty_note(i, field)}; expected a non-empty id"
            )
        if v in first_row:
            raise DatasetError(
                f"{path}: duplicate id {v!r} in field {field!r}: {table.label(first_row[v])} "
                f"and {table.label(i)}; expected every id to be unique"
            )
        first_row[v] = i
        ids.append(v)
    _check_chars(path, table, field, ids, "id field")
    return ids


def _check_groups(path: Path, table: Table, field: str) -> list[str]:
    """Group labels: like ids (text or integer, never null or empty) but shared by many rows."""
    groups: list[str] = []
    for i, v in enumerate(table.columns[field]):
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if v is None or not isinstance(v, str):
            found = "null" if v is None else f"{type(v).__name__}{table.type_note.get(field, '')}"
            raise DatasetError(
                f"{path}: {table.label(i)}, group field {field!r} (embed.group_field): found {found}; "
                "expected a string or integer naming the row's group (or set embed.group_field=null "
                "to score exact answer texts only)"
            )
        if not v.strip():
            raise DatasetError(
                f"{path}: {table.label(i)}, group field {field!r} (embed.group_field): empty"
                f"{table.empty_note(i, field)}; expected a non-empty group label"
            )
        groups.append(v)
    _check_chars(path, table, field, groups, "group field")
    return groups


def build_frame(
    path: Path,
    table: Table,
    input_field: str,
    target_field: str,
    id_field: str | None,
    skip_empty: bool = False,
    group_field: str | None = None,
) -> pd.DataFrame:
    skipped: set[int] | None = set() if skip_empty else None
    inputs = _check_text(path, table, input_field, skipped)
    targets = _check_text(path, table, target_field, skipped)
    if id_field is not None:
        ids = _check_ids(path, table, id_field)
    else:
        ids = [content_id(a, b) if isinstance(a, str) and isinstance(b, str) else "" for a, b in zip(inputs, targets)]
    # No group column: each target text is its own group (group metrics equal exact-text ones).
    groups = _check_groups(path, table, group_field) if group_field is not None else list(targets)
    df = pd.DataFrame({"id": ids, "input_text": inputs, "target_text": targets, "group": groups}, dtype=object)
    if skipped:
        df = df.drop(index=sorted(skipped)).reset_index(drop=True)
    df = df.astype(str)
    df.attrs["rows_skipped_empty"] = len(skipped or ())
    return df
