"""The last training run's time and memory: telemetry/train_perf.csv (per logged step) and
telemetry/train_perf.json (run totals), kept beside the DVC outputs rather than among them.

They are measurements of this machine at this moment, so two identical runs never give the same
bits; as DVC outputs they would make every `dvc.lock` unreproducible. The cost of keeping them
outside: DVC can restore a cached train stage (same params and data as an earlier run) without
running it, and then the files still hold the last run that did train, which may have had other
settings (a `fault=leak` run, say). So the JSON names the settings it was measured under
(settings_digest), and `read_perf` hands the report the measurements only when they
match its own config.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from pipeline.core.paths import TELEMETRY_DIR, repo_path
from pipeline.core.stage_outputs import read_csv, read_json
from pipeline.data.shards import load_manifest

log = logging.getLogger(__name__)

PERF_CSV = TELEMETRY_DIR / "train_perf.csv"
PERF_JSON = TELEMETRY_DIR / "train_perf.json"
SETTINGS_KEY = "settings_digest"  # in PERF_JSON
# The train run's artifact folder that holds its copies of both files (with its other outputs,
# pipeline/train/outputs.py): the report reads them there where a checkout has none of its own.
PERF_ARTIFACT_DIR = "train"
_MEASURED_PREFIXES = ("perf/", "mem/", "system/")
_MEASURED_KEYS = frozenset({"train/seconds"})


def is_measured(key: str) -> bool:
    """Time and memory: measurements of this machine at this moment, not results of the run."""
    return key.startswith(_MEASURED_PREFIXES) or key in _MEASURED_KEYS


def manifest_digest(manifest: dict) -> str:
    """The data's part of a fingerprint: the shards' manifest (source digest, teacher, rows)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def settings_digest(cfg, data_digest: str) -> str:
    """The train stage's DVC params (every setting it reads but the labels, the neutral ones too:
    threads or logging change the time a step takes) and the data. Written beside a run's time
    and memory (telemetry/train_perf.json), so the report can tell when they belong to another run: DVC
    restores a cached train stage's outputs without running it, and leaves the last real run's
    measurements in place."""
    doc = {
        "run": {"seed": OmegaConf.select(cfg, "run.seed")},  # (preset and experiment only label the run)
        **{k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "train", "fault")},
        "data": data_digest,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Perf:
    steps: pd.DataFrame | None = None  # step + perf/* and mem/* columns
    totals: dict = field(default_factory=dict)  # perf/*, mem/*, train/seconds
    missing: str = ""  # why there is nothing (empty when there is)


def current_settings(cfg) -> str | None:
    """settings_digest of this config and the shards it names; None when the shards' manifest
    cannot be read (then nothing can be compared)."""
    try:
        manifest = load_manifest(repo_path(cfg.embed.out_dir))
    except Exception as e:  # noqa: BLE001 (any unreadable manifest: say so, do not stop the report)
        log.warning("cannot read the shards' manifest (%s) to check that %s belongs to this run", e, PERF_JSON)
        return None
    return settings_digest(cfg, manifest_digest(manifest))


def read_perf(cfg, directory: Path | None = None) -> Perf:
    """The measurements, if they exist and were taken under this config's settings: in
    telemetry/, or in `directory` (the copies logged to the model's MLflow run, downloaded)."""
    csv, js = (PERF_CSV, PERF_JSON) if directory is None else (directory / PERF_CSV.name, directory / PERF_JSON.name)
    if not (csv.is_file() and js.is_file()):
        return Perf(
            missing=f"{csv.name} or {js.name} is missing from {csv.parent} (the train stage writes them beside "
            "the DVC outputs, so neither `dvc pull` nor `dvc checkout` of another experiment brings them)"
        )
    totals = read_json(js, "train")
    measured_under = totals.pop(SETTINGS_KEY, None)
    expected = current_settings(cfg)
    if expected is not None and measured_under is None:
        return Perf(missing=f"{js} does not say which settings it was measured under (an older version wrote it)")
    if expected is not None and measured_under != expected:
        return Perf(
            missing=f"{js} was measured under other settings (digest {measured_under}) than this config's "
            f"({expected}): the last train run that wrote it had other parameters or data than this "
            "model (a train stage run by hand with overrides, or one DVC restored from its cache "
            "without running it)"
        )
    return Perf(steps=read_csv(csv, "train", required=("step",)), totals=totals)
