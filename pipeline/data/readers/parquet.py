"""Parquet, read through pyarrow: only the columns needed, struct fields by dotted path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.errors import DatasetError
from pipeline.data.input_limits import InputLimits, check_columns, check_rows
from pipeline.data.readers.common import NO_LIMITS, Table, close_name, detail, id_hint, repeated_name, role


def read_parquet(path: Path, fields: list[str], roles: dict[str, str], limits: InputLimits = NO_LIMITS) -> Table:
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
        raise DatasetError(f"{path}: corrupt Parquet file ({detail(e)}); expected a readable Parquet file") from None
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
            names = [name for name, _ in _fields(schema)]
            raise DatasetError(
                f"{path}: missing field {field!r}{role(field, roles)}; expected a Parquet column (or struct "
                f"field path) with that name. Available fields: {', '.join(repr(n) for n in names)}"
                f"{close_name(field, names)}{id_hint(field, roles)}"
            )
        plans[field] = (parts[0], parts[1:])

    try:
        table = pfile.read(columns=sorted({top for top, _ in plans.values()}))
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as e:
        raise DatasetError(f"{path}: corrupt Parquet file ({detail(e)}); expected a readable Parquet file") from None
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
    return Table(columns, n_rows, type_note=type_note)


def _check_parquet_names(path: Path, schema) -> None:
    """Refuse a column (or struct field) name given twice: only one of them could be read."""
    import pyarrow as pa

    def check(names: list[str], where: str) -> None:
        repeat = repeated_name(names)
        if repeat:
            name, times, cols = repeat
            raise DatasetError(
                f"{path}: column {name!r} appears {times} {where} (positions {cols}); expected each column name once"
            )

    check(list(schema.names), "in the Parquet schema")
    for name, field in _fields(schema):
        if pa.types.is_struct(field.type):
            check([f.name for f in field.type], f"in struct column {name!r}")


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


def _fields(fields, prefix: str = ""):
    """(dotted name, field) of every column and struct field below it, depth first."""
    import pyarrow as pa

    for f in fields:
        yield prefix + f.name, f
        if pa.types.is_struct(f.type):
            yield from _fields(f.type, f"{prefix}{f.name}.")
