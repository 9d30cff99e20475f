"""BatchLoader: coverage per epoch, reproducible per-epoch order, drop_last, exact batch rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data.loader import BatchLoader


def arrays(n: int, dim: int = 3):
    # Column 0 holds the row index, so a batch tells which rows it contains.
    inputs = np.zeros((n, dim), np.float32)
    inputs[:, 0] = np.arange(n)
    inputs[:, 1:] = np.random.default_rng(0).standard_normal((n, dim - 1))
    targets = -inputs[:, ::-1].copy()
    return inputs, targets


def rows_seen(loader: BatchLoader) -> list[int]:
    return [int(r) for x, _ in loader for r in x[:, 0]]


def test_every_index_once_per_epoch():
    inputs, targets = arrays(103)
    loader = BatchLoader(inputs, targets, batch_size=10, seed=5)
    assert len(loader) == 11 and loader.num_samples == 103
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 11
        assert [len(x) for x, _ in batches] == [10] * 10 + [3]
        assert sorted(rows_seen(loader)) == list(range(103))


def test_order_differs_between_epochs_and_is_reproducible():
    inputs, targets = arrays(200)
    a = BatchLoader(inputs, targets, batch_size=16, seed=1)
    a.set_epoch(0)
    e0 = rows_seen(a)
    a.set_epoch(1)
    e1 = rows_seen(a)
    assert e0 != e1
    assert e0 != list(range(200))  # actually shuffled
    # A fresh loader (a resumed run) reproduces epoch 1 exactly, and seeds matter.
    b = BatchLoader(inputs, targets, batch_size=16, seed=1)
    b.set_epoch(1)
    assert rows_seen(b) == e1
    c = BatchLoader(inputs, targets, batch_size=16, seed=2)
    c.set_epoch(1)
    assert rows_seen(c) != e1


def test_batches_keep_permutation_membership_sorted_within():
    inputs, targets = arrays(50)
    loader = BatchLoader(inputs, targets, batch_size=8, seed=3)
    loader.set_epoch(4)
    perm = np.random.default_rng([3, 4]).permutation(50)
    for i, (x, _) in enumerate(loader):
        got = x[:, 0].numpy().astype(int)
        assert list(got) == sorted(perm[i * 8:(i + 1) * 8])


def test_no_shuffle_is_in_order():
    inputs, targets = arrays(25)
    loader = BatchLoader(inputs, targets, batch_size=10, shuffle=False)
    loader.set_epoch(7)
    assert rows_seen(loader) == list(range(25))


def test_drop_last():
    inputs, targets = arrays(103)
    loader = BatchLoader(inputs, targets, batch_size=10, drop_last=True)
    assert len(loader) == 10
    batches = list(loader)
    assert len(batches) == 10 and all(len(x) == 10 for x, _ in batches)
    seen = rows_seen(loader)
    assert len(seen) == len(set(seen)) == 100
    exact = BatchLoader(*arrays(20), batch_size=10, drop_last=True)
    assert len(exact) == 2 and len(list(exact)) == 2


def test_batches_equal_their_rows():
    inputs, targets = arrays(37, dim=5)
    loader = BatchLoader(inputs, targets, batch_size=6, seed=9)
    for idx, (x, y) in zip(loader.batch_indices(), loader):
        assert x.dtype == torch.float32 and y.dtype == torch.float32
        assert x.device.type == "cpu" and x.shape == (len(idx), 5)
        np.testing.assert_array_equal(x.numpy(), inputs[idx])
        np.testing.assert_array_equal(y.numpy(), targets[idx])


def test_works_on_memory_mapped_arrays(tmp_path):
    inputs, targets = arrays(64, dim=4)
    np.save(tmp_path / "x.npy", inputs)
    np.save(tmp_path / "y.npy", targets.astype(np.float64))  # converted to float32 per batch
    mx = np.load(tmp_path / "x.npy", mmap_mode="r", allow_pickle=False)
    my = np.load(tmp_path / "y.npy", mmap_mode="r", allow_pickle=False)
    loader = BatchLoader(mx, my, batch_size=16, seed=0, pin_memory=True)
    seen = []
    for idx, (x, y) in zip(loader.batch_indices(), loader):
        assert type(x) is torch.Tensor and y.dtype == torch.float32
        np.testing.assert_array_equal(x.numpy(), inputs[idx])
        np.testing.assert_array_equal(y.numpy(), targets[idx].astype(np.float32))
        seen.extend(idx.tolist())
    assert sorted(seen) == list(range(64))


def test_empty_arrays_yield_nothing():
    loader = BatchLoader(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), 4)
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.parametrize("kwargs,fragment", [
    ({"batch_size": 0}, "batch_size=0; expected a positive integer"),
    ({"batch_size": 2.5}, "batch_size=2.5"),
])
def test_bad_batch_size(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        BatchLoader(*arrays(4), **kwargs)


def test_length_mismatch():
    x, _ = arrays(4)
    with pytest.raises(ValueError, match="inputs have 4 rows but targets have 3"):
        BatchLoader(x, x[:3], batch_size=2)
