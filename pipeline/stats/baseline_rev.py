"""A baseline from another git revision (`./dev decide --baseline REV`): did my code change help?

Arm A is trained from REV's code in a git worktree under .dvc/tmp/baselines/<commit>, with its
own DVC queue and cache, arm B from the workspace (docs/decisions.md, "--baseline REV"). Its own
cache: a stage output restored from the project's run cache would skip the train stage, whose
MLflow run (runs/train.json, in the worktree's store) the evaluate stage needs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipeline.core.errors import PipelineError

BASELINES = Path(".dvc") / "tmp" / "baselines"


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PipelineError(f"`git {' '.join(args)}` in {root} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc.stdout.strip()


def resolve(root: Path, rev: str) -> str:
    """The commit `rev` names, or an error that says what to give."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise PipelineError(
            f"--baseline {rev!r}: not a git revision of {root} (give a branch, tag or commit: `git log --oneline` "
            "lists them)"
        )
    return proc.stdout.strip()


def worktree(root: Path, rev: str) -> tuple[Path, str]:
    """(path, commit): a git worktree of `rev` for A's experiments, made once per commit and reused."""
    root = Path(root)
    sha = resolve(root, rev)
    path = root / BASELINES / sha[:12]
    if (path / ".git").exists():
        if _git(path, "rev-parse", "HEAD") != sha:
            raise PipelineError(f"{path}: a baseline worktree not at {sha[:12]}; remove it (git worktree remove)")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "worktree", "prune")  # a worktree directory removed by hand leaves a stale entry
        _git(root, "worktree", "add", "--detach", str(path), sha)
    return path, sha
