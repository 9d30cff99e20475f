"""Read (input, target) text pairs from CSV, TSV, JSON, JSON Lines or Parquet.

Every format ends up as the same three lists (id, input, target) and goes through the same
validation, so a bad row is reported the same way whatever the file format. Each error names the
file, the 1-based data row and the field, and says what was expected: the user should be able to
fix the file from the message alone. Whatever a parser raises on a user's file becomes a
DatasetError naming the file (no traceback reaches the user, MemoryError aside).
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from pipeline.core.errors import ConfigError, DatasetError, PipelineError
from pipeline.data.input_limits import InputLimits, check_columns, check_lines, check_rows, check_size, header_fields

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
_EXPECTED = {
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

# The delimiters a header is checked for when a field is missing from a CSV/TSV file.
_DELIMITER_CANDIDATES = (",", ";", "\t", "|")

# Characters no text may hold: NUL (binary data, or a JSON "\u0000" escape) and lone UTF-16
# surrogates (an unpaired "\ud800" JSON escape), which UTF-8 cannot encode.
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")

_ID_HINT = " (no id column? set embed.id_field=null or embed.id_field='' for content-hash ids)"

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
    `delimiter` is the CSV/TSV field separator: "" = the format's own (',' for csv, tab for tsv),
    "tab" or "\\t" = tab, else one character (embed.delimiter).
    `limits` (pipeline/data/input_limits.py): the file's size is checked before it is read, its
    lines and columns before it is parsed, its rows as soon as they are known.
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
        raise _not_found(path)
    fmt = _resolve_format(path, fmt)
    sep = resolve_delimiter(delimiter, fmt)
    if not is_file:
        kind = "a directory" if is_dir else "not a regular file"
        raise DatasetError(f"{path}: {kind}; expected a {fmt} dataset file")
    try:
        size = path.stat().st_size
        if size == 0:
            raise DatasetError(f"{path}: empty file (0 bytes); expected a {fmt} dataset")
        check_size(path, size, limits)
        roles = {}
        group_field = group_field or None
        for field, key in (
            (input_field, "embed.input_field"),
            (target_field, "embed.target_field"),
            (id_field, "embed.id_field"),
            (group_field, "embed.group_field"),
        ):
            if field is not None:
                roles.setdefault(field, key)
        fields = list(roles)
        if fmt == "parquet":
            table = _read_parquet(path, fields, roles, limits)
        else:
            text = _read_text(path, fmt, limits)
            if fmt in ("csv", "tsv"):
                check_columns(path, header_fields(_first_line(text), sep), limits)
                table = _read_delimited(path, text, fmt, sep, fields, roles, explicit=bool(delimiter))
            elif fmt == "jsonl":
                table = _read_jsonl(path, text, fields, roles)
            else:
                table = _read_json(path, text, fields, roles)
        check_rows(str(path), table.n_rows, limits, "before its texts are checked or embedded")
        return _build_frame(path, table, input_field, target_field, id_field, skip_empty, group_field)
    except (PipelineError, MemoryError):
        raise
    except RecursionError:
        raise DatasetError(
            f"{path}: nested too deeply to read (more levels of arrays/objects than Python's "
            f"recursion limit); expected {_EXPECTED[fmt]} with a few levels of nesting"
        ) from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e}); expected a readable {fmt} dataset file") from e
    except Exception as e:  # last resort: whatever a parser raised on this file's content
        raise DatasetError(
            f"{path}: could not be read as {fmt.upper()} ({type(e).__name__}: {_detail(e)}); expected {_EXPECTED[fmt]}"
        ) from e


def _detail(e: BaseException) -> str:
    """An exception's message on one line, cut short: it goes inside our own sentence."""
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def dataset_files(spec: str | os.PathLike, *, allowed_root: Path | None = None) -> list[Path]:
    """The files a dataset spec names: one file, every file with a known extension in a
    directory (sorted, not recursive; hidden files are not read), or a glob pattern (sorted).
    With `allowed_root`, every file must resolve (`..` and symlinks followed) inside it, else
    ConfigError."""
    return dataset_listing(spec, allowed_root=allowed_root)[0]


