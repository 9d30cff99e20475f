"""Shard round trip, manifest contents, integrity checks, crash-safe replacement, bounded shard
files (rows_per_shard), float16 storage, ShardedArray reads and format-1 compatibility."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import ConfigError, ShardError
from pipeline.core.output_dirs import MARK
from pipeline.data import shard_writer, shards
from pipeline.data.shard_writer import write_shards
from pipeline.data.shards import ShardedArray, load_manifest, open_split

pytestmark = pytest.mark.unit

TEACHER = {"name": "tiny-teacher", "revision": "abc123"}


def make_split(n: int, dim: int = 4, offset: int = 0):
    frame = pd.DataFrame(
        {
            "id": [f"id{offset + i}" for i in range(n)],
            "input_text": [f"in {offset + i}" for i in range(n)],
            "target_text": [f"out {offset + i}" for i in range(n)],
        }
    )
    rng = np.random.default_rng(offset)
    return (frame, rng.standard_normal((n, dim)).astype(np.float32), rng.standard_normal((n, dim)).astype(np.float32))


@pytest.fixture
def written(tmp_path):
    splits = {"train": make_split(10), "val": make_split(3, offset=100)}
    out = tmp_path / "shards"
    manifest = write_shards(out, splits, TEACHER, extra={"source_sha256": "feed"})
    return out, splits, manifest


def test_round_trip(written):
    out, splits, _ = written
    for name, (frame, inputs, targets) in splits.items():
        s = open_split(out, name)
        assert s.count == len(frame) and s.dim == 4
        assert list(s.ids) == frame["id"].tolist()
        assert list(s.input_texts) == frame["input_text"].tolist()
        assert list(s.target_texts) == frame["target_text"].tolist()
        assert isinstance(s.inputs, ShardedArray) and isinstance(s.targets, ShardedArray)
        assert s.inputs.dtype == np.float32 and s.inputs.shape == (len(frame), 4)
        assert all(
            isinstance(p, np.ndarray) and p.flags.c_contiguous and not p.flags.writeable for p in s.inputs._parts
        )
        assert all(isinstance(p.base, np.memmap) for p in s.inputs._parts)  # mapped, not read
        np.testing.assert_array_equal(s.inputs, inputs)
        np.testing.assert_array_equal(s.targets, targets)


def test_manifest_contents(written):
    out, _, manifest = written
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest == load_manifest(out)
    assert manifest["format_version"] == 2 and manifest["dim"] == 4
    assert manifest["dtype"] == "float32" and manifest["teacher"] == TEACHER
    assert manifest["rows_per_shard"] == 262144
    assert manifest["source_sha256"] == "feed"
    assert manifest["splits"]["train"] == {
        "count": 10,
        "texts": "train.parquet",
        "shards": [{"inputs": "train-00000_inputs.npy", "targets": "train-00000_targets.npy", "rows": 10}],
    }
    assert manifest["splits"]["val"]["count"] == 3
    assert sorted(manifest["files"]) == sorted(
        f"{s}{suffix}" for s in ("train", "val") for suffix in (".parquet", "-00000_inputs.npy", "-00000_targets.npy")
    )
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    text = (out / "manifest.json").read_text()
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def test_float64_is_stored_as_float32(tmp_path):
    frame, inputs, targets = make_split(5)
    write_shards(tmp_path / "s", {"train": (frame, inputs.astype(np.float64), targets)}, TEACHER)
    s = open_split(tmp_path / "s", "train")
    assert s.inputs.dtype == np.float32
    np.testing.assert_array_equal(s.inputs, inputs)


def test_empty_split_round_trips(tmp_path):
    write_shards(tmp_path / "s", {"train": make_split(4), "test": make_split(0)}, TEACHER)
    s = open_split(tmp_path / "s", "test")
    assert s.count == 0 and s.inputs.shape == (0, 4) and list(s.ids) == []


def flip_bit(path, offset: int, mask: int) -> None:
    """Corrupt one byte in place: same size and shape, only the sha256 can tell."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_tampered_npy_byte_is_caught(written):
    out, _, manifest = written
    flip_bit(out / "train-00000_targets.npy", -1, 0x01)
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    msg = str(exc.value)
    assert "train-00000_targets.npy" in msg and "sha256 differs" in msg
    assert manifest["files"]["train-00000_targets.npy"]["sha256"] in msg
    assert hashlib.sha256((out / "train-00000_targets.npy").read_bytes()).hexdigest() in msg
    # Other splits are untouched and still open; verify=False skips the hash.
    open_split(out, "val")
    assert open_split(out, "train", verify=False).count == 10


