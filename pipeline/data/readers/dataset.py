"""Read (input, target) text pairs from CSV, TSV, JSON, JSON Lines or Parquet.

Every format ends up as the same three lists (id, input, target) and goes through the same
validation, so a bad row is reported the same way whatever the file format. Each error names the
file, the 1-based data row and the field, and says what was expected: the user should be able to
fix the file from the message alone. Whatever a parser raises on a user's file becomes a
DatasetError naming the file (no traceback reaches the user, MemoryError aside).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from pipeline.core.errors import DatasetError, PipelineError
from pipeline.data.input_limits import InputLimits, check_columns, check_rows, check_size, header_fields
from pipeline.data.readers.checks import build_frame
from pipeline.data.readers.common import EXPECTED, EXTENSIONS, FORMATS, NO_LIMITS, detail, first_line, read_text
from pipeline.data.readers.delimited import read_delimited, resolve_delimiter
from pipeline.data.readers.files import dataset_listing, not_found
from pipeline.data.readers.json_objects import read_json, read_jsonl
from pipeline.data.readers.parquet import read_parquet

ROLE_KEYS = ("embed.input_field", "embed.target_field", "embed.id_field", "embed.group_field")  # named in messages


def read_pairs(
    path: str | os.PathLike,
    input_field: str,
    target_field: str,
    id_field: str | None = None,
    fmt: str = "auto",
    skip_empty: bool = False,
    delimiter: str = "",
    group_field: str | None = None,
    *,
    limits: InputLimits = NO_LIMITS,
) -> pd.DataFrame:
    """Read a dataset into a frame with columns id, input_text, target_text, group (str), in file
    order. `group_field` names the column that says which rows' targets are one answer in other
    words (e.g. the fact a row states); None or "" = each target text is its own group.
    With skip_empty, rows whose input or target is null/empty are dropped and counted in
    `df.attrs["rows_skipped_empty"]`; otherwise the first such row is an error.

    Field names may be dotted paths (`"question.text"`) into nested JSON objects or Parquet
    struct columns; a key or column literally named with the dots wins over the nested lookup.
    `id_field` None or "" means no id column: ids are content hashes of (input, target).
    `delimiter`: embed.delimiter (resolve_delimiter); `limits`: pipeline/data/input_limits.py.
    """
    path = Path(path)
    id_field = id_field or None
    try:
        exists, is_file, is_dir = path.exists(), path.is_file(), path.is_dir()
    except (OSError, ValueError) as e:
        raise DatasetError(
            f"{str(path)!r}: cannot be read ({getattr(e, 'strerror', None) or e}); expected a readable dataset file"
        ) from e
    if not exists:
        raise not_found(path)
    fmt = resolve_format(path, fmt)
    sep = resolve_delimiter(delimiter, fmt)
    if not is_file:
        kind = "a directory" if is_dir else "not a regular file"
        raise DatasetError(f"{path}: {kind}; expected a {fmt} dataset file")
    try:
        size = path.stat().st_size
        if size == 0:
            raise DatasetError(f"{path}: empty file (0 bytes); expected a {fmt} dataset")
        check_size(path, size, limits)
        roles: dict[str, str] = {}
        group_field = group_field or None
        for field, key in zip((input_field, target_field, id_field, group_field), ROLE_KEYS):
            if field is not None:
                roles.setdefault(field, key)
        fields = list(roles)
        if fmt == "parquet":
            table = read_parquet(path, fields, roles, limits)
        else:
            text = read_text(path, fmt, limits)
            if fmt in ("csv", "tsv"):
                check_columns(path, header_fields(first_line(text), sep), limits)
                table = read_delimited(path, text, fmt, sep, fields, roles, explicit=bool(delimiter))
            elif fmt == "jsonl":
                table = read_jsonl(path, text, fields, roles)
            else:
                table = read_json(path, text, fields, roles)
        check_rows(str(path), table.n_rows, limits, "before its texts are checked or embedded")
        return build_frame(path, table, input_field, target_field, id_field, skip_empty, group_field)
    except (PipelineError, MemoryError):
        raise
    except RecursionError:
        raise DatasetError(
            f"{path}: nested too deeply to read (more levels of arrays/objects than Python's "
            f"recursion limit); expected {EXPECTED[fmt]} with a few levels of nesting"
        ) from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e}); expected a readable {fmt} dataset file") from e
    except Exception as e:  # last resort: whatever a parser raised on this file's content
        raise DatasetError(
            f"{path}: could not be read as {fmt.upper()} ({type(e).__name__}: {detail(e)}); expected {EXPECTED[fmt]}"
        ) from e


def read_dataset(
    spec: str | os.PathLike,
    input_field: str,
    target_field: str,
    id_field: str | None = None,
    fmt: str = "auto",
    skip_empty: bool = False,
    delimiter: str = "",
    *,
    allowed_root: Path | None = None,
    group_field: str | None = None,
    limits: InputLimits = NO_LIMITS,
) -> pd.DataFrame:
    """read_pairs over every file of a dataset spec (see dataset_files), concatenated in file
    order. Ids must be unique across files too; the error names both files.

    `df.attrs`: "files" (read, in order), "files_skipped" ([(path, reason)] for every entry of a
    directory, or match of a glob, that was not read), "rows_skipped_empty"."""
    id_field = id_field or None
    files, files_skipped = dataset_listing(spec, allowed_root=allowed_root)
    frames, seen, skipped, rows = [], {}, 0, 0
    for n, f in enumerate(files, 1):
        df = read_pairs(f, input_field, target_field, id_field, fmt, skip_empty, delimiter, group_field, limits=limits)
        rows += len(df) + df.attrs.get("rows_skipped_empty", 0)
        if n > 1:
            check_rows(f"{spec} ({n} of its {len(files)} files)", rows, limits, "before reading the rest")
        skipped += df.attrs.get("rows_skipped_empty", 0)
        if id_field is not None:
            for i in df["id"]:
                if i in seen:  # within one file read_pairs has already refused repeats
                    raise DatasetError(
                        f"duplicate id {i!r} in field {id_field!r}: in {seen[i]} and in {f}; "
                        "expected every id to be unique across the dataset's files"
                    )
                seen.setdefault(i, f)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(out) == 0:
        where = str(files[0]) if len(files) == 1 else f"{spec} ({len(files)} files)"
        raise DatasetError(
            f"{where}: no rows left: every one of the {skipped} rows read has an empty or null input or "
            "target text and was skipped (embed.empty_text=skip); expected at least one row with "
            "both texts"
        )
    out.attrs["rows_skipped_empty"] = skipped
    out.attrs["files"] = files
    out.attrs["files_skipped"] = files_skipped
    return out


def drop_duplicate_pairs(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop rows whose (input_text, target_text) already appeared; keep the first occurrence.

    Needed when ids are content hashes: two equal pairs would otherwise share one id."""
    dup = df.duplicated(subset=["input_text", "target_text"], keep="first")
    n_dropped = int(dup.sum())
    return df.loc[~dup].reset_index(drop=True), n_dropped


def resolve_format(path: Path, fmt: str) -> str:
    supported = ", ".join(sorted(EXTENSIONS))
    if fmt == "auto":
        ext = path.suffix.lower()
        if ext not in EXTENSIONS:
            raise DatasetError(
                f"{path}: cannot tell the format from extension {ext or '(none)'!r}; "
                f"supported extensions: {supported} (or set embed.format to one of {', '.join(FORMATS)})"
            )
        return EXTENSIONS[ext]
    fmt = "jsonl" if fmt == "ndjson" else fmt
    if fmt not in FORMATS:
        raise DatasetError(
            f"{path}: embed.format = {fmt!r} is not a format; expected 'auto' or one of {', '.join(FORMATS)} "
            f"(auto supports the extensions {supported})"
        )
    return fmt
