"""Bounds on what a dataset read may hold, each refused with the file, the limit, what the file
holds and the key that raises it.

A dataset file is read whole into memory, and a parser's memory grows with more than the file's
bytes: every column of a CSV costs pandas an object of its own, every JSON key a Python string.
So the file's size is checked before it is read, its line lengths (CSV, TSV, JSON Lines: one row
a line) before it is parsed, its header's columns (CSV, TSV, Parquet) before the rows are, and its
rows as soon as they are known (Parquet: from its footer, before reading). conf/config.yaml says
why each default is far above any real dataset; None is no bound (a library call that passes none)."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import DatasetError

_MB = 1 << 20
_KB = 1 << 10


@dataclass(frozen=True)
class InputLimits:
    max_mb: float | None = None  # embed.max_input_mb: bytes of one file
    max_line_kb: float | None = None  # embed.max_line_kb: one line of a CSV, TSV or JSON Lines file
    max_columns: int | None = None  # embed.max_input_columns: fields of a header, columns of a Parquet file
    max_rows: int | None = None  # embed.max_input_rows: data rows of the dataset, all files together

    @classmethod
    def of(cls, embed_cfg) -> InputLimits:
        return cls(
            max_mb=embed_cfg.max_input_mb,
            max_line_kb=embed_cfg.max_line_kb,
            max_columns=embed_cfg.max_input_columns,
            max_rows=embed_cfg.max_input_rows,
        )


def _raise(key: str, limit: float, unit: str) -> str:
    return f"raise {key} (now {limit:g}{unit}) if the data really is so"


def check_size(path: Path, size: int, limits: InputLimits) -> None:
    if limits.max_mb is not None and size > limits.max_mb * _MB:
        raise DatasetError(
            f"{path}: {size / _MB:,.1f} MB, more than embed.max_input_mb = {limits.max_mb:g} MB; refused "
            f"before reading it (a file is read whole, and parsing takes a few times its size in memory): "
            f"{_raise('embed.max_input_mb', limits.max_mb, ' MB')} and the machine has the memory"
        )


def check_lines(path: Path, data: bytes, limits: InputLimits) -> None:
    """Before parsing a CSV, TSV or JSON Lines file: no line longer than max_line_kb. Scanned in C
    (a regular expression anchored at line starts), once over the bytes."""
    if limits.max_line_kb is None:
        return
    limit = int(limits.max_line_kb * _KB)
    long_line = re.compile(rb"^[^\n]{%d}" % (limit + 1), re.MULTILINE).search(data)
    if long_line is None:
        return
    start = long_line.start()
    end = data.find(b"\n", start)
    length = (len(data) if end < 0 else end) - start
    line = data.count(b"\n", 0, start) + 1
    raise DatasetError(
        f"{path}: line {line} is {length / _KB:,.0f} KB long, more than embed.max_line_kb = "
        f"{limits.max_line_kb:g} KB; refused before parsing it: one line should hold one row of texts "
        f"(a line this long is usually a file without line breaks, or in another format); "
        f"{_raise('embed.max_line_kb', limits.max_line_kb, ' KB')}"
    )


def header_fields(header: str, sep: str) -> int:
    """Fields of a CSV/TSV header line, by the csv module's rules (quoted separators are text)."""
    try:
        return len(next(csv.reader([header], delimiter=sep, strict=False), []))
    except csv.Error:  # a field longer than csv's own limit: count separators instead
        return header.count(sep) + 1


def check_columns(path: Path, columns: int, limits: InputLimits, where: str = "the header") -> None:
    if limits.max_columns is not None and columns > limits.max_columns:
        raise DatasetError(
            f"{path}: {where} has {columns:,} columns, more than embed.max_input_columns = "
            f"{limits.max_columns:,}; refused before reading its rows (each column costs memory of its "
            f"own; a dataset of text pairs needs a few); {_raise('embed.max_input_columns', limits.max_columns, '')}"
        )


def check_rows(where: str, rows: int, limits: InputLimits, when: str) -> None:
    """`when`: what has (not) happened yet, for the message."""
    if limits.max_rows is not None and rows > limits.max_rows:
        raise DatasetError(
            f"{where}: {rows:,} rows, more than embed.max_input_rows = {limits.max_rows:,}; refused {when}; "
            f"{_raise('embed.max_input_rows', limits.max_rows, '')} (or take a subset with embed.max_rows)"
        )
