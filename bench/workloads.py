"""What several benchmarks run: synthetic data in place of the embed stage, a preset's config for
a given number of steps on the stage's thread count, and a throwaway MLflow store."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Iterator

import numpy as np

from bench.clock import stage_threads
from bench.model import DIM
from pipeline.core.config import load_config
from pipeline.core.environment import temporary_env

BASE = ["train.device=cpu", "train.checkpoint_every=0"]


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 384-d task in place of the embed stage: y = x @ W, rows scaled to unit norm
    (the teacher's embeddings are normalised too)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    y = x @ (rng.normal(size=(DIM, DIM)) / np.sqrt(DIM))
    return x, (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)


def config(preset: str, steps: int, *overrides: str):
    """`preset` for at least `steps` optimizer steps on synthetic data: returns (cfg, rows).
    An epoch is at most 250 steps (8000 rows of batch 32, 12 MB per array); longer runs take
    more epochs over the same rows, rounded up to whole epochs. Trained on the stage's thread
    count (stage_threads) unless an override sets train.threads."""
    epochs = -(-steps // 250)
    threads = [] if any(o.startswith("train.threads=") for o in overrides) else [f"train.threads={stage_threads()}"]
    cfg = load_config([f"preset={preset}", *BASE, f"train.epochs={epochs}", *threads, *overrides])
    return cfg, -(-steps // epochs) * cfg.train.batch_size


@contextlib.contextmanager
def temporary_store() -> Iterator[str]:
    """MLFLOW_TRACKING_URI pointed at a fresh SQLite file for the duration (tracking_uri() reads
    the variable on every call), so the benchmark never writes to the project's mlflow.db."""
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        # mlflow_run tags the run with `git status`: without optional locks it leaves .git alone.
        with temporary_env({"MLFLOW_TRACKING_URI": uri, "GIT_OPTIONAL_LOCKS": "0"}):
            yield uri


def workload_threads(cfg) -> int:
    """The intra-op threads the trainer will run `cfg` with (Trainer.run's rule, one process)."""
    import torch

    from pipeline.core import numerics
    from pipeline.core.distributed import Dist, threads_per_process

    if cfg.train.threads or numerics.threads():
        return threads_per_process(cfg.train.threads, Dist())
    return torch.get_num_threads()
