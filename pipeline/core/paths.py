"""Where things are. Everything resolves from the repository root, not the working directory,
so `dvc exp run --temp/--queue` (which run in a copy elsewhere) still find the project's store.

And the one rule for what a stage reads: every path it reads (data, shards, telemetry, metrics,
model, checkpoint, teacher) resolves, `..` and symbolic links followed, inside the project unless
run.allow_external_paths is true. A stage states its run.allow_external_paths once
(`reading_rule`, stages/_cli.py does it around the stage's work); every reader asks
`check_readable_inside`. Outside a stage (a library call, a test) nothing is stated and nothing
is refused."""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import ConfigError

# pipeline/core/paths.py -> repo root is two levels up.
REPO_ROOT = Path(os.environ.get("ENERGY_FLOW_ROOT", Path(__file__).resolve().parents[2]))
ALLOW_KEY = "run.allow_external_paths"


def repo_path(p: str | os.PathLike) -> Path:
    """A path from config: absolute stays as is, relative is taken from the repository root."""
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p


# Fixed output locations (dvc.yaml lists the same paths).
METRICS_DIR = REPO_ROOT / "metrics"
TELEMETRY_DIR = REPO_ROOT / "telemetry"
REPORTS_DIR = REPO_ROOT / "reports"

# The running stage's run.allow_external_paths; unset: no stage runs (a library call, a test).
# A context variable, as the tracking session is: nothing to reset between stages run in one process.
_EXTERNAL_ALLOWED: ContextVar[bool] = ContextVar("energy_flow_external_paths_allowed")


@contextmanager
def reading_rule(allow_external: bool) -> Iterator[None]:
    """Within: paths read must resolve inside the project unless `allow_external`."""
    token = _EXTERNAL_ALLOWED.set(bool(allow_external))
    try:
        yield
    finally:
        _EXTERNAL_ALLOWED.reset(token)


def outside_project(path: str | os.PathLike) -> Path | None:
    """Where `path` (relative: from the repository root) resolves when that is outside the
    project, else None."""
    root = REPO_ROOT.resolve()
    resolved = (root / Path(path)).resolve()  # an absolute path replaces root
    return None if resolved.is_relative_to(root) else resolved


def outside_message(what: str, path: str | os.PathLike, resolved: Path) -> str:
    return (
        f"{what} = {str(path)!r} resolves to {resolved}, outside the project ({REPO_ROOT.resolve()}); "
        f"expected a path inside it, or set {ALLOW_KEY}=true to allow it"
    )


def check_readable_inside(path: str | os.PathLike, what: str) -> Path:
    """`path`, refused (ConfigError) when the running stage does not allow external paths and it
    resolves outside the project. `what` names where the path came from, for the message: a
    parameter ("parameter 'embed.teacher'") or a file a stage wrote ("the train stage's output")."""
    if _EXTERNAL_ALLOWED.get(True) is False:
        resolved = outside_project(path)
        if resolved is not None:
            raise ConfigError(outside_message(what, path, resolved))
    return Path(path)
