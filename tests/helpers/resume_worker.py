"""A training process for the kill-and-resume test: `python -m tests.helpers.resume_worker DIR [KILL_AT]`.

Trains the tiny test task with a checkpoint in DIR every 4 steps, resuming from it when one is
there; with KILL_AT it SIGKILLs itself when step KILL_AT's telemetry row is logged (after the
checkpoint at step 8, before the one at 12), as `kill -9` would, with no chance to clean up.
The finished model's weights and the telemetry go to DIR/final.pt.
"""

import logging
import os
import signal
import sys
from pathlib import Path

import torch

from pipeline.core.config import load_config
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.loop import train_model
from pipeline.train.resume_state import STATE_FILE, fingerprint, load_state
from tests.helpers.synthetic import linear_task

OVERRIDES = [
    "preset=smoke",
    "train.epochs=3",
    "train.batch_size=16",
    "train.log_every=2",
    "train.device=cpu",
    "train.checkpoint_every=4",
]  # torch's default threads (2 here): determinism must not need 1


def main(out: Path, kill_at: int | None) -> None:
    cfg = load_config(OVERRIDES)
    x, y = linear_task()
    fp = fingerprint(cfg, "linear-task")
    path = out / STATE_FILE

    def on_log(metrics: dict, step: int) -> None:
        if kill_at is not None and step == kill_at and "train/loss" in metrics:
            os.kill(os.getpid(), signal.SIGKILL)

    ckpt = Checkpointing(path, fp, cfg.train.checkpoint_every, resume_from=load_state(path, fp))
    res = train_model(cfg, x, y, x[:32], y[:32], on_log=on_log, progress=False, checkpointing=ckpt)
    torch.save({"model": res.model.state_dict(), "rows": res.rows, "summary": res.summary}, out / "final.pt")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
