"""BatchLoader: coverage per epoch, reproducible per-epoch order, drop_last, exact batch rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data.loader import BatchLoader

pytestmark = pytest.mark.unit


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
        assert list(got) == sorted(perm[i * 8 : (i + 1) * 8])


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


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"batch_size": 0}, "batch_size=0; expected a positive integer"),
        ({"batch_size": 2.5}, "batch_size=2.5"),
    ],
)
def test_bad_batch_size(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        BatchLoader(*arrays(4), **kwargs)


def test_length_mismatch():
    x, _ = arrays(4)
    with pytest.raises(ValueError, match="inputs have 4 rows but targets have 3"):
        BatchLoader(x, x[:3], batch_size=2)


# --------------------------------------------------------------------------- sharded arrays


import gc  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pandas as pd  # noqa: E402

from pipeline.data.shard_writer import write_shards  # noqa: E402
from pipeline.data.shards import open_split  # noqa: E402


def sharded(tmp_path, n: int, dim: int = 3, rows_per_shard: int = 7, dtype: str = "float32"):
    inputs, targets = arrays(n, dim)
    frame = pd.DataFrame({"id": [str(i) for i in range(n)], "input_text": ["a"] * n, "target_text": ["b"] * n})
    write_shards(
        tmp_path / "s", {"train": (frame, inputs, targets)}, {"name": "t"}, rows_per_shard=rows_per_shard, dtype=dtype
    )
    return open_split(tmp_path / "s", "train"), inputs, targets


def collect(loader, start_batch: int = 0):
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader.batches(start_batch)]


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b)
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_sharded_arrays_give_the_same_batches_as_ndarrays(tmp_path, dtype):
    s, inputs, targets = sharded(tmp_path, 61, rows_per_shard=7, dtype=dtype)
    if dtype == "float16":
        inputs = inputs.astype(np.float16).astype(np.float32)
        targets = targets.astype(np.float16).astype(np.float32)
    a = BatchLoader(s.inputs, s.targets, batch_size=8, seed=4)
    b = BatchLoader(inputs, targets, batch_size=8, seed=4)
    for epoch in (0, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        got = collect(a)
        assert all(x.dtype == np.float32 for x, _ in got)
        assert same(got, collect(b)) and len(got) == 8
        assert sorted(int(r) for x, _ in got for r in x[:, 0]) == list(range(61))


@pytest.mark.parametrize("prefetch", [1, 2, 5, 50])
@pytest.mark.parametrize("drop_last,start_batch", [(False, 0), (True, 0), (False, 3), (True, 9)])
def test_prefetch_gives_identical_batches(tmp_path, prefetch, drop_last, start_batch):
    s, _, _ = sharded(tmp_path, 83, rows_per_shard=10)
    plain = BatchLoader(s.inputs, s.targets, 9, seed=2, drop_last=drop_last)
    ahead = BatchLoader(s.inputs, s.targets, 9, seed=2, drop_last=drop_last, prefetch=prefetch)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        ahead.set_epoch(epoch)
        want = collect(plain, start_batch)
        assert same(collect(ahead, start_batch), want)
        assert len(want) == max(0, len(plain) - start_batch)


def test_prefetch_on_ndarrays_and_empty(tmp_path):
    inputs, targets = arrays(20)
    assert same(collect(BatchLoader(inputs, targets, 6, prefetch=3)), collect(BatchLoader(inputs, targets, 6)))
    assert list(BatchLoader(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), 4, prefetch=2)) == []


def test_prefetch_order_is_fixed_when_iteration_starts():
    loader = BatchLoader(*arrays(40), batch_size=5, seed=1, prefetch=2)
    loader.set_epoch(0)
    it = iter(loader)
    first = next(it)
    loader.set_epoch(1)  # too late for this epoch, as without prefetch
    rest = list(it)
    loader.set_epoch(0)
    assert same(
        [(x.numpy(), y.numpy()) for x, y in [first, *rest]], collect(BatchLoader(*arrays(40), batch_size=5, seed=1))
    )


def prefetch_threads() -> int:
    """The loader's own threads alive now. Not threading.active_count(): other libraries' pools
    (MLflow's async logging, started by earlier tests in this process) come and go on their own."""
    return sum(t.name == "BatchLoader-prefetch" and t.is_alive() for t in threading.enumerate())


def wait_for_threads(expected: int) -> int:
    deadline = time.monotonic() + 2.0
    while prefetch_threads() > expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return prefetch_threads()


def test_early_break_leaves_no_thread():
    before = prefetch_threads()
    loader = BatchLoader(*arrays(200), batch_size=4, prefetch=3)
    for i, _ in enumerate(loader):
        if i == 0:
            assert prefetch_threads() == before + 1  # the prefetch thread
        if i == 2:
            break
    gc.collect()
    assert wait_for_threads(before) == before


def test_closed_generator_leaves_no_thread():
    before = prefetch_threads()
    gen = BatchLoader(*arrays(200), batch_size=4, prefetch=2).batches(1)
    next(gen)
    time.sleep(0.05)  # let the thread fill the queue and block on it
    gen.close()
    assert prefetch_threads() == before  # close() joined it
    gen = BatchLoader(*arrays(200), batch_size=4, prefetch=2).batches()
    assert prefetch_threads() == before  # nothing starts before the first batch is asked for
    del gen


def test_exception_in_consumer_leaves_no_thread():
    before = prefetch_threads()

    def consume():
        for i, _ in enumerate(BatchLoader(*arrays(200), batch_size=4, prefetch=2)):
            if i == 1:
                raise KeyError("consumer failed")

    with pytest.raises(KeyError, match="consumer failed"):
        consume()
    gc.collect()
    assert wait_for_threads(before) == before


class FailingRows:
    """Rows for the first `ok` gathers, then an error (a bad disk, say)."""

    def __init__(self, arr, ok: int):
        self.arr, self.ok, self.calls = arr, ok, 0
        self.shape, self.dtype = arr.shape, arr.dtype

    def __len__(self):
        return len(self.arr)

    def take(self, idx):
        self.calls += 1
        if self.calls > self.ok:
            raise OSError(f"read failed on gather {self.calls}")
        return self.arr[idx]


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_worker_exception_is_raised_in_the_consumer(prefetch):
    inputs, targets = arrays(100)
    before = prefetch_threads()
    loader = BatchLoader(FailingRows(inputs, ok=3), targets, 10, shuffle=False, prefetch=prefetch)
    seen = []
    with pytest.raises(OSError, match="read failed on gather 4") as exc:
        for x, _ in loader:
            seen.append(x)
    assert len(seen) == 3  # every batch gathered before the failure still arrives, in order
    np.testing.assert_array_equal(seen[2].numpy(), inputs[20:30])
    if prefetch:
        assert any("take" in str(frame) for frame in exc.traceback)  # the worker's own traceback
    assert wait_for_threads(before) == before


@pytest.mark.parametrize("prefetch", [-1, 1.5, True])
def test_bad_prefetch(prefetch):
    with pytest.raises(ValueError, match=f"prefetch={prefetch!r}"):
        BatchLoader(*arrays(4), batch_size=2, prefetch=prefetch)


def test_prefetch_with_pin_memory_request_on_cpu():
    loader = BatchLoader(*arrays(30), batch_size=7, pin_memory=True, prefetch=2)
    assert loader.pin_memory == torch.cuda.is_available()
    batches = list(loader)
    assert len(batches) == 5 and all(x.is_pinned() == loader.pin_memory for x, _ in batches)


# --------------------------------------------------------------------------- memory


def rss_anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    pytest.skip("no RssAnon in /proc/self/status")


class Synthetic:
    """A (n, dim) float32 array-like computed a slice at a time: the test never holds the data."""

    def __init__(self, n: int, dim: int, sign: float):
        self.shape, self.dtype, self.sign = (n, dim), np.dtype(np.float32), sign

    def __getitem__(self, key):
        rows = np.arange(*key.indices(self.shape[0]), dtype=np.float32)[:, None]
        return self.sign * (rows + np.arange(self.shape[1], dtype=np.float32) / 100)


@pytest.fixture(scope="module")
def large_split(tmp_path_factory):
    n, dim = 200_000, 64  # 51 MB per array, 102 MB in all
    out = tmp_path_factory.mktemp("large") / "s"
    frame = pd.DataFrame({"id": np.arange(n).astype(str), "input_text": "a", "target_text": "b"})
    write_shards(
        out, {"train": (frame, Synthetic(n, dim, 1.0), Synthetic(n, dim, -1.0))}, {"name": "t"}, rows_per_shard=50_000
    )
    return out


@pytest.mark.parametrize("prefetch", [0, 2])
def test_anonymous_memory_does_not_grow_with_the_dataset(large_split, prefetch):
    s = open_split(large_split, "train")
    assert s.inputs.num_shards == 4 and s.inputs.nbytes == 200_000 * 64 * 4
    loader = BatchLoader(s.inputs, s.targets, batch_size=1000, seed=0, prefetch=prefetch)
    next(iter(loader))  # warm-up: first-use allocations of torch / numpy are not the data
    gc.collect()
    base = peak = rss_anon_kb()
    rows = 0
    for x, y in loader:
        rows += len(x)
        peak = max(peak, rss_anon_kb())
        assert float(x[0, 0]) == -float(y[0, 0])
    assert rows == 200_000
    grown_mb = (peak - base) / 1024
    assert grown_mb < 20, f"anonymous memory grew {grown_mb:.1f} MB over a 102 MB dataset"
