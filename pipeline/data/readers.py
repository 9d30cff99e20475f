"""Read (input, target) text pairs from CSV, TSV, JSON, JSON Lines or Parquet.

Every format ends up as the same three lists (id, input, target) and goes through the same
validation, so a bad row is reported the same way whatever the file format. Each error names the
file, the 1-based data row and the field, and says what was expected: the user should be able to
fix the file from the message alone.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from pipeline.errors import DatasetError

# Extension -> format. Explicit `fmt` values are the format names themselves (plus "ndjson").
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

# Leading bytes of formats people commonly mistake for text data; named in the error message.
_MAGIC = {
    b"PAR1": "a Parquet file",
    b"\x1f\x8b": "gzip-compressed data",
    b"PK\x03\x04": "a zip archive (or .xlsx workbook)",
    b"\x93NUMPY": "a NumPy .npy array",
}

ID_SEP = "\x1f"  # ASCII unit separator: cannot be confused with text that merely contains a space


def content_id(input_text: str, target_text: str) -> str:
    """Stable id for a pair without an id column: equal pairs get equal ids on every machine."""
    digest = hashlib.sha256((input_text + ID_SEP + target_text).encode("utf-8"))
    return digest.hexdigest()[:16]


def read_pairs(
    path: str | os.PathLike,
    input_field: str,
    target_field: str,
    id_field: str | None = None,
    fmt: str = "auto",
    skip_empty: bool = False,
) -> pd.DataFrame:
    """Read a dataset into a frame with columns id, input_text, target_text (str), in file order.
    With skip_empty, rows whose input or target is null/empty are dropped and counted in
    `df.attrs["rows_skipped_empty"]`; otherwise the first such row is an error.

    Field names may be dotted paths (`"question.text"`) into nested JSON objects or Parquet
    struct columns; a key or column literally named with the dots wins over the nested lookup.
    """
    path = Path(path)
    fmt = _resolve_format(path, fmt)
    if not path.exists():
        raise DatasetError(f"{path}: file not found (expected a {fmt} dataset)")
    if not path.is_file():
        raise DatasetError(f"{path}: not a regular file (expected a {fmt} dataset)")
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: empty file (0 bytes); expected a {fmt} dataset")

    fields = [input_field, target_field] + ([id_field] if id_field is not None else [])
    if fmt == "parquet":
        table = _read_parquet(path, fields)
    else:
        text = _read_text(path, fmt)
        if fmt in ("csv", "tsv"):
            table = _read_delimited(path, text, fmt, fields)
        elif fmt == "jsonl":
            table = _read_jsonl(path, text, fields)
        else:
            table = _read_json(path, text, fields)
    return _build_frame(path, table, input_field, target_field, id_field, skip_empty)


def dataset_files(spec: str | os.PathLike) -> list[Path]:
    """The files a dataset spec names: one file, every file with a known extension in a
    directory (sorted, not recursive), or a glob pattern (sorted)."""
    text = str(spec)
    path = Path(text)
    if any(c in text for c in "*?["):
        root = Path(path.anchor) if path.is_absolute() else Path(".")
        pattern = str(path.relative_to(root)) if path.is_absolute() else text
        files = sorted(p for p in root.glob(pattern) if p.is_file())
        if not files:
            raise DatasetError(f"{text}: no file matches this pattern (expected one or more dataset files)")
        return files
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)
        if not files:
            raise DatasetError(f"{path}: directory holds no dataset file (expected files ending in "
                               f"{', '.join(sorted(EXTENSIONS))})")
        return files
    return [path]


def read_dataset(spec: str | os.PathLike, input_field: str, target_field: str, id_field: str | None = None,
                 fmt: str = "auto", skip_empty: bool = False) -> pd.DataFrame:
    """read_pairs over every file of a dataset spec (see dataset_files), concatenated in file
    order. Ids must be unique across files too; the error names both files."""
    frames, seen, skipped = [], {}, 0
    files = dataset_files(spec)
    for f in files:
        df = read_pairs(f, input_field, target_field, id_field, fmt, skip_empty)
        skipped += df.attrs.get("rows_skipped_empty", 0)
        if id_field is not None:
            for i in df["id"]:
                if i in seen:  # within one file read_pairs has already refused repeats
                    raise DatasetError(f"duplicate id {i!r} in field {id_field!r}: in {seen[i]} and in {f}; "
                                       "expected every id to be unique across the dataset's files")
                seen.setdefault(i, f)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    out.attrs["rows_skipped_empty"] = skipped
    out.attrs["files"] = files
    return out


def drop_duplicate_pairs(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop rows whose (input_text, target_text) already appeared; keep the first occurrence.

    Needed when ids are content hashes: two equal pairs would otherwise share one id."""
    dup = df.duplicated(subset=["input_text", "target_text"], keep="first")
    n_dropped = int(dup.sum())
    return df.loc[~dup].reset_index(drop=True), n_dropped


