"""`python -m tools.team ...` as a user runs it, for the tests of the team stack: with no MLFLOW_*
variable of the test run's own, so only the stack's folder decides where things go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.core.paths import REPO_ROOT


def team(*args: str, folder: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "tools.team", *args, "--dir", str(folder)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
