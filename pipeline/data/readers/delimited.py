"""CSV and TSV: the header, the rows, and where a file that does not parse went wrong (an
unclosed quote, another delimiter than the one expected, a short row)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd

from pipeline.core.config.schema import DELIMITER
from pipeline.core.errors import ConfigError, DatasetError
from pipeline.data.readers.common import Table, close_name, detail, first_line, id_hint, repeated_name, role

# The delimiters a header is checked for when a field is missing from a CSV/TSV file.
_DELIMITER_CANDIDATES = (",", ";", "\t", "|")


def resolve_delimiter(delimiter: str | None, fmt: str) -> str:
    """The CSV/TSV field separator embed.delimiter names ("" = the format's own)."""
    if not delimiter:
        return "\t" if fmt == "tsv" else ","
    if not DELIMITER.allows(delimiter):
        raise ConfigError(f"embed.delimiter = {delimiter!r}: expected {DELIMITER.expected}")
    return "\t" if delimiter in ("tab", "\\t") else delimiter


def _sep_name(sep: str) -> str:
    return {",": "comma", "\t": "tab"}.get(sep, repr(sep))


def _guess_delimiter(text: str, sep: str) -> tuple[str, int] | None:
    """The delimiter the header line seems to use, if not `sep`: csv.Sniffer's pick among , ; tab |,
    when it occurs more often outside double quotes than `sep`. Sniffer sees one line (the header:
    a data row may be what is broken), where every character it holds is equally consistent, so
    its preference among them decides: the most frequent outside quotes first, as people read a
    header; quoted fields, which Sniffer recognises, can still point it at another."""
    header = first_line(text)
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


def read_delimited(
    path: Path, text: str, fmt: str, sep: str, fields: list[str], roles: dict[str, str], explicit: bool = False
) -> Table:
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
        # The parser's own line numbers count file lines including the header. Its ParserError is
        # one type for every fault: only its text tells an unclosed quote from a short row.
        what = detail(e).replace("Error tokenizing data. C error: ", "")
        if "EOF inside string" in what:
            at = _unclosed_quote(text, sep)
            if at:
                what = f"EOF inside string: the double quote opened at line {at[0]}, column {at[1]} is never closed"
        raise DatasetError(
            f"{path}: not valid {fmt.upper()} ({what}); expected "
            f"{sep_name}-separated values, a header line, the same "
            f"number of fields on every line and balanced double quotes"
            f"{_delimiter_hint(text, fmt, sep, explicit)}"
        ) from None
    if len(raw) < 2:
        raise DatasetError(f"{path}: empty dataset (header only, no data rows); expected at least one data row")
    header = ["" if not isinstance(h, str) else h for h in raw.iloc[0].tolist()]
    repeat = repeated_name(header, blank_ok=True)
    if repeat:
        name, times, cols = repeat
        raise DatasetError(
            f"{path}: column {name!r} appears {times} in the header (columns {cols}); expected each column "
            "name once — rename or remove the repeats (only one of them could be read)"
        )
    for field in fields:
        if field not in header:
            raise DatasetError(
                f"{path}: missing field {field!r}{role(field, roles)}; expected a column with that name in "
                f"the header. Available columns: {', '.join(repr(c) for c in header)} ({len(header)} when split "
                f"at {sep_name}s){close_name(field, header)}{_delimiter_hint(text, fmt, sep, explicit)}"
                f"{id_hint(field, roles)}"
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

    return Table({f: body[header.index(f)].tolist() for f in fields}, len(body), empty_note=empty_note)


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