# --------------------------------------------------------------------------- format detection


def _resolve_format(path: Path, fmt: str) -> str:
    supported = ", ".join(sorted(EXTENSIONS))
    if fmt == "auto":
        ext = path.suffix.lower()
        if ext not in EXTENSIONS:
            raise DatasetError(
                f"{path}: cannot tell the format from extension {ext or '(none)'!r}; "
                f"supported extensions: {supported} (or pass fmt= one of {', '.join(FORMATS)})"
            )
        return EXTENSIONS[ext]
    fmt = "jsonl" if fmt == "ndjson" else fmt
    if fmt not in FORMATS:
        raise DatasetError(
            f"{path}: unknown format {fmt!r}; expected 'auto' or one of {', '.join(FORMATS)} "
            f"(auto supports the extensions {supported})"
        )
    return fmt


def _binary_kind(head: bytes) -> str | None:
    """Name the binary format `head` starts with, or None if it may be text."""
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    # UTF-8 text never contains NUL; UTF-16 text and most binary formats do.
    if b"\x00" in head:
        return "binary data (NUL bytes; UTF-16 text also looks like this)"
    return None


def _read_text(path: Path, fmt: str) -> str:
    data = path.read_bytes()
    kind = _binary_kind(data[:8192])
    if kind is not None:
        raise DatasetError(f"{path}: looks like {kind}, expected UTF-8 {fmt.upper()} text")
    try:
        # utf-8-sig: a byte-order mark written by Excel/Notepad is not part of the first header.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DatasetError(
            f"{path}: not valid UTF-8 at line {line} (byte offset {e.start}: "
            f"{data[e.start:e.start + 4]!r}); expected UTF-8 {fmt.upper()} text — "
            "re-save the file as UTF-8"
        ) from None


# --------------------------------------------------------------------------- per-format readers
#
# Each reader returns a _Table: for each requested field, the list of raw values in row order,
# plus a function that labels a row index for messages (JSONL adds the line number).


class _Table:
    def __init__(self, columns: dict[str, list[Any]], n_rows: int,
                 label: Callable[[int], str] | None = None, type_note: dict[str, str] | None = None):
        self.columns = columns
        self.n_rows = n_rows
        self.label = label or (lambda i: f"row {i + 1}")
        self.type_note = type_note or {}


def _read_delimited(path: Path, text: str, fmt: str, fields: list[str]) -> _Table:
    sep = "," if fmt == "csv" else "\t"
    try:
        # dtype=str + keep_default_na=False: "NA", "null", "nan" stay text; empty cells become ""
        # and are then rejected as empty text with their row number.
        df = pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DatasetError(f"{path}: empty dataset (no header and no rows); "
                           f"expected a header line and at least one data row") from None
    except (pd.errors.ParserError, ValueError) as e:
        # The parser's own line numbers count file lines including the header.
        raise DatasetError(
            f"{path}: not valid {fmt.upper()} ({str(e).strip()}); expected "
            f"{'comma' if fmt == 'csv' else 'tab'}-separated values, a header line, the same "
            "number of fields on every line and balanced double quotes"
        ) from None
    if len(df) == 0:
        raise DatasetError(f"{path}: empty dataset (header only, no data rows); "
                           f"expected at least one data row")
    available = [str(c) for c in df.columns]
    for field in fields:
        if field not in df.columns:
            raise DatasetError(
                f"{path}: missing field {field!r}; expected a column with that name in the header. "
                f"Available columns: {', '.join(repr(c) for c in available)}"
            )
    return _Table({f: df[f].tolist() for f in fields}, len(df))


def _lookup(obj: dict, field: str) -> tuple[bool, Any, str, list[str]]:
    """Find `field` in `obj`: (found, value, where it failed, keys available there)."""
    if field in obj:  # a literal dotted key beats a nested path
        return True, obj[field], "", []
    cur: Any = obj
    parts = field.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if not isinstance(cur, dict):
            found = "null" if cur is None else type(cur).__name__
            return False, None, f"{prefix!r} is {found}, not an object", []
        if part not in cur:
            where = f"under {prefix!r}" if prefix else "at the top level"
            return False, None, where, sorted(map(str, cur))
        cur = cur[part]
    return True, cur, "", []


