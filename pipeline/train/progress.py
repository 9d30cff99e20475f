"""What a person watching the run sees: the step bar (tqdm) and one line per epoch; a part of the
loop (pipeline/train/parts.py)."""

from __future__ import annotations

import contextlib
import logging
import math

from tqdm.contrib.logging import logging_redirect_tqdm

from pipeline.train.parts import TrainPart

log = logging.getLogger(__name__)


class Progress(TrainPart):
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def running(self, tr):
        """While the bar is up, log lines (epoch summaries, skipped steps) go through tqdm.write,
        so they print above it instead of after it on the bar's own line."""
        return logging_redirect_tqdm() if self.enabled else contextlib.nullcontext()

    def on_start(self, tr) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=tr.total_steps, initial=tr.step, desc="train", unit="step", disable=not self.enabled, mininterval=1.0
        )

    def after_step(self, tr, s) -> None:
        self.bar.update(1)

    def on_log(self, tr, row: dict) -> None:
        if math.isfinite(row["train/loss"]):
            self.bar.set_postfix(loss=f"{row['train/loss']:.4f}", refresh=False)

    def on_epoch_end(self, tr) -> None:
        log_epoch(tr.result.rows, tr.epoch, tr.t.epochs, tr.step, tr.result.summary if tr.val else None)

    def on_end(self, tr, reason: str) -> None:
        self.bar.close()


def log_epoch(rows: list[dict], epoch: int, epochs: int, step: int, val: dict | None) -> None:
    """One line per epoch (rank 0's: the other ranks log warnings only): the epoch's last finite
    training loss, `val` (val/loss, val/cosine) when there is a validation split, and its skips."""
    rows = [r for r in rows if r["epoch"] == epoch]
    losses = [r["train/loss"] for r in rows if math.isfinite(r["train/loss"])]
    parts = [f"train/loss {losses[-1]:.4f}" if losses else "train/loss n/a"]
    if val is not None:
        parts += [f"val/loss {val['val/loss']:.4f}", f"val/cosine {val['val/cosine']:.4f}"]
    skipped = sum(r["train/skipped"] for r in rows)
    log.info("epoch %d/%d (step %d): %s, %d skipped", epoch + 1, epochs, step, ", ".join(parts), skipped)