def test_truncated_file_reports_sizes(written):
    out, _, manifest = written
    path = out / "train-00000_inputs.npy"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    expected = manifest["files"]["train-00000_inputs.npy"]["bytes"]
    assert (
        f"train-00000_inputs.npy: size differs from the manifest: expected {expected} bytes, "
        f"found {expected - 8}" in str(exc.value)
    )


def test_deleted_file_is_named(written):
    out, _, _ = written
    (out / "val.parquet").unlink()
    with pytest.raises(ShardError, match=r"val\.parquet: file missing .*split 'val'"):
        open_split(out, "val", verify=False)


def test_wrong_shape_caught_even_without_verify(written):
    out, _, _ = written
    np.save(out / "train-00000_inputs.npy", np.zeros((10, 5), np.float32))
    with pytest.raises(ShardError) as exc:
        open_split(out, "train", verify=False)
    assert "train-00000_inputs.npy: shape differs from the manifest: expected (10, 4), found (10, 5)" in str(exc.value)


def test_wrong_dtype_caught(written):
    out, _, _ = written
    np.save(out / "val-00000_targets.npy", np.zeros((3, 4), np.float64))
    with pytest.raises(
        ShardError,
        match=r"val-00000_targets\.npy: dtype differs from the manifest: "
        r"expected float32, found float64",
    ):
        open_split(out, "val", verify=False)


def test_unknown_split_lists_present(written):
    out, _, _ = written
    with pytest.raises(ShardError, match=r"no split 'test'; splits present: train, val"):
        open_split(out, "test")


def test_missing_manifest(tmp_path):
    with pytest.raises(ShardError) as exc:
        load_manifest(tmp_path / "nowhere")
    msg = str(exc.value)
    assert str(tmp_path / "nowhere" / "manifest.json") in msg and "embed stage" in msg


def test_unparsable_manifest(written):
    out, _, _ = written
    (out / "manifest.json").write_text('{"format_version": 1,')
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    msg = str(exc.value)
    assert "manifest.json" in msg and "not valid JSON (line 1" in msg and "embed stage" in msg


def test_wrong_format_version(written):
    out, _, manifest = written
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(
        ShardError,
        match=r"format_version is 3, expected 2 \(or the older 1\); "
        "run the embed stage",
    ):
        load_manifest(out)


def test_failed_write_keeps_previous_and_leaves_no_temp(written, monkeypatch):
    out, _, manifest = written
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []
    real_save = np.save

    def failing_save(path, arr, *a, **kw):
        calls.append(path)
        if len(calls) == 3:  # after a whole first split, midway through the next
            raise OSError("disk full")
        return real_save(path, arr, *a, **kw)

    monkeypatch.setattr(np, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        write_shards(out, {"train": make_split(6, offset=7), "val": make_split(2, offset=9)}, {"name": "other"})
    assert len(calls) == 3
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]
    assert load_manifest(out) == manifest