def _extract_objects(path: Path, objs: list[Any], fields: list[str],
                     label: Callable[[int], str]) -> _Table:
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for i, obj in enumerate(objs):
        if not isinstance(obj, dict):
            found = "null" if obj is None else type(obj).__name__
            raise DatasetError(f"{path}: {label(i)}: expected a JSON object, found {found}")
        for field in fields:
            ok, value, where, keys = _lookup(obj, field)
            if not ok:
                avail = f" Keys there: {', '.join(repr(k) for k in keys)}" if keys else ""
                raise DatasetError(
                    f"{path}: missing field {field!r}: first lacking in {label(i)} "
                    f"({where}); expected every row to have it.{avail}"
                )
            columns[field].append(value)
    return _Table(columns, len(objs), label)


def _read_jsonl(path: Path, text: str, fields: list[str]) -> _Table:
    objs: list[Any] = []
    lines: list[int] = []  # file line number of each data row; blank lines are skipped
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(
                f"{path}: invalid JSON on line {lineno}, column {e.colno}: {e.msg}; "
                "expected one JSON object per line (JSON Lines)"
            ) from None
        if not isinstance(obj, dict):
            hint = " (a JSON array file should be named .json)" if isinstance(obj, list) else ""
            found = "null" if obj is None else type(obj).__name__
            raise DatasetError(f"{path}: line {lineno}: expected a JSON object, found {found}{hint}")
        objs.append(obj)
        lines.append(lineno)
    if not objs:
        raise DatasetError(f"{path}: empty dataset (no JSON objects, only blank lines); "
                           "expected at least one JSON object per line")
    return _extract_objects(path, objs, fields, lambda i: f"row {i + 1} (line {lines[i]})")


def _read_json(path: Path, text: str, fields: list[str]) -> _Table:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        hint = ""
        if e.msg == "Extra data":
            hint = " (several top-level values: if this is one object per line, name it .jsonl)"
        raise DatasetError(
            f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}{hint}; "
            "expected a top-level array of objects"
        ) from None
    if not isinstance(data, list):
        found = "null" if data is None else ("an object" if isinstance(data, dict)
                                             else type(data).__name__)
        raise DatasetError(f"{path}: expected a top-level JSON array of objects, found {found}")
    if not data:
        raise DatasetError(f"{path}: empty dataset (empty JSON array); "
                           "expected at least one object")
    return _extract_objects(path, data, fields, lambda i: f"row {i + 1}")


def _read_parquet(path: Path, fields: list[str]) -> _Table:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # Check the magic ourselves: pyarrow's own message ("magic bytes not found in footer")
    # does not tell the user the file is simply not Parquet, or cut short.
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
    if head != b"PAR1":
        raise DatasetError(f"{path}: not a Parquet file (expected the 'PAR1' magic at the start, "
                           f"found {head!r})")
    if size < 12 or tail != b"PAR1":
        raise DatasetError(f"{path}: truncated or corrupt Parquet file (expected the 'PAR1' "
                           f"magic at the end, found {tail!r}); re-export or re-download it")
    try:
        pfile = pq.ParquetFile(path)
        schema = pfile.schema_arrow
        n_rows = pfile.metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: corrupt Parquet file ({e}); expected a readable Parquet "
                           "file") from None
    if n_rows == 0:
        raise DatasetError(f"{path}: empty dataset (Parquet file has 0 rows); "
                           "expected at least one row")

    # Resolve each field to (top-level column, struct path below it) before reading data, so
    # only the needed columns are read.
    plans: dict[str, tuple[str, list[str]]] = {}
    for field in fields:
        if field in schema.names:
            plans[field] = (field, [])
            continue
        parts = field.split(".")
        typ = None
        if parts[0] in schema.names:
            typ = schema.field(parts[0]).type
            for part in parts[1:]:
                if not (pa.types.is_struct(typ) and typ.get_field_index(part) >= 0):
                    typ = None
                    break
                typ = typ.field(part).type
        if typ is None:
            raise DatasetError(
                f"{path}: missing field {field!r}; expected a Parquet column (or struct field "
                f"path) with that name. Available fields: "
                f"{', '.join(repr(n) for n in _flatten_schema(schema))}"
            )
        plans[field] = (parts[0], parts[1:])

    try:
        table = pfile.read(columns=sorted({top for top, _ in plans.values()}))
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: corrupt Parquet file ({e}); expected a readable Parquet "
                           "file") from None
    columns: dict[str, list[Any]] = {}
    type_note: dict[str, str] = {}
    for field, (top, sub) in plans.items():
        arr = table.column(top)
        for part in sub:
            # struct_field yields null where any enclosing struct is null, which is then
            # reported as a null value for that row.
            arr = pc.struct_field(arr, part)
        columns[field] = arr.to_pylist()
        type_note[field] = f" (Parquet type {arr.type})"
    return _Table(columns, n_rows, type_note=type_note)


