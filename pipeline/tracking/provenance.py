"""What a run is tagged with about where it came from: the code (git commit, dirty flag and the
uncommitted diff), the device, the DVC experiment, and what dvc.lock records for a stage."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from typing import Any

from pipeline.core.paths import REPO_ROOT

DIFF_ARTIFACT = "git/diff.patch"  # a dirty run's uncommitted changes, against GIT_COMMIT
GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own source tags (mlflow.utils.mlflow_tags)
GIT_DIRTY = "mlflow.source.git.dirty"
# Files DVC itself rewrites while a pipeline runs: a change there does not make the code dirty.
_DVC_HOUSEKEEPING = (":(exclude)dvc.lock", ":(exclude,glob)**/.gitignore")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_provenance() -> tuple[dict[str, str], str]:
    """Tags naming the code a run used, and the uncommitted diff that made it dirty ("" if none).

    The commit is the experiment's baseline under `dvc exp run` (DVC_EXP_BASELINE_REV): a --temp
    or --queue copy has the changes committed onto a private stash commit, so `git status` there
    is clean although the code differs from anything the user has; diffing against the baseline
    catches that. Tracked files only (DVC outputs are git-ignored), and not DVC's own housekeeping
    (dvc.lock, .gitignore), which DVC rewrites mid-pipeline."""
    commit = os.environ.get("DVC_EXP_BASELINE_REV") or _git("rev-parse", "HEAD")
    diff = _git("diff", "--no-color", "--no-ext-diff", commit, "--", ".", *_DVC_HOUSEKEEPING) if commit else None
    # MLflow's own tags (its UI shows the commit on the run page), set explicitly: MLflow's git
    # context would record the temp copy's stash commit under --temp / --queue.
    tags = {GIT_COMMIT: commit or "unknown", GIT_DIRTY: "unknown" if diff is None else str(bool(diff)).lower()}
    if diff:
        tags["git.diff.sha256"] = hashlib.sha256(diff.encode()).hexdigest()[:16]
    return tags, diff or ""


def device_tags(device: Any = "cpu") -> dict[str, str]:
    """The device a stage computes on, and what it is (GPU name, or the CPU model and cores)."""
    import torch

    # numerics_info: what decides the bits (the same numbers on another machine need the same).
    from pipeline.core.numerics import cpu_model, numerics_info

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{cpu_model()} ({os.cpu_count()} cores)"
    return {"device": str(device), "device.name": name, **numerics_info()}


def provenance(preset: str) -> tuple[dict[str, str], str]:
    """A new run's tags: git commit and dirty flag, the dvc.lock digest, the DVC experiment,
    preset, host, torch version; and the uncommitted diff (see git_provenance)."""
    import torch

    git_tags, diff = git_provenance()
    tags = {**git_tags, "preset": preset, "host": socket.gethostname(), "torch.version": torch.__version__}
    for env, tag in (("DVC_EXP_NAME", "dvc.exp_name"), ("DVC_EXP_BASELINE_REV", "dvc.exp_baseline")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    # dvc.lock as the stage found it: the recorded state of the stages before this one.
    lock = REPO_ROOT / "dvc.lock"
    if lock.is_file():
        tags["dvc.lock.sha256"] = hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    return tags, diff


def stage_lock_tags(stage: str) -> dict[str, str]:
    """`dvc.<stage>.sha256`: a digest of what dvc.lock records for `stage` (its command, the hash
    of every dependency, its params), so two runs share it exactly when DVC holds their stage to
    be the same code, data and parameters. DVC writes a stage's entry right after the stage
    runs, so evaluate reads train's. Only under DVC (it sets DVC_STAGE): a stage started by
    hand may not match what dvc.lock says."""
    from omegaconf import OmegaConf

    lock = REPO_ROOT / "dvc.lock"
    if not os.environ.get("DVC_STAGE") or not lock.is_file():
        return {}
    entry = (OmegaConf.to_container(OmegaConf.load(lock)).get("stages") or {}).get(stage)
    if not entry:
        return {}
    recorded = {k: entry.get(k) for k in ("cmd", "deps", "params")}
    digest = hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:16]
    return {f"dvc.{stage}.sha256": digest}
