"""A benchmark run as a user runs it (`python -m bench.<name> ...` from the repository root), and
the JSON object its last stdout line holds."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.core.paths import REPO_ROOT


def run_module(module: str, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def bench_json(module: str, *args: str, timeout: int = 600, env: dict | None = None) -> dict:
    """Run it; it must exit 0; its result."""
    proc = run_module(module, *args, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