def _flatten_schema(schema) -> list[str]:
    import pyarrow as pa

    out: list[str] = []

    def walk(prefix: str, typ) -> None:
        for i in range(typ.num_fields):
            f = typ.field(i)
            name = f"{prefix}.{f.name}"
            out.append(name)
            if pa.types.is_struct(f.type):
                walk(name, f.type)

    for f in schema:
        out.append(f.name)
        if pa.types.is_struct(f.type):
            walk(f.name, f.type)
    return out


# --------------------------------------------------------------------------- validation


def _check_text(path: Path, table: _Table, field: str, skip: set[int] | None = None) -> list[str]:
    """The field's texts. A null, empty or whitespace-only text is an error naming the row, or,
    with `skip` (a set), its row index is added there and the row is dropped later."""
    values = table.columns[field]
    hint = " (or set embed.empty_text=skip to drop such rows and count them)"
    for i, v in enumerate(values):
        if isinstance(v, str):
            if not v.strip():
                if skip is not None:
                    skip.add(i)
                    continue
                what = "empty" if v == "" else "whitespace-only"
                raise DatasetError(f"{path}: {table.label(i)}, field {field!r}: text is {what}; "
                                   f"expected non-empty text{hint}")
            continue
        if v is None:
            if skip is not None:
                skip.add(i)
                continue
            raise DatasetError(f"{path}: {table.label(i)}, field {field!r}: value is null; "
                               f"expected non-empty text{hint}")
        raise DatasetError(
            f"{path}: {table.label(i)}, field {field!r}: found {type(v).__name__}"
            f"{table.type_note.get(field, '')}, expected a string"
        )
    return values


def _check_ids(path: Path, table: _Table, field: str) -> list[str]:
    # Integer ids are common in JSON/Parquet exports and convert to text without ambiguity;
    # floats (1.0 vs 1) and bools do not, so those are rejected.
    ids: list[str] = []
    first_row: dict[str, int] = {}
    for i, v in enumerate(table.columns[field]):
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if v is None:
            raise DatasetError(f"{path}: {table.label(i)}, id field {field!r}: value is null; "
                               "expected a non-empty string or integer id")
        if not isinstance(v, str):
            raise DatasetError(
                f"{path}: {table.label(i)}, id field {field!r}: found {type(v).__name__}"
                f"{table.type_note.get(field, '')}, expected a string or integer id"
            )
        if not v.strip():
            raise DatasetError(f"{path}: {table.label(i)}, id field {field!r}: id is empty; "
                               "expected a non-empty id")
        if v in first_row:
            raise DatasetError(
                f"{path}: duplicate id {v!r} in field {field!r}: {table.label(first_row[v])} "
                f"and {table.label(i)}; expected every id to be unique"
            )
        first_row[v] = i
        ids.append(v)
    return ids


def _build_frame(path: Path, table: _Table, input_field: str, target_field: str,
                 id_field: str | None, skip_empty: bool = False) -> pd.DataFrame:
    skipped: set[int] | None = set() if skip_empty else None
    inputs = _check_text(path, table, input_field, skipped)
    targets = _check_text(path, table, target_field, skipped)
    if id_field is not None:
        ids = _check_ids(path, table, id_field)
    else:
        ids = [content_id(a, b) for a, b in zip(inputs, targets)]
    df = pd.DataFrame({"id": ids, "input_text": inputs, "target_text": targets}, dtype=object)
    if skipped:
        df = df.drop(index=sorted(skipped)).reset_index(drop=True)
    df = df.astype(str)
    df.attrs["rows_skipped_empty"] = len(skipped or ())
    return df
