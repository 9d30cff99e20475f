"""Where things are. Everything resolves from the repository root, not the working directory,
so `dvc exp run --temp/--queue` (which run in a copy elsewhere) still find the project's store."""

from __future__ import annotations

import os
from pathlib import Path

# pipeline/core/paths.py -> repo root is two levels up.
REPO_ROOT = Path(os.environ.get("ENERGY_FLOW_ROOT", Path(__file__).resolve().parents[2]))


def repo_path(p: str | os.PathLike) -> Path:
    """A path from config: absolute stays as is, relative is taken from the repository root."""
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p


# Fixed output locations (dvc.yaml lists the same paths).
METRICS_DIR = REPO_ROOT / "metrics"
TELEMETRY_DIR = REPO_ROOT / "telemetry"
REPORTS_DIR = REPO_ROOT / "reports"