def test_failed_write_without_previous_leaves_nothing(tmp_path, monkeypatch):
    def failing_save(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", failing_save)
    with pytest.raises(OSError):
        write_shards(tmp_path / "s", {"train": make_split(3)}, TEACHER)
    assert list(tmp_path.iterdir()) == []


def test_failed_swap_restores_previous(written, monkeypatch):
    out, _, manifest = written
    real_replace = shard_writer.os.replace

    def replace(src, dst):
        # Let "old away" happen, fail "new in".
        if str(dst) == str(out) and ".tmp" in str(src):
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(shard_writer.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        write_shards(out, {"train": make_split(2)}, TEACHER)
    assert load_manifest(out) == manifest
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


def test_rewrite_replaces_whole_directory(written):
    out, _, _ = written
    write_shards(out, {"test": make_split(2, dim=8)}, TEACHER)
    assert sorted(p.name for p in out.iterdir()) == [
        MARK,
        "manifest.json",
        "test-00000_inputs.npy",
        "test-00000_targets.npy",
        "test.parquet",
    ]
    assert open_split(out, "test").dim == 8
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


def test_rewrite_refuses_a_shard_directory_holding_a_file_it_did_not_write(written):
    """Replaced as a whole, the directory would take the stray file with it: nothing is written."""
    out, _, _ = written
    (out / "notes.txt").write_text("a person's notes")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConfigError, match=r"holds notes.txt, which the embed stage did not write"):
        write_shards(out, {"test": make_split(2, dim=8)}, TEACHER)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


@pytest.mark.parametrize(
    "splits,fragment",
    [
        (
            {"train": (make_split(3)[0], np.zeros((4, 4), np.float32), np.zeros((3, 4), np.float32))},
            "inputs have shape (4, 4); expected (3, dim)",
        ),
        (
            {"train": (make_split(3)[0], np.zeros((3, 4), np.float32), np.zeros((3,), np.float32))},
            "targets have shape (3,)",
        ),
        ({"train": make_split(3, dim=4), "val": make_split(2, dim=5)}, "split 'val': inputs have dim 5; expected 4"),
        (
            {"train": (make_split(2)[0], np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32))},
            "targets have dim 3; expected 4",
        ),
        (
            {"train": (make_split(2)[0], np.full((2, 4), np.nan, np.float32), np.zeros((2, 4), np.float32))},
            "row 1 contains NaN or inf",
        ),
        ({"train": (make_split(2)[0].drop(columns="id"), *make_split(2)[1:])}, "lacks column(s) ['id']"),
        ({"../x": make_split(2)}, "split name '../x'"),
        ({}, "no splits"),
    ],
)
def test_invalid_inputs(tmp_path, splits, fragment):
    with pytest.raises(ValueError) as exc:
        write_shards(tmp_path / "s", splits, TEACHER)
    assert fragment in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_extra_cannot_override_reserved(tmp_path):
    with pytest.raises(ValueError, match=r"\['dim'\]"):
        write_shards(tmp_path / "s", {"train": make_split(2)}, TEACHER, extra={"dim": 3})


# --------------------------------------------------------------------------- bounded shard files


def shard_rows(manifest, split):
    return [s["rows"] for s in manifest["splits"][split]["shards"]]


@pytest.mark.parametrize(
    "count,rows_per_shard,expected",
    [
        (12, 4, [4, 4, 4]),  # an exact multiple: no empty tail shard
        (10, 4, [4, 4, 2]),  # a remainder
        (3, 100, [3]),  # rows_per_shard larger than the split
        (1, 1, [1]),
        (5, 1, [1, 1, 1, 1, 1]),
        (0, 4, []),  # an empty split has no shard files at all
    ],
)
def test_rows_per_shard_boundaries(tmp_path, count, rows_per_shard, expected):
    frame, inputs, targets = make_split(count, dim=3)
    out = tmp_path / "s"
    manifest = write_shards(out, {"train": (frame, inputs, targets)}, TEACHER, rows_per_shard=rows_per_shard)
    assert manifest["rows_per_shard"] == rows_per_shard
    assert shard_rows(manifest, "train") == expected
    names = [f"train-{i:05d}_{kind}.npy" for i in range(len(expected)) for kind in ("inputs", "targets")]
    assert sorted(p.name for p in out.iterdir()) == sorted([MARK, "manifest.json", "train.parquet", *names])
    for i, rows in enumerate(expected):
        assert np.load(out / f"train-{i:05d}_inputs.npy").shape == (rows, 3)
    s = open_split(out, "train")
    assert s.count == count and s.inputs.shape == (count, 3) and len(s.targets) == count
    assert s.inputs.num_shards == len(expected) and s.inputs.shard_rows == expected
    np.testing.assert_array_equal(np.asarray(s.inputs), inputs)
    np.testing.assert_array_equal(np.asarray(s.targets), targets)
    assert list(s.ids) == frame["id"].tolist()


