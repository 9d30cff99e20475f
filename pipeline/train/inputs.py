"""What the train stage reads before it trains, on every rank: the shards (memory-mapped), the
run's fingerprint and a checkpoint to resume from, after the memory check has let the config
through."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

from pipeline.core.distributed import Dist
from pipeline.core.paths import repo_path
from pipeline.data.shards import SplitShard, load_manifest, open_split
from pipeline.model.model_file import model_shapes
from pipeline.train import memory_estimate
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

    def arrays(self) -> tuple:
        """train_model's arrays: train inputs and targets, val inputs and targets."""
        return self.train.inputs, self.train.targets, self.val.inputs, self.val.targets


def prepare(cfg, place: Dist, tracked: bool) -> TrainInputs:
    """Before any of the model, optimizer or checkpoint is built or loaded, the memory check
    (pipeline/train/memory_estimate.py) refuses a config that cannot fit. `tracked`: this process
    logs to MLflow (its client is part of the estimate)."""
    shard_dir = repo_path(cfg.embed.out_dir)
    manifest = load_manifest(shard_dir)
    ckpt_path = repo_path(cfg.train.checkpoint_dir) / STATE_FILE
    memory = memory_estimate.check(cfg, int(manifest["dim"]), place, ckpt_path, tracked=tracked)
    train, val = open_split(shard_dir, "train", need_rows="to train on"), open_split(shard_dir, "val")
    fp = fingerprint(cfg, manifest_digest(manifest), place.world_size)
    state = None
    if cfg.train.resume and ckpt_path.is_file():
        # Shapes too: a checkpoint of this fingerprint from another version of the code is set aside, not a crash.
        state = load_state(
            ckpt_path, fp, quiet=not place.is_main, model_shapes=model_shapes(cfg.model, int(manifest["dim"]))
        )
    return TrainInputs(memory, manifest, train, val, ckpt_path, fp, state)
