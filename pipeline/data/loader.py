"""Batches of (input, target) embeddings straight from (memory-mapped) arrays.

A torch DataLoader over a Dataset would call __getitem__ once per row and collate in Python; here
each batch is one fancy-index gather per array (ndarrays, memory maps, or ShardedArray's take()),
in C, reading a memory map only where needed; a batch comes back as float32 (float16 shards are
widened a batch at a time), so anonymous memory stays at a few batches whatever the dataset's size.

With prefetch=N one background thread gathers (and, with pin_memory on CUDA, pins) the next N
batches; order and contents are identical without it, the thread stops when the consumer stops,
and an exception in the thread is raised in the consumer.

In distributed training (docs/training.md) rank r takes batches r, r + world_size, ... of the same
epoch order. With even=True (training) every rank gets the same number of batches (DDP needs that:
a rank with one batch more would wait forever in its gradient all-reduce), the up to world_size - 1
left over dropped as drop_last drops a partial batch; with even=False (evaluation) none is dropped.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import numpy as np
import torch

_DONE = object()  # end of the epoch, from the prefetch thread


class BatchLoader:
    """Yield (x, y) float32 CPU tensors of `batch_size` rows.

    The order depends only on (seed, epoch): call set_epoch(e) before iterating epoch e, and a
    run resumed at epoch e sees exactly the batches the original run would have."""

    def __init__(
        self,
        inputs: Any,
        targets: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
        prefetch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        even: bool = True,
    ):
        if len(inputs) != len(targets):
            raise ValueError(
                f"inputs have {len(inputs)} rows but targets have {len(targets)}; expected the same number"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}; expected a positive integer")
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError(f"prefetch={prefetch!r}; expected an integer >= 0 (batches prepared ahead)")
        self.inputs, self.targets, self.batch_size = inputs, targets, int(batch_size)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        # Pinning needs a CUDA runtime; without one it would raise, and there is nothing to gain.
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.prefetch = int(prefetch)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r}, world_size={world_size!r}; expected 0 <= rank < world_size")
        self.rank, self.world_size, self.even = int(rank), int(world_size), even
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        return len(self.inputs)

    @property
    def total_batches(self) -> int:
        """Batches of an epoch over all ranks."""
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __len__(self) -> int:
        """This rank's batches of an epoch."""
        total, w = self.total_batches, self.world_size
        return total // w if self.even else len(range(self.rank, total, w))

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
        yield from self._indices(self.order(), start_batch)

    def _indices(self, order: np.ndarray, start_batch: int) -> Iterator[np.ndarray]:
        for local in range(start_batch, len(self)):
            start = (local * self.world_size + self.rank) * self.batch_size
            # Sorting keeps the batch's members but turns random reads of a memory map into
            # forward ones; the order inside a batch does not matter to the loss.
            yield np.sort(order[start : start + self.batch_size])

    @staticmethod
    def _gather(arr: Any, idx: np.ndarray) -> np.ndarray:
        if not isinstance(arr, np.ndarray) and hasattr(arr, "take"):
            return np.asarray(arr.take(idx), dtype=np.float32)  # ShardedArray: one fancy index per shard touched
        # np.asarray: take() on a memmap returns a memmap subclass detached from any file.
        return np.asarray(np.take(arr, idx, axis=0), dtype=np.float32)

    def _tensor(self, arr: Any, idx: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(self._gather(arr, idx))
        return t.pin_memory() if self.pin_memory else t

    def _batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self._tensor(self.inputs, idx), self._tensor(self.targets, idx)

    def batches(self, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.prefetch:
            yield from self._prefetched(start_batch)  # closing this closes that (PEP 380)
            return
        for idx in self.batch_indices(start_batch):
            yield self._batch(idx)

    def _prefetched(self, start_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A generator: the thread starts at the first next(), and the finally below runs when the
        # consumer finishes, breaks (the generator is closed or collected) or raises.
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        indices = self._indices(self.order(), start_batch)  # fixed here: set_epoch() later cannot change it

        def work() -> None:
            try:
                for idx in indices:
                    if stop.is_set():
                        return
                    ready.put(self._batch(idx))  # blocks while `prefetch` batches wait
                ready.put(_DONE)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
                ready.put(e)

        thread = threading.Thread(target=work, name="BatchLoader-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                del item  # do not keep the consumer's last batch alive while waiting
        finally:
            stop.set()
            while thread.is_alive():  # unblock a put() on a full queue, then let the thread end
                try:
                    while True:
                        ready.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.01)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.batches()