def test_manifest_lists_every_shard_with_rows_and_sha256(tmp_path):
    out = tmp_path / "s"
    manifest = write_shards(out, {"train": make_split(10), "val": make_split(3, offset=50)}, TEACHER, rows_per_shard=4)
    assert manifest == load_manifest(out)
    assert manifest["splits"]["train"] == {
        "count": 10,
        "texts": "train.parquet",
        "shards": [
            {"inputs": f"train-{i:05d}_inputs.npy", "targets": f"train-{i:05d}_targets.npy", "rows": rows}
            for i, rows in enumerate([4, 4, 2])
        ],
    }
    assert shard_rows(manifest, "val") == [3]
    listed = {s[k] for split in manifest["splits"].values() for s in split["shards"] for k in ("inputs", "targets")} | {
        "train.parquet",
        "val.parquet",
    }
    assert set(manifest["files"]) == listed  # every file, and nothing else
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_float16_round_trip(tmp_path):
    frame, inputs, targets = make_split(11, dim=6)
    manifest = write_shards(
        tmp_path / "s",
        {"train": (frame, inputs, targets.astype(np.float64))},
        TEACHER,
        rows_per_shard=4,
        dtype="float16",
    )
    assert manifest["dtype"] == "float16"
    for i in range(3):
        assert np.load(tmp_path / "s" / f"train-{i:05d}_inputs.npy").dtype == np.float16
    s = open_split(tmp_path / "s", "train")
    assert s.inputs.dtype == np.float16 and s.targets.dtype == np.float16  # on disk
    assert s.inputs.nbytes == 11 * 6 * 2
    want_x = inputs.astype(np.float16).astype(np.float32)
    want_y = targets.astype(np.float16).astype(np.float32)
    for got, want in (
        (np.asarray(s.inputs), want_x),
        (s.targets[:], want_y),
        (s.inputs.take([10, 0, 5]), want_x[[10, 0, 5]]),
        (s.targets[7], want_y[7]),
    ):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_float16_overflow_is_refused(tmp_path):
    frame, inputs, targets = make_split(6)
    inputs[4, 2] = 1e6  # finite in float32, inf in float16
    with pytest.raises(
        ValueError,
        match=r"split 'train' inputs: row 5 contains NaN or inf once "
        r"stored as float16",
    ):
        write_shards(tmp_path / "s", {"train": (frame, inputs, targets)}, TEACHER, rows_per_shard=4, dtype="float16")
    assert list(tmp_path.iterdir()) == []


def test_nan_row_number_counts_across_shards(tmp_path):
    frame, inputs, targets = make_split(10)
    targets[9, 0] = np.nan
    with pytest.raises(ValueError, match=r"split 'train' targets: row 10 contains NaN"):
        write_shards(tmp_path / "s", {"train": (frame, inputs, targets)}, TEACHER, rows_per_shard=4)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"dtype": "float64"}, "dtype='float64'; expected one of ['float32', 'float16']"),
        ({"dtype": "bfloat16"}, "dtype='bfloat16'"),
        ({"dtype": np.int8}, "dtype="),
        ({"rows_per_shard": 0}, "rows_per_shard=0; expected a positive integer"),
        ({"rows_per_shard": 2.5}, "rows_per_shard=2.5"),
        ({"rows_per_shard": True}, "rows_per_shard=True"),
    ],
)
def test_bad_layout_parameters(tmp_path, kwargs, fragment):
    with pytest.raises(ValueError) as exc:
        write_shards(tmp_path / "s", {"train": make_split(3)}, TEACHER, **kwargs)
    assert fragment in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_numpy_dtype_objects_are_accepted(tmp_path):
    manifest = write_shards(tmp_path / "s", {"train": make_split(3)}, TEACHER, dtype=np.float16)
    assert manifest["dtype"] == "float16"


class SliceOnly:
    """An array-like that records the row ranges it was asked for and refuses whole reads."""

    def __init__(self, arr):
        self.arr, self.shape, self.dtype, self.requests = arr, arr.shape, arr.dtype, []

    def __getitem__(self, key):
        assert isinstance(key, slice)
        self.requests.append((key.start, key.stop))
        return self.arr[key]

    def __array__(self, *a, **kw):
        raise AssertionError("the whole split was materialised")


def test_writing_reads_the_source_one_shard_at_a_time(tmp_path):
    frame, inputs, targets = make_split(10)
    src_x, src_y = SliceOnly(inputs.astype(np.float64)), SliceOnly(targets)
    write_shards(tmp_path / "s", {"train": (frame, src_x, src_y)}, TEACHER, rows_per_shard=4)
    assert src_x.requests == src_y.requests == [(0, 4), (4, 8), (8, 10)]
    np.testing.assert_array_equal(open_split(tmp_path / "s", "train").inputs, inputs)


