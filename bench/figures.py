"""Figures in Markdown that name their source, and the check that each equals it: a measured figure
is followed by `<!-- fig: FILE#KEY [*F] -->`, and a measured-looking number without one is
`uncited` unless its line says `<!-- fig: setting -->` or `<!-- fig: example -->` (the rules:
docs/benchmarks.md, "Quoting a figure in Markdown"). The figure is the last number before the
comment on its line, thousands commas allowed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

COMMENT = re.compile(r"<!--\s*fig:\s*(?P<path>[^#\s]+)#(?P<key>\S+)(?:\s+\*(?P<factor>[0-9.eE+-]+))?\s*-->")
SETTING = re.compile(r"<!--\s*fig:\s*(?:setting|example)\s*-->")
NUMBER = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-+]?\d+(?:\.\d+)?")
# A number followed by a unit that makes it a measurement of speed, time, size or a ratio.
MEASURED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[x×]|\s?(?:ms|s|min|KB|MB|GB|MiB|GiB|(?:questions|texts|samples|steps)/s|GFLOP/s))(?![\w/])"
)


@dataclass(frozen=True)
class Citation:
    file: str
    line: int
    printed: str
    source: str
    key: str
    factor: float

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.printed} <- {self.source}#{self.key}"


def prose(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code:
            yield n, line


def citations(text: str, file: str = "") -> Iterator[Citation]:
    """Every source comment outside code blocks, with the number printed before it."""
    for n, line in prose(text):
        for m in COMMENT.finditer(line):
            before = COMMENT.sub("", line[: m.start()])
            numbers = NUMBER.findall(before)
            printed = numbers[-1] if numbers else ""
            yield Citation(file, n, printed, m["path"], m["key"], float(m["factor"] or 1))


def lookup(data: dict | list, key: str):
    """`key` in `data`, or a dotted path into it (the longest key that exists at each level); in
    a list, a part is the item's index (`arms.0.mean.value`: the first arm's mean)."""
    if isinstance(data, list):
        head, _, rest = key.partition(".")
        if not head.isdigit() or int(head) >= len(data):
            raise KeyError(key)
        return data[int(head)] if not rest else lookup(data[int(head)], rest)
    if key in data:
        return data[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in data and isinstance(data[head], (dict, list)):
            return lookup(data[head], ".".join(parts[i:]))
    raise KeyError(key)


def value_of(root: Path, source: str, key: str):
    data = json.loads((root / source).read_text())
    if isinstance(data.get("figures"), dict):
        try:
            return lookup(data["figures"], key)
        except KeyError:
            pass
    return lookup(data, key)


def mismatch(root: Path, c: Citation) -> Optional[str]:
    """Why the citation does not hold (None: it does)."""
    if not c.printed:
        return f"{c.where()}: no number before the comment"
    try:
        value = value_of(root, c.source, c.key)
    except FileNotFoundError:
        return f"{c.where()}: {c.source} does not exist"
    except KeyError:
        return f"{c.where()}: {c.source} has no {c.key!r}"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{c.where()}: the source's value is {value!r}, not a number"
    printed = float(c.printed.replace(",", ""))
    want = round(value * c.factor, len(c.printed.partition(".")[2]))  # to the decimals it is printed with
    if abs(printed - want) > 1e-9 * max(1.0, abs(want)):
        return f"{c.where()}: printed {c.printed}, the source says {want} ({value!r} x {c.factor:g})"
    return None


def uncited(text: str, file: str = "") -> list[str]:
    """Measured-looking numbers without a source: in each stretch of a line that ends with a
    source comment only the last number is cited; the others, and any after the line's last
    comment, are not. Code blocks, `code` and lines marked as a setting or an example are skipped."""
    out = []
    for n, line in prose(text):
        if SETTING.search(line):
            continue
        hits: list[str] = []
        start = 0
        for m in [*COMMENT.finditer(line), None]:
            stretch = re.sub(r"`[^`]*`", " ", line[start : m.start() if m else len(line)])
            found = [h.strip() for h in MEASURED.findall(stretch)]
            if m is not None and found:
                found = found[:-1]  # the cited one
            hits += found
            start = m.end() if m else len(line)
        if hits:
            out.append(f"{file}:{n}: {', '.join(hits)}")
    return out
