"""What the train stage reads before it trains, on every rank: the shards (memory-mapped), the
run's fingerprint and a checkpoint to resume from, after the memory check has let the config
through; and the tags its MLflow run gets."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

from pipeline.core.arm import arm_of
from pipeline.core.distributed import Dist
from pipeline.core.paths import repo_path
from pipeline.data.shards import SplitShard, load_manifest, open_split
from pipeline.model.model_file import model_shapes
from pipeline.tracking import store as tracking
from pipeline.tracking.provenance import device_tags
from pipeline.train import memory_estimate
from pipeline.train.device import select_device
from pipeline.train.perf_files import manifest_digest
from pipeline.train.resume_state import STATE_FILE, fingerprint, load_state


class TrainInputs(NamedTuple):
    memory: memory_estimate.MemoryCheck  # the config fits (or train.memory_check=false let it through)
    manifest: dict
    train: SplitShard
    val: SplitShard
    ckpt_path: Path
    fingerprint: str
    state: Optional[dict]  # the checkpoint to resume from (None: start afresh)


def prepare(cfg, place: Dist) -> TrainInputs:
    """Before any of the model, optimizer or checkpoint is built or loaded, the memory check
    (pipeline/train/memory_estimate.py) refuses a config that cannot fit."""
    shard_dir = repo_path(cfg.embed.out_dir)
    manifest = load_manifest(shard_dir)
    ckpt_path = repo_path(cfg.train.checkpoint_dir) / STATE_FILE
    memory = memory_estimate.check(cfg, int(manifest["dim"]), place, ckpt_path)
    train, val = open_split(shard_dir, "train", need_rows="to train on"), open_split(shard_dir, "val")
    fp = fingerprint(cfg, manifest_digest(manifest), place.world_size)
    state = None
    if cfg.train.resume and ckpt_path.is_file():
        # Shapes too: a checkpoint of this fingerprint from another version of the code is set aside, not a crash.
        state = load_state(
            ckpt_path, fp, quiet=not place.is_main, model_shapes=model_shapes(cfg.model, int(manifest["dim"]))
        )
    return TrainInputs(memory, manifest, train, val, ckpt_path, fp, state)


def embed_run_of(cfg) -> dict:
    """The run file of the embed run that made the shards ({} when tracking is off or it has none)."""
    if not tracking.enabled():
        return {}
    return tracking.read_run_file(
        "embed", repo_path(cfg.embed.out_dir) / "manifest.json", "manifest_sha256", required=False
    )


def run_tags(cfg, manifest: dict, embed_run: dict, fp: str, place: Dist) -> dict[str, str]:
    """The train run's MLflow tags: what it trained on, how, and where."""
    arm = arm_of(cfg, manifest)
    return {
        "stage": "train",
        # Runs of one arm differ only in run.seed: the runs table groups replicates by this tag.
        "arm": arm.tag,
        "arm.digest": arm.digest,
        "embed.run_id": str(embed_run.get("run_id", "")),
        "dataset.sha256": str(manifest.get("source", {}).get("sha256", ""))[:16],
        "teacher": str(manifest["teacher"]["name"]),
        "train.fingerprint": fp,
        "train.processes": str(place.world_size),
        "distributed.backend": place.backend or "none",
        **device_tags(select_device(cfg.train.device)),
    }