def test_a_sharded_array_can_be_rewritten(tmp_path):
    frame, inputs, targets = make_split(9)
    write_shards(tmp_path / "a", {"train": (frame, inputs, targets)}, TEACHER, rows_per_shard=2)
    a = open_split(tmp_path / "a", "train")
    write_shards(tmp_path / "b", {"train": (frame, a.inputs, a.targets)}, TEACHER, rows_per_shard=4, dtype="float16")
    b = open_split(tmp_path / "b", "train")
    assert b.inputs.shard_rows == [4, 4, 1]
    np.testing.assert_array_equal(b.inputs, inputs.astype(np.float16).astype(np.float32))


# --------------------------------------------------------------------------- shard integrity


@pytest.fixture
def sharded(tmp_path):
    splits = {"train": make_split(10, dim=3), "val": make_split(2, dim=3, offset=30)}
    out = tmp_path / "shards"
    manifest = write_shards(out, splits, TEACHER, rows_per_shard=4)
    return out, splits, manifest


def test_corrupted_middle_shard_is_named(sharded):
    out, _, manifest = sharded
    path = out / "train-00001_inputs.npy"
    flip_bit(path, -3, 0x10)
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    msg = str(exc.value)
    assert str(path) in msg and "sha256 differs from the manifest" in msg
    assert manifest["files"]["train-00001_inputs.npy"]["sha256"] in msg
    open_split(out, "val")  # the other split is unaffected
    open_split(out, "train", verify=False)  # same size and shape: only the hash can tell


def test_missing_shard_is_named_even_without_verify(sharded):
    out, _, _ = sharded
    (out / "train-00002_targets.npy").unlink()
    for verify in (True, False):
        with pytest.raises(
            ShardError,
            match=r"train-00002_targets\.npy: file missing \(listed in "
            r"the manifest for split 'train'\)",
        ):
            open_split(out, "train", verify=verify)


def test_truncated_last_shard_is_named(sharded):
    out, _, manifest = sharded
    path = out / "train-00002_inputs.npy"
    path.write_bytes(path.read_bytes()[:-5])
    expected = manifest["files"]["train-00002_inputs.npy"]["bytes"]
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    assert (
        f"train-00002_inputs.npy: size differs from the manifest: expected {expected} bytes, "
        f"found {expected - 5}" in str(exc.value)
    )
    with pytest.raises(ShardError, match=r"train-00002_inputs\.npy: not a readable \.npy array"):
        open_split(out, "train", verify=False)  # the header promises more data than is there


@pytest.mark.parametrize(
    "replacement,fragment",
    [
        (np.zeros((3, 3), np.float32), "shape differs from the manifest: expected (4, 3), found (3, 3)"),
        (np.zeros((4, 2), np.float32), "shape differs from the manifest: expected (4, 3), found (4, 2)"),
        (np.zeros((4, 3), np.float16), "dtype differs from the manifest: expected float32, found float16"),
    ],
)
def test_shard_with_wrong_rows_dim_or_dtype_is_named(sharded, replacement, fragment):
    out, _, _ = sharded
    np.save(out / "train-00001_targets.npy", replacement)
    with pytest.raises(ShardError) as exc:
        open_split(out, "train", verify=False)
    assert f"train-00001_targets.npy: {fragment}" in str(exc.value)


def test_manifest_whose_shards_do_not_add_up_is_refused(sharded):
    out, _, manifest = sharded
    manifest["splits"]["train"]["count"] = 11
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"split 'train' shards hold 10 rows but its count is 11"):
        open_split(out, "train", verify=False)


def test_unknown_manifest_dtype_is_refused(sharded):
    out, _, manifest = sharded
    (out / "manifest.json").write_text(json.dumps({**manifest, "dtype": "int8"}))
    with pytest.raises(ShardError, match=r"shard dtype is 'int8'.*embed stage"):
        load_manifest(out)


# --------------------------------------------------------------------------- ShardedArray


@pytest.fixture
def big(tmp_path):
    frame, inputs, targets = make_split(23, dim=5)
    write_shards(tmp_path / "s", {"train": (frame, inputs, targets)}, TEACHER, rows_per_shard=5)
    return open_split(tmp_path / "s", "train"), inputs, targets