def dataset_listing(
    spec: str | os.PathLike, *, allowed_root: Path | None = None
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(files to read, [(path, reason) for every directory entry or glob match not read])."""
    text = str(spec)
    path = Path(text)
    skipped: list[tuple[Path, str]] = []
    try:
        if any(c in text for c in "*?["):
            files, skipped, where = _glob_files(text, path)
        elif not path.exists():
            raise _not_found(path, directory=text.endswith(("/", os.sep)))
        elif path.is_dir():
            files, skipped = _directory_files(path)
            where = "the directory holds"
        else:
            files, where = [path], "the file"
        if allowed_root is not None:
            root = Path(allowed_root).resolve()
            for f in files:
                real = f.resolve()
                if not real.is_relative_to(root):
                    raise ConfigError(
                        f"embed.dataset = {text!r}: {where} {f}, which resolves to {real}, outside the project "
                        f"({root}); expected files inside it, or set run.allow_external_paths=true to allow it"
                    )
    except OSError as e:
        raise DatasetError(
            f"{text}: cannot be listed ({e.strerror or e}: {e.filename or text}); expected a "
            "readable dataset file, directory or glob pattern"
        ) from e
    except ValueError as e:  # a NUL in the path
        raise DatasetError(
            f"{text!r}: not a usable path ({e}); expected a dataset file, directory or glob pattern"
        ) from None
    return files, skipped


def _glob_files(text: str, path: Path) -> tuple[list[Path], list[tuple[Path, str]], str]:
    root = Path(path.anchor) if path.is_absolute() else Path(".")
    pattern = str(path.relative_to(root)) if path.is_absolute() else text
    try:
        matches = sorted(root.glob(pattern))
    except (ValueError, NotImplementedError) as e:
        raise DatasetError(
            f"{text}: invalid glob pattern ({e}); expected a pattern such as 'data/raw/part-*.jsonl'"
        ) from None
    # A pattern whose last part does not start with '.' does not mean hidden files (.DS_Store,
    # macOS's ._name.csv resource forks), though pathlib's glob matches them.
    files, skipped = _partition(matches, hidden_ok=path.name.startswith("."), need_extension=False)
    if not files:
        held = f" (it matches only: {_describe(skipped)})" if skipped else ""
        fixed = Path(
            *[p for p in path.parts[: next(i for i, p in enumerate(path.parts) if any(c in p for c in "*?["))]] or ["."]
        )
        near = "" if fixed.is_dir() else f"; {fixed} does not exist (nearest existing parent: {_nearest_parent(fixed)})"
        raise DatasetError(f"{text}: no file matches this pattern{held}{near}; expected one or more dataset files")
    return files, skipped, "the glob matches"


def _partition(paths: list[Path], hidden_ok: bool, need_extension: bool) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the paths read, [(path, why not)] for the others), in the given order."""
    files, skipped = [], []
    for p in paths:
        reason = _skip_reason(p, hidden_ok=hidden_ok, need_extension=need_extension)
        if reason:
            skipped.append((p, reason))
        else:
            files.append(p)
    return files, skipped


def _directory_files(path: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    files, skipped = _partition(sorted(path.iterdir()), hidden_ok=False, need_extension=True)
    if not files:
        held = f"it holds: {_describe(skipped)}" if skipped else "it is empty"
        raise DatasetError(
            f"{path}: directory holds no dataset file ({held}); expected files ending in "
            f"{', '.join(sorted(EXTENSIONS))}"
        )
    return files, skipped


def _skip_reason(p: Path, hidden_ok: bool, need_extension: bool) -> str:
    """Why a directory entry or glob match is not read ("" = it is read)."""
    if p.name.startswith(".") and not hidden_ok:
        return "hidden file (name starts with '.')" if not p.is_dir() else "hidden directory"
    if p.is_dir():
        return "a directory (subdirectories are not read)"
    if not p.exists() and p.is_symlink():
        return f"broken symbolic link (to {os.readlink(p)})"
    if not p.is_file():
        return "not a regular file"
    if need_extension and p.suffix.lower() not in EXTENSIONS:
        return f"unsupported extension {p.suffix.lower() or '(none)'!r}"
    return ""


def _describe(entries: list[tuple[Path, str]], limit: int = 10) -> str:
    shown = [f"{p.name} ({why})" for p, why in entries[:limit]]
    more = f" and {len(entries) - limit} more" if len(entries) > limit else ""
    return ", ".join(shown) + more


def _nearest_parent(path: Path) -> str:
    for parent in path.parents:
        if parent.is_dir():
            return str(parent) if str(parent) != "." else "the current directory"
    return "none"


def _not_found(path: Path, directory: bool = False) -> DatasetError:
    """'not found' for a path that does not exist: the nearest existing parent, a close name."""
    if path.is_symlink():
        return DatasetError(
            f"{path}: broken symbolic link (it points to {os.readlink(path)}, which does not "
            "exist); expected a dataset file"
        )
    near = _nearest_parent(path)
    close = ""
    if path.parent.is_dir():
        try:
            names = [p.name for p in path.parent.iterdir()]
        except OSError:
            names = []
        match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
        close = f"; did you mean {match[0]!r}?" if match else ""
    ext = path.suffix.lower()
    if directory:
        path = f"{path}{os.sep}"
    elif ext:
        fmt = EXTENSIONS.get(ext)
        what = f"a {fmt} dataset" if fmt else "a dataset file"
        return DatasetError(f"{path}: file not found (nearest existing parent: {near}{close}); expected {what}")
    return DatasetError(
        f"{path}: does not exist (no such file or directory; nearest existing parent: {near}"
        f"{close}); expected a dataset file, a directory of dataset files or a glob pattern"
    )


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


# --------------------------------------------------------------------------- format detection


def _resolve_format(path: Path, fmt: str) -> str:
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


def resolve_delimiter(delimiter: str | None, fmt: str) -> str:
    """The CSV/TSV field separator embed.delimiter names ("" = the format's own)."""
    if not delimiter:
        return "\t" if fmt == "tsv" else ","
    if delimiter in ("tab", "\\t", "\t"):
        return "\t"
    if len(delimiter) == 1 and delimiter not in '"\r\n' and not delimiter.isalnum():
        return delimiter
    raise ConfigError(
        f"embed.delimiter = {delimiter!r}: expected one character that is not a letter, digit, "
        "quote or newline (e.g. ';' or '|'), 'tab', or '' for the format's own (',' for csv, "
        "tab for tsv)"
    )


def _sep_name(sep: str) -> str:
    return {",": "comma", "\t": "tab"}.get(sep, repr(sep))


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


def _first_line(text: str) -> str:
    """The first line that is not blank (the header), without splitting the whole text."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if text[start:end].strip():
            return text[start:end].rstrip("\r")
        start = end + 1
    return ""


def _read_text(path: Path, fmt: str, limits: InputLimits = NO_LIMITS) -> str:
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
# Each reader returns a _Table: for each requested field, the list of raw values in row order,
# plus a function that labels a row index for messages (JSONL adds the line number).


class _Table:
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


def _role(field: str, roles: dict[str, str]) -> str:
    key = roles.get(field)
    return f" ({key})" if key else ""


_GROUP_HINT = (
    " (no group column? set embed.group_field=null: each answer text is then its own group and "
    "evaluate scores exact texts)"
)


def _id_hint(field: str, roles: dict[str, str]) -> str:
    """The way out when an optional column (ids, groups) is missing."""
    return {"embed.id_field": _ID_HINT, "embed.group_field": _GROUP_HINT}.get(roles.get(field), "")


def _close_name(field: str, names: list[str]) -> str:
    """' Did you mean ...?' for a column spelled with other case or spaces."""
    near = [n for n in names if n.strip().casefold() == field.strip().casefold() and n != field]
    if not near:
        near = difflib.get_close_matches(field, names, n=1, cutoff=0.8)
    return f". Did you mean {near[0]!r}?" if near else ""


def _header_line(text: str) -> str:
    for line in text.split("\n"):
        if line.strip():
            return line.rstrip("\r")
    return ""


def _guess_delimiter(text: str, sep: str) -> tuple[str, int] | None:
    """The delimiter the header line seems to use, if not `sep`: csv.Sniffer's pick among , ; tab |,
    when it occurs more often outside double quotes than `sep`. Sniffer sees one line (the header:
    a data row may be what is broken), where every character it holds is equally consistent, so
    its preference among them decides: the most frequent outside quotes first, as people read a
    header; quoted fields, which Sniffer recognises, can still point it at another."""
    header = _header_line(text)
    bare = re.sub(r'"[^"]*"', "", header)
    others = sorted((c for c in _DELIMITER_CANDIDATES if c != sep), key=lambda c: -bare.count(c))
    sniffer = csv.Sniffer()
    sniffer.preferred = others
    try:
        best = sniffer.sniff(header, delimiters="".join(others)).delimiter
    except csv.Error:  # none of them in the header
        return None
    n = bare.count(best)
    return (best, n) if n > bare.count(sep) else None


def _delimiter_hint(text: str, fmt: str, sep: str, explicit: bool) -> str:
    guess = _guess_delimiter(text, sep)
    if guess is None:
        return ""
    best, n = guess
    plural = "s" if n > 1 and best in (",", "\t") else ""
    seen = f"The header line has {n} {_sep_name(best)}{plural}"
    if best == "\t" and not explicit:
        how = "set embed.format=tsv (or name the file .tsv)" if fmt != "tsv" else "set embed.delimiter=tab"
    elif best == "," and fmt == "tsv" and not explicit:
        how = "set embed.format=csv (or name the file .csv)"
    elif best == "\t":
        how = "set embed.delimiter=tab"
    else:
        how = f"set embed.delimiter='{best}' (in a shell: \"embed.delimiter='{best}'\")"
    return f". {seen}: it looks {_sep_name(best)}-separated, not {_sep_name(sep)}-separated; {how}"


def _read_delimited(
    path: Path, text: str, fmt: str, sep: str, fields: list[str], roles: dict[str, str], explicit: bool = False
) -> _Table:
    sep_name = _sep_name(sep)
    try:
        # header=None: the header is read as row 0, so that duplicate names can be refused (pandas
        # would rename the second 'answer' to 'answer.1') and a row longer than the header is an
        # error (with header=0 pandas would silently take the first column as the index).
        # dtype=str + keep_default_na=False: "NA", "null", "nan" stay text; empty cells become ""
        # and are then rejected as empty text with their row number.
        raw = pd.read_csv(io.StringIO(text), sep=sep, header=None, dtype=str, keep_default_na=False, engine="c")
    except pd.errors.EmptyDataError:
        raise DatasetError(
            f"{path}: empty dataset (no header and no rows); expected a header line and at least one data row"
        ) from None
    except (pd.errors.ParserError, ValueError, OverflowError) as e:
        # The parser's own line numbers count file lines including the header.
        detail = _detail(e).replace("Error tokenizing data. C error: ", "")
        if "EOF inside string" in detail:
            at = _unclosed_quote(text, sep)
            if at:
                detail = f"EOF inside string: the double quote opened at line {at[0]}, column {at[1]} is never closed"
        raise DatasetError(
            f"{path}: not valid {fmt.upper()} ({detail}); expected "
            f"{sep_name}-separated values, a header line, the same "
            f"number of fields on every line and balanced double quotes"
            f"{_delimiter_hint(text, fmt, sep, explicit)}"
        ) from None
    if len(raw) < 2:
        raise DatasetError(f"{path}: empty dataset (header only, no data rows); expected at least one data row")
    header = ["" if not isinstance(h, str) else h for h in raw.iloc[0].tolist()]
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(header):
        positions.setdefault(name, []).append(i + 1)
    for name, where in positions.items():
        if name and len(where) > 1:
            cols = ", ".join(map(str, where[:-1])) + f" and {where[-1]}"
            raise DatasetError(
                f"{path}: column {name!r} appears {'twice' if len(where) == 2 else f'{len(where)} times'} in "
                f"the header (columns {cols}); expected each column name once — rename or remove the repeats "
                "(only one of them could be read)"
            )
    for field in fields:
        if field not in positions:
            raise DatasetError(
                f"{path}: missing field {field!r}{_role(field, roles)}; expected a column with that name in "
                f"the header. Available columns: {', '.join(repr(c) for c in header)} ({len(header)} when split "
                f"at {sep_name}s){_close_name(field, header)}{_delimiter_hint(text, fmt, sep, explicit)}"
                f"{_id_hint(field, roles)}"
            )
    body = raw.iloc[1:]
    short_rows: dict[int, int] | None = None

    def empty_note(i: int, field: str) -> str:
        # Pandas fills the cells a short row lacks with "": find the row's real length with the
        # csv module (only on this error path).
        nonlocal short_rows
        if short_rows is None:
            short_rows = _short_rows(text, sep, len(header))
        n = short_rows.get(i)
        return f" (the row has {n} of the header's {len(header)} fields)" if n is not None else ""

    return _Table({f: body[positions[f][0] - 1].tolist() for f in fields}, len(body), empty_note=empty_note)


def _unclosed_quote(text: str, sep: str) -> tuple[int, int] | None:
    """(line, column) of the double quote that opens a quoted field never closed, or None. The
    rules of the CSV parser: a quote opens a quoted field only at the start of a field, and a
    doubled quote inside one is a literal quote."""
    in_quote, field_start, opened, i, n = False, True, -1, 0, len(text)
    while i < n:
        c = text[i]
        if in_quote:
            if c == '"':
                if i + 1 < n and text[i + 1] == '"':
                    i += 2
                    continue
                in_quote = False
        elif c == '"' and field_start:
            in_quote, opened = True, i
        field_start = not in_quote and (c == sep or c in "\r\n")
        i += 1
    if not in_quote:
        return None
    line_start = text.rfind("\n", 0, opened) + 1
    return text.count("\n", 0, opened) + 1, opened - line_start + 1


def _short_rows(text: str, sep: str, width: int) -> dict[int, int]:
    """{data row index: its field count} for rows with fewer fields than the header."""
    out: dict[int, int] = {}
    try:
        records = (r for r in csv.reader(io.StringIO(text, newline=""), delimiter=sep, strict=False) if r)
        next(records, None)  # the header
        for i, rec in enumerate(records):
            if len(rec) < width:
                out[i] = len(rec)
    except csv.Error:
        pass
    return out


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


def _extract_objects(
    path: Path, objs: list[Any], fields: list[str], roles: dict[str, str], label: Callable[[int], str]
) -> _Table:
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
                    f"{path}: missing field {field!r}{_role(field, roles)}: first lacking in {label(i)} "
                    f"({where}); expected every row to have it.{avail}{_close_name(field, keys)}"
                    f"{_id_hint(field, roles)}"
                )
            columns[field].append(value)
    return _Table(columns, len(objs), label)


# JSON objects with a key given twice: json.loads keeps the last value silently, so the hook marks
# such objects and the reader refuses them, naming the row and the key.


class _DupDict(dict):
    dup_key: str = ""


class _JsonLoader:
    def __init__(self):
        self.found_dup = False
        self.decoder = json.JSONDecoder(object_pairs_hook=self.hook)  # one for all lines of a file

    def hook(self, pairs: list[tuple[str, Any]]) -> dict:
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set[str] = set()
            d = _DupDict(d)
            d.dup_key = next(k for k, _ in pairs if k in seen or seen.add(k))
            self.found_dup = True
        return d

    def loads(self, text: str) -> Any:
        return self.decoder.decode(text)


def _find_dup(obj: Any) -> tuple[str, str] | None:
    """(key, where) of the first object holding a repeated key, depth first, or None."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(obj, ())]
    while stack:
        cur, at = stack.pop()
        if isinstance(cur, _DupDict):
            return cur.dup_key, (f"under {'.'.join(at)!r}" if at else "at the top level")
        if isinstance(cur, dict):
            stack.extend((v, (*at, str(k))) for k, v in reversed(list(cur.items())))
        elif isinstance(cur, list):
            stack.extend((v, (*at, f"[{j}]")) for j, v in reversed(list(enumerate(cur))))
    return None


def _dup_error(path: Path, where: str, key: str, inside: str) -> DatasetError:
    return DatasetError(
        f"{path}: {where}: key {key!r} appears twice in one object ({inside}); expected each key "
        "once — JSON keeps only the last value, so the other would be silently lost"
    )


_ARRAY_HINT = "name the file .json or set embed.format=json"


def _number_note(e: ValueError) -> str:
    """json's ValueError for an integer too long to convert, said without its sys.* advice."""
    m = re.search(r"value has (\d+) digits", str(e))
    if m:
        return f"a JSON integer of {m.group(1)} digits (more than Python reads, {sys.get_int_max_str_digits()})"
    return " ".join(str(e).split())[:200]


def _read_jsonl(path: Path, text: str, fields: list[str], roles: dict[str, str]) -> _Table:
    loader = _JsonLoader()
    objs: list[Any] = []
    lines: list[int] = []  # file line number of each data row; blank lines are skipped
    # JSON Lines are separated by "\n" (and "\r\n"); str.splitlines would also split at U+2028,
    # U+0085 and other characters that JSON allows raw inside strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = loader.loads(line)
        except json.JSONDecodeError as e:
            if not objs and line.lstrip().startswith("["):
                raise _jsonl_array_error(path, text, lineno, e) from None
            raise DatasetError(
                f"{path}: invalid JSON on line {lineno}, column {e.colno}: {e.msg}; "
                "expected one JSON object per line (JSON Lines)"
            ) from None
        except RecursionError:
            raise DatasetError(
                f"{path}: line {lineno}: JSON nested too deeply to read; expected one JSON object "
                "per line with a few levels of nesting"
            ) from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise DatasetError(
                f"{path}: line {lineno}: {_number_note(e)}; expected one JSON object per line "
                "with numbers of ordinary size"
            ) from None
        if not isinstance(obj, dict):
            hint = (
                " (a JSON array file should be named .json, or set embed.format=json)" if isinstance(obj, list) else ""
            )
            found = "null" if obj is None else type(obj).__name__
            raise DatasetError(f"{path}: line {lineno}: expected a JSON object, found {found}{hint}")
        if loader.found_dup:
            key, inside = _find_dup(obj)
            raise _dup_error(path, f"row {len(objs) + 1} (line {lineno})", key, inside)
        objs.append(obj)
        lines.append(lineno)
    if not objs:
        raise DatasetError(
            f"{path}: empty dataset (no JSON objects, only blank lines); expected at least one JSON object per line"
        )
    return _extract_objects(path, objs, fields, roles, lambda i: f"row {i + 1} (line {lines[i]})")


def _jsonl_array_error(path: Path, text: str, lineno: int, e: json.JSONDecodeError) -> DatasetError:
    """A .jsonl file whose first line opens a JSON array spread over lines."""
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        whole = None
    if isinstance(whole, list):
        return DatasetError(
            f"{path}: this is a JSON array (line {lineno} opens it with '['), not JSON Lines "
            f"(one object per line); {_ARRAY_HINT}"
        )
    return DatasetError(
        f"{path}: invalid JSON on line {lineno}, column {e.colno}: {e.msg}; expected one JSON "
        f"object per line (JSON Lines). Line {lineno} starts with '[': if the file is one JSON "
        f"array, {_ARRAY_HINT}"
    )


def _read_json(path: Path, text: str, fields: list[str], roles: dict[str, str]) -> _Table:
    loader = _JsonLoader()
    try:
        data = loader.loads(text)
    except json.JSONDecodeError as e:
        hint = ""
        if e.msg == "Extra data":
            hint = (
                " (several top-level values: if this is one object per line, name it .jsonl or set embed.format=jsonl)"
            )
        raise DatasetError(
            f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}{hint}; "
            "expected a top-level array of objects"
        ) from None
    except RecursionError:
        raise DatasetError(
            f"{path}: JSON nested too deeply to read; expected a top-level array of objects with "
            "a few levels of nesting"
        ) from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise DatasetError(
            f"{path}: {_number_note(e)}; expected a top-level array of objects holding numbers of ordinary size"
        ) from None
    if not isinstance(data, list):
        found = "null" if data is None else ("an object" if isinstance(data, dict) else type(data).__name__)
        raise DatasetError(f"{path}: expected a top-level JSON array of objects, found {found}")
    if not data:
        raise DatasetError(f"{path}: empty dataset (empty JSON array); expected at least one object")
    if loader.found_dup:
        for i, obj in enumerate(data):
            dup = _find_dup(obj)
            if dup:
                raise _dup_error(path, f"row {i + 1}", *dup)
    return _extract_objects(path, data, fields, roles, lambda i: f"row {i + 1}")


def _read_parquet(path: Path, fields: list[str], roles: dict[str, str], limits: InputLimits = NO_LIMITS) -> _Table:
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
        raise DatasetError(f"{path}: not a Parquet file (expected the 'PAR1' magic at the start, found {head!r})")
    if size < 12 or tail != b"PAR1":
        raise DatasetError(
            f"{path}: truncated or corrupt Parquet file (expected the 'PAR1' "
            f"magic at the end, found {tail!r}); re-export or re-download it"
        )
    try:
        pfile = pq.ParquetFile(path)
        schema = pfile.schema_arrow
        n_rows = pfile.metadata.num_rows
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as e:
        raise DatasetError(f"{path}: corrupt Parquet file ({_detail(e)}); expected a readable Parquet file") from None
    if n_rows == 0:
        raise DatasetError(f"{path}: empty dataset (Parquet file has 0 rows); expected at least one row")
    check_columns(path, len(schema.names), limits, "its schema")
    check_rows(str(path), n_rows, limits, "before reading it")
    _check_parquet_names(path, schema)

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
            names = _flatten_schema(schema)
            raise DatasetError(
                f"{path}: missing field {field!r}{_role(field, roles)}; expected a Parquet column (or struct "
                f"field path) with that name. Available fields: {', '.join(repr(n) for n in names)}"
                f"{_close_name(field, names)}{_id_hint(field, roles)}"
            )
        plans[field] = (parts[0], parts[1:])

    try:
        table = pfile.read(columns=sorted({top for top, _ in plans.values()}))
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as e:
        raise DatasetError(f"{path}: corrupt Parquet file ({_detail(e)}); expected a readable Parquet file") from None
    if table.num_rows != n_rows:
        raise DatasetError(
            f"{path}: corrupt Parquet file (the footer says {n_rows} rows, the data holds "
            f"{table.num_rows}); expected a readable Parquet file"
        )
    columns: dict[str, list[Any]] = {}
    type_note: dict[str, str] = {}
    for field, (top, sub) in plans.items():
        arr = table.column(top)
        for part in sub:
            # struct_field yields null where any enclosing struct is null, which is then
            # reported as a null value for that row.
            arr = pc.struct_field(arr, part)
        try:
            columns[field] = arr.to_pylist()
        except UnicodeDecodeError:
            raise _parquet_utf8_error(path, arr, field) from None
        type_note[field] = f" (Parquet type {arr.type})"
    return _Table(columns, n_rows, type_note=type_note)


def _check_parquet_names(path: Path, schema) -> None:
    """Refuse a column (or struct field) name given twice: only one of them could be read."""
    import pyarrow as pa

    def check(names: list[str], where: str) -> None:
        positions: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            positions.setdefault(n, []).append(i + 1)
        for n, at in positions.items():
            if len(at) > 1:
                cols = ", ".join(map(str, at[:-1])) + f" and {at[-1]}"
                raise DatasetError(
                    f"{path}: column {n!r} appears {'twice' if len(at) == 2 else f'{len(at)} times'}"
                    f" {where} (positions {cols}); expected each column name once"
                )

    def walk(prefix: str, typ) -> None:
        check([typ.field(i).name for i in range(typ.num_fields)], f"in struct column {prefix!r}")
        for i in range(typ.num_fields):
            f = typ.field(i)
            if pa.types.is_struct(f.type):
                walk(f"{prefix}.{f.name}", f.type)

    check(list(schema.names), "in the Parquet schema")
    for f in schema:
        if pa.types.is_struct(f.type):
            walk(f.name, f.type)


def _parquet_utf8_error(path: Path, arr, field: str) -> DatasetError:
    """The first value of a string column that is not valid UTF-8."""
    import pyarrow as pa

    values = arr.cast(pa.large_binary()).to_pylist() if hasattr(arr, "cast") else []
    for i, b in enumerate(values):
        if b is None:
            continue
        try:
            b.decode("utf-8")
        except UnicodeDecodeError as e:
            return DatasetError(
                f"{path}: row {i + 1}, field {field!r}: not valid UTF-8 at byte {e.start} of the "
                f"text ({b[e.start : e.start + 4]!r}); expected UTF-8 text in a Parquet string column"
            )
    return DatasetError(f"{path}: field {field!r}: not valid UTF-8; expected UTF-8 text in a Parquet string column")


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


def _check_text(path: Path, table: _Table, field: str, skip: set[int] | None = None) -> list[str]:
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


def _check_chars(path: Path, table: _Table, field: str, values: list, what: str) -> None:
    """Refuse the first text holding a NUL or a lone surrogate. One search over the column
    joined (fast, in C); the row is looked for only when there is one."""
    if not _BAD_CHAR.search("\n".join(v for v in values if isinstance(v, str))):
        return
    for i, v in enumerate(values):
        if isinstance(v, str):
            err = _bad_char(path, f"{table.label(i)}, {what} {field!r}", v)
            if err is not None:
                raise err


def _check_ids(path: Path, table: _Table, field: str) -> list[str]:
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


def _check_groups(path: Path, table: _Table, field: str) -> list[str]:
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


def _build_frame(
    path: Path,
    table: _Table,
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
