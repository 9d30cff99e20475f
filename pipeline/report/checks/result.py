"""A check's verdict: its status, a one-line summary, the evidence behind it and the fix to try.

Read as a mapping too (result["status"], result["pass"]...), with the keys in the order the report
and the metrics files have always had, so whatever reads a check's result by key reads it as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# "n/a": the check does not apply to this run (the scaler check on an fp32 run): unlike "skip",
# nothing is missing, so the verdict line does not mention it. The order is the report's: what
# needs attention first.
STATUSES = ("fail", "warn", "skip", "pass", "n/a")
STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
KEYS = ("status", "pass", "summary", "evidence", "fix")


def plain(value: Any) -> Any:
    """numpy scalars -> Python scalars, so evidence serialises as JSON as it is."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True, eq=False)
class CheckResult(Mapping):
    """`fix` is dropped on a pass: there is nothing to mend."""

    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status {self.status!r}: expected one of {STATUSES}")
        object.__setattr__(self, "evidence", {k: plain(v) for k, v in self.evidence.items()})
        if self.status == "pass":
            object.__setattr__(self, "fix", None)

    @property
    def passed(self) -> bool:
        """Only a failure is not a pass: a warning or a skip leaves the run stable."""
        return self.status != "fail"

    def __getitem__(self, key: str) -> Any:
        if key == "pass":
            return self.passed
        if key in KEYS:
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __len__(self) -> int:
        return len(KEYS)

    def as_dict(self) -> dict[str, Any]:
        return {k: self[k] for k in KEYS}
