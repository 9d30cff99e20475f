"""What every dataset reader shares: the formats, the text a file is decoded into, the table a
format reader returns and the hints its messages end with."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable

from pipeline.core.errors import DatasetError
from pipeline.data.input_limits import InputLimits, check_lines

NO_LIMITS = InputLimits()

# Extension -> format. Explicit `fmt` values (embed.format) are the format names themselves
# (plus "ndjson").
EXTENSIONS: dict[str, str] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
FORMATS = ("csv", "tsv", "jsonl", "json", "parquet")

# What each format's file must hold, for messages.
EXPECTED = {
    "csv": "UTF-8 comma-separated values with a header line",
    "tsv": "UTF-8 tab-separated values with a header line",
    "jsonl": "UTF-8 JSON Lines (one JSON object per line)",
    "json": "a UTF-8 JSON file holding a top-level array of objects",
    "parquet": "a readable Parquet file",
}

# Leading bytes of formats people commonly mistake for text data; named in the error message.
# Longer magics first: UTF-32's byte-order mark starts with UTF-16's.
_MAGIC = {
    b"PAR1": "a Parquet file",
    b"\x1f\x8b": "gzip-compressed data",
    b"PK\x03\x04": "a zip archive (or .xlsx workbook)",
    b"\x93NUMPY": "a NumPy .npy array",
    b"\xff\xfe\x00\x00": "UTF-32 text (little-endian byte-order mark)",
    b"\x00\x00\xfe\xff": "UTF-32 text (big-endian byte-order mark)",
    b"\xff\xfe": "UTF-16 text (little-endian byte-order mark)",
    b"\xfe\xff": "UTF-16 text (big-endian byte-order mark)",
}

_ID_HINT = " (no id column? set embed.id_field=null or embed.id_field='' for content-hash ids)"


def detail(e: BaseException) -> str:
    """An exception's message on one line, cut short: it goes inside our own sentence."""
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _binary_kind(head: bytes) -> str | None:
    """Name the binary format `head` starts with, or None if it may be text."""
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    # UTF-8 text never contains NUL; UTF-16 text and most binary formats do.
    if b"\x00" in head:
        if len(head) >= 4 and (
            head[1::2].count(0) > 0.9 * (len(head) // 2) or head[0::2].count(0) > 0.9 * ((len(head) + 1) // 2)
        ):
            return "UTF-16 text without a byte-order mark (every other byte is NUL)"
        # A stray NUL in otherwise valid UTF-8 text (a bad export, a "\u0000" pasted in) is left to
        # the per-field check, which names its row and field; many NULs, or bytes that are not
        # UTF-8, are a binary file.
        try:
            head.decode("utf-8")
            text = True
        except UnicodeDecodeError as e:
            text = e.start >= len(head) - 3  # only a character cut by the 8 KiB window
        if text and head.count(0) <= max(1, len(head) // 100):
            return None
        return "binary data (NUL bytes; UTF-16 text also looks like this)"
    return None


def first_line(text: str) -> str:
    """The first line that is not blank (the header), without splitting the whole text."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if text[start:end].strip():
            return text[start:end].rstrip("\r")
        start = end + 1
    return ""


def read_text(path: Path, fmt: str, limits: InputLimits = NO_LIMITS) -> str:
    data = path.read_bytes()
    kind = _binary_kind(data[:8192])
    if kind is not None:
        redo = " — re-save the file as UTF-8" if kind.startswith("UTF-") else ""
        raise DatasetError(f"{path}: looks like {kind}, expected UTF-8 {fmt.upper()} text{redo}")
    if fmt != "json":  # one row a line; a JSON array is often one line however many rows it holds
        check_lines(path, data, limits)
    try:
        # utf-8-sig: a byte-order mark written by Excel/Notepad is not part of the first header.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise DatasetError(
            f"{path}: not valid UTF-8 at line {line} (byte offset {start}, column {column}: "
            f"{data[start : start + 4]!r}); expected UTF-8 {fmt.upper()} text — "
            "re-save the file as UTF-8 (it may be Latin-1 or Windows-1252)"
        ) from None


# --------------------------------------------------------------------------- per-format readers
#
# Each reader returns a Table: for each requested field, the list of raw values in row order,
# plus a function that labels a row index for messages (JSONL adds the line number).


class Table:
    def __init__(
        self,
        columns: dict[str, list[Any]],
        n_rows: int,
        label: Callable[[int], str] | None = None,
        type_note: dict[str, str] | None = None,
        empty_note: Callable[[int, str], str] | None = None,
    ):
        self.columns = columns
        self.n_rows = n_rows
        self.label = label or (lambda i: f"row {i + 1}")
        self.type_note = type_note or {}
        # Why a row's field is empty, when the format can say more (a CSV row with too few fields).
        self.empty_note = empty_note or (lambda i, field: "")


def role(field: str, roles: dict[str, str]) -> str:
    key = roles.get(field)
    return f" ({key})" if key else ""


_GROUP_HINT = (
    " (no group column? set embed.group_field=null: each answer text is then its own group and "
    "evaluate scores exact texts)"
)


def repeated_name(names: list[str], blank_ok: bool = False) -> tuple[str, str, str] | None:
    """The first name given more than once (a blank one aside, with blank_ok): (the name, "twice"
    or "N times", its 1-based positions as "1, 2 and 3"), or None."""
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(names, 1):
        positions.setdefault(name, []).append(i)
    for name, at in positions.items():
        if len(at) > 1 and (name or not blank_ok):
            times = "twice" if len(at) == 2 else f"{len(at)} times"
            return name, times, ", ".join(map(str, at[:-1])) + f" and {at[-1]}"
    return None


def id_hint(field: str, roles: dict[str, str]) -> str:
    """The way out when an optional column (ids, groups) is missing."""
    return {"embed.id_field": _ID_HINT, "embed.group_field": _GROUP_HINT}.get(roles.get(field), "")


def close_name(field: str, names: list[str]) -> str:
    """' Did you mean ...?' for a column spelled with other case or spaces."""
    near = [n for n in names if n.strip().casefold() == field.strip().casefold() and n != field]
    if not near:
        near = difflib.get_close_matches(field, names, n=1, cutoff=0.8)
    return f". Did you mean {near[0]!r}?" if near else ""
