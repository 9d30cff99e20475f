"""Batches of (input, target) embeddings straight from (memory-mapped) arrays.

A torch DataLoader over a Dataset would call __getitem__ once per row and collate in Python;
on millions of small rows that dominates the step time. Here each batch is one fancy-index
gather per array, which numpy does in C and which reads a memory map only where needed.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch


class BatchLoader:
    """Yield (x, y) float32 CPU tensors of `batch_size` rows.

    The order depends only on (seed, epoch): call set_epoch(e) before iterating epoch e, and a
    run resumed at epoch e sees exactly the batches the original run would have."""

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, batch_size: int,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 pin_memory: bool = False):
        if len(inputs) != len(targets):
            raise ValueError(f"inputs have {len(inputs)} rows but targets have {len(targets)}; "
                             "expected the same number")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}; expected a positive integer")
        self.inputs = inputs
        self.targets = targets
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        # Pinning needs a CUDA runtime; without one it would raise, and there is nothing to gain.
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        return len(self.inputs)

    def __len__(self) -> int:
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def order(self) -> np.ndarray:
        """Row order of the current epoch (before per-batch sorting)."""
        n = self.num_samples
        if not self.shuffle:
            return np.arange(n)
        # [seed, epoch] seeds a distinct stream per epoch without seed+epoch collisions
        # (seed 1 epoch 0 vs seed 0 epoch 1).
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def batch_indices(self, start_batch: int = 0) -> Iterator[np.ndarray]:
        """Row indices of each batch of the current epoch from batch `start_batch` on (a resumed
        run skips what it has seen without reading it), sorted within the batch."""
        order = self.order()
        for start in range(start_batch * self.batch_size, len(self) * self.batch_size, self.batch_size):
            # Sorting keeps the batch's members but turns random reads of a memory map into
            # forward ones; the order inside a batch does not matter to the loss.
            yield np.sort(order[start:start + self.batch_size])

    def _tensor(self, arr: np.ndarray, idx: np.ndarray) -> torch.Tensor:
        # np.asarray: take() on a memmap returns a memmap subclass detached from any file.
        batch = np.asarray(np.take(arr, idx, axis=0), dtype=np.float32)
        t = torch.from_numpy(batch)
        return t.pin_memory() if self.pin_memory else t

    def batches(self, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.batch_indices(start_batch):
            yield self._tensor(self.inputs, idx), self._tensor(self.targets, idx)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.batches()