def test_take_across_shard_boundaries_keeps_the_given_order(big):
    s, inputs, targets = big
    assert s.inputs.shard_rows == [5, 5, 5, 5, 3]
    rng = np.random.default_rng(0)
    for idx in (
        rng.permutation(23),
        rng.integers(0, 23, 40),
        np.array([22, 0, 4, 5, 9, 10, 4]),
        np.array([7]),
        np.array([], np.int64),
        np.array([-1, -23, 3]),
        [3, 2, 1],
    ):
        got = s.inputs.take(idx)
        assert got.dtype == np.float32 and got.shape == (len(idx), 5)
        np.testing.assert_array_equal(got, inputs[idx])
        np.testing.assert_array_equal(s.targets.take(idx), targets[idx])
    np.testing.assert_array_equal(s.inputs.take(np.array([[1, 20], [6, 6]])), inputs[np.array([[1, 20], [6, 6]])])


def test_take_result_is_a_fresh_writable_copy(big):
    s, inputs, _ = big
    got = s.inputs.take([1, 2])
    got[:] = 0
    np.testing.assert_array_equal(s.inputs[1:3], inputs[1:3])


def test_take_out_of_bounds(big):
    s, _, _ = big
    for bad in ([23], [0, -24], [1.5]):
        with pytest.raises(IndexError):
            s.inputs.take(bad)


def test_getitem_ints_slices_masks(big):
    s, inputs, _ = big
    a = s.inputs
    for key in (
        0,
        4,
        5,
        22,
        -1,
        -23,
        np.int64(7),
        slice(None),
        slice(3, 12),
        slice(4, 6),
        slice(20, 100),
        slice(10, 3),
        slice(None, None, 3),
        slice(None, None, -1),
        slice(-4, None),
        [0, 22, 5],
        np.arange(23) % 2 == 0,
        (5, 2),
        (slice(2, 8), 1),
        (slice(None), slice(0, 2)),
        (np.array([3, 19]), -1),
        Ellipsis,
    ):
        got = a[key]
        assert isinstance(got, (np.ndarray, np.float32)) and got.dtype == np.float32, key
        np.testing.assert_array_equal(got, inputs[key])
    with pytest.raises(IndexError):
        a[23]
    with pytest.raises(IndexError):
        a[np.ones(5, bool)]


def test_array_protocol_and_attributes(big):
    s, inputs, _ = big
    a = s.inputs
    assert len(a) == 23 and a.shape == (23, 5) and a.ndim == 2 and a.size == 115
    assert a.dtype == np.float32 and a.nbytes == 23 * 5 * 4
    assert "ShardedArray(shape=(23, 5), dtype=float32, shards=5)" == repr(a)
    assert a.names[0] == "train-00000_inputs.npy"
    full = np.asarray(a)
    assert full.dtype == np.float32 and full.flags.writeable
    np.testing.assert_array_equal(full, inputs)
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), inputs.astype(np.float64))
    np.testing.assert_array_equal(np.array(list(a)), inputs)
    assert np.array_equal(a, inputs)
    with pytest.raises(ValueError, match="without a copy"):
        np.asarray(a, copy=False)


# --------------------------------------------------------------------------- format 1


def test_format_1_directory_is_still_read(tmp_path):
    """The single-file layout of format 1 (float32 {split}_inputs.npy / _targets.npy)."""
    frame, inputs, targets = make_split(7)
    out = tmp_path / "old"
    out.mkdir()
    shard_writer._write_texts(out / "train.parquet", frame)
    np.save(out / "train_inputs.npy", inputs)
    np.save(out / "train_targets.npy", targets)
    files = {
        n: {"sha256": shards.sha256_file(out / n), "bytes": (out / n).stat().st_size}
        for n in ("train.parquet", "train_inputs.npy", "train_targets.npy")
    }
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "dim": 4,
                "dtype": "float32",
                "teacher": TEACHER,
                "files": files,
                "splits": {
                    "train": {
                        "count": 7,
                        "texts": "train.parquet",
                        "inputs": "train_inputs.npy",
                        "targets": "train_targets.npy",
                    }
                },
            }
        )
    )
    s = open_split(out, "train")
    assert isinstance(s.inputs, ShardedArray) and s.inputs.num_shards == 1
    np.testing.assert_array_equal(s.inputs, inputs)
    np.testing.assert_array_equal(s.targets.take([6, 0]), targets[[6, 0]])
    (out / "train_targets.npy").write_bytes(b"\x93NUMPY")
    with pytest.raises(ShardError, match=r"train_targets\.npy: size differs"):
        open_split(out, "train")
