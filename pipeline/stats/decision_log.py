"""What `./dev decide` has decided before: a small record per decision (reports/decisions/history.jsonl),
appended before its first run, so that a second look at the same runs (the same commit, sharing
experiments of both arms) under another metric is known for what it is, labelled "exploratory",
and so that decision pages never overwrite each other (docs/decisions.md, "One decided metric").
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from pipeline.core.paths import REPORTS_DIR

DECISIONS_DIR = REPORTS_DIR / "decisions"
HISTORY = "history.jsonl"


def history(directory: Path = DECISIONS_DIR) -> list[dict]:
    """The records so far, oldest first (a line that cannot be read is skipped: it is a log)."""
    path = Path(directory) / HISTORY
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def record(directory: Path, entry: dict) -> None:
    """Append one record (a line of JSON)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stamped = {**entry, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with open(directory / HISTORY, "a", encoding="utf-8") as f:
        f.write(json.dumps(stamped, sort_keys=True) + "\n")


def first_look(directory: Path, commit: str, a_experiments: Sequence[str], b_experiments: Sequence[str]) -> dict | None:
    """The earliest recorded decision on the same runs: from the same commit, sharing experiments
    of both arms with these. None when these runs were never decided on."""
    a, b = set(a_experiments), set(b_experiments)
    for entry in history(directory):
        if entry.get("commit") != commit:
            continue
        if a & set(entry.get("a_experiments", ())) and b & set(entry.get("b_experiments", ())):
            return entry
    return None


def unique_name(directory: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3`, ... : the first whose page and record are not taken."""
    taken = {e.get("name") for e in history(directory)}
    directory = Path(directory)

    def free(n: str) -> bool:
        return n not in taken and not (directory / f"{n}.json").exists() and not (directory / f"{n}.html").exists()

    if free(name):
        return name
    k = 2
    while not free(f"{name}-{k}"):
        k += 1
    return f"{name}-{k}"


def name_taken(directory: Path, name: str) -> bool:
    return unique_name(directory, name) != name
