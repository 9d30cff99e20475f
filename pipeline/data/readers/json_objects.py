"""JSON (one top-level array of objects) and JSON Lines (one object per line), with dotted field
paths into nested objects; a key given twice in one object is refused."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from pipeline.core.errors import DatasetError
from pipeline.data.readers.common import Table, close_name, id_hint, role


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
) -> Table:
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
                    f"{path}: missing field {field!r}{role(field, roles)}: first lacking in {label(i)} "
                    f"({where}); expected every row to have it.{avail}{close_name(field, keys)}"
                    f"{id_hint(field, roles)}"
                )
            columns[field].append(value)
    return Table(columns, len(objs), label)


# JSON objects with a key given twice: json.loads keeps the last value silently, so the hook marks
# such objects and the reader refuses them, naming the row and the key.


class _DupDict(dict):
    dup_key: str = ""


class JsonLoader:
    def __init__(self):
        self.found_dup = False
        self.loads = json.JSONDecoder(object_pairs_hook=self.hook).decode  # one decoder for all lines of a file

    def hook(self, pairs: list[tuple[str, Any]]) -> dict:
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set[str] = set()
            d = _DupDict(d)
            d.dup_key = next(k for k, _ in pairs if k in seen or seen.add(k))
            self.found_dup = True
        return d


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


def _one_value_then_more(text: str) -> bool:
    """Whether `text` is one complete JSON value followed by more (JSON Lines, or several values):
    the decoder's error says so only in its message text, so the first value is decoded alone."""
    try:
        json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip(" \t\n\r")))  # JSON's own whitespace
    except (ValueError, RecursionError):
        return False
    return True


def _number_note(e: ValueError) -> str:
    """json's ValueError for an integer too long to convert, said without its sys.* advice. The
    digit count is only in its text (a plain ValueError): without it, the text itself, cut short."""
    m = re.search(r"value has (\d+) digits", str(e))
    if m:
        return f"a JSON integer of {m.group(1)} digits (more than Python reads, {sys.get_int_max_str_digits()})"
    return " ".join(str(e).split())[:200]


def read_jsonl(path: Path, text: str, fields: list[str], roles: dict[str, str]) -> Table:
    loader = JsonLoader()
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


def read_json(path: Path, text: str, fields: list[str], roles: dict[str, str]) -> Table:
    loader = JsonLoader()
    try:
        data = loader.loads(text)
    except json.JSONDecodeError as e:
        hint = ""
        if _one_value_then_more(text):
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
