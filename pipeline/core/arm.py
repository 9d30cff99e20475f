"""A run's arm: what it trained (its configuration and its data) without the training seed.

Runs of one arm differ only in `run.seed` (the initialisation and the batch order): they are
replicates, and the spread of their metrics is the luck of the training run. Comparing two arms
is what a researcher means by "did my change help"; comparing two runs of one arm measures luck.

What is left out of the arm, so that it names the same arm wherever and however the run was made:
the seed itself, and each key the schema declares a LABEL (`preset=default` and the same values
reached by overrides are one arm) or OPERATIONAL (the flow loop's form and CUDA graphs change the
last bits of the numerics, not what is learned; the report judges a run) or RIVAL (the learned
baseline's settings: they make the rival, not the model); docs/architecture.md,
"Roles". A key declared with no role is part of the arm.

The data is part of the arm by content, not by path: `data_digest` of the shards' manifest (each
split's texts and the teacher), so the same config on an edited dataset is another arm.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.core.config.param import Role, keys_with
from pipeline.core.config.schema import Config

SEED_KEY = "run.seed"
_OUT = Role.LABEL | Role.OPERATIONAL | Role.RIVAL
NOT_ARM_KEYS = keys_with(_OUT, Config) | {SEED_KEY}
# A section declared out (report) leaves out a key of it the schema no longer declares (an older run's) too.
NOT_ARM_SECTIONS = tuple(f"{f.name}." for f in dataclasses.fields(Config) if f.metadata["role"] & _OUT)
DIGEST_CHARS = 10


def in_arm(key: str) -> bool:
    return key not in NOT_ARM_KEYS and not key.startswith(NOT_ARM_SECTIONS)


def data_digest(manifest: Mapping[str, Any]) -> str:
    """The shards' content as 16 hex characters: each split's texts file (ids, texts, groups) and
    the teacher's weights and config. Not the vector files: their last bits may differ between
    machines and caches while the data is the same."""
    files = manifest.get("files", {})
    parts = [
        f"{split}:{files.get(str(info.get('texts', '')), {}).get('sha256', '')}"
        for split, info in sorted(manifest.get("splits", {}).items())
    ]
    teacher = manifest.get("teacher", {})
    parts += [f"teacher:{teacher.get('weights_sha256', '')}:{teacher.get('config_sha256', '')}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Arm:
    digest: str  # DIGEST_CHARS hex characters of the arm's config and data
    name: str  # the preset and what differs from it, seed left out: `default lr=0.001`

    @property
    def tag(self) -> str:
        """One string for the MLflow tag `arm` (the runs table groups by it): name and digest."""
        return f"{self.name} [{self.digest}]"


def arm_digest(flat: Mapping[str, Any], data: str) -> str:
    """The flattened config's keys that make the arm, with the data's digest."""
    config = {k: v for k, v in flat.items() if in_arm(k)}
    payload = json.dumps({"config": config, "data": data}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:DIGEST_CHARS]


def arm_of(cfg, manifest: Mapping[str, Any]) -> Arm:
    """The arm of a composed config trained on the shards `manifest` describes."""
    from pipeline.core.config import flatten
    from pipeline.core.run_label import differences, run_label

    flat = flatten(cfg)
    diff = {k: v for k, v in differences(cfg).items() if in_arm(k)}
    return Arm(arm_digest(flat, data_digest(manifest)), run_label(cfg, diff))
