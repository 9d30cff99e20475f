"""Shard round trip, manifest contents, integrity checks and crash-safe replacement."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.data import shards
from pipeline.data.shards import load_manifest, open_split, write_shards
from pipeline.errors import ShardError

TEACHER = {"name": "tiny-teacher", "revision": "abc123"}


def make_split(n: int, dim: int = 4, offset: int = 0):
    frame = pd.DataFrame({"id": [f"id{offset + i}" for i in range(n)],
                          "input_text": [f"in {offset + i}" for i in range(n)],
                          "target_text": [f"out {offset + i}" for i in range(n)]})
    rng = np.random.default_rng(offset)
    return (frame, rng.standard_normal((n, dim)).astype(np.float32),
            rng.standard_normal((n, dim)).astype(np.float32))


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
        assert isinstance(s.inputs, np.memmap) and isinstance(s.targets, np.memmap)
        assert s.inputs.dtype == np.float32 and s.inputs.flags.c_contiguous
        np.testing.assert_array_equal(s.inputs, inputs)
        np.testing.assert_array_equal(s.targets, targets)


def test_manifest_contents(written):
    out, _, manifest = written
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest == load_manifest(out)
    assert manifest["format_version"] == 1 and manifest["dim"] == 4
    assert manifest["dtype"] == "float32" and manifest["teacher"] == TEACHER
    assert manifest["source_sha256"] == "feed"
    assert manifest["splits"]["train"] == {"count": 10, "texts": "train.parquet",
                                           "inputs": "train_inputs.npy",
                                           "targets": "train_targets.npy"}
    assert manifest["splits"]["val"]["count"] == 3
    assert sorted(manifest["files"]) == sorted(
        f"{s}{suffix}" for s in ("train", "val")
        for suffix in (".parquet", "_inputs.npy", "_targets.npy"))
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


def test_tampered_npy_byte_is_caught(written):
    out, _, manifest = written
    path = out / "train_targets.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    msg = str(exc.value)
    assert "train_targets.npy" in msg and "sha256 differs" in msg
    assert manifest["files"]["train_targets.npy"]["sha256"] in msg
    assert hashlib.sha256(bytes(data)).hexdigest() in msg
    # Other splits are untouched and still open; verify=False skips the hash.
    open_split(out, "val")
    assert open_split(out, "train", verify=False).count == 10


def test_truncated_file_reports_sizes(written):
    out, _, manifest = written
    path = out / "train_inputs.npy"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ShardError) as exc:
        open_split(out, "train")
    expected = manifest["files"]["train_inputs.npy"]["bytes"]
    assert f"train_inputs.npy: size differs from the manifest: expected {expected} bytes, " \
           f"found {expected - 8}" in str(exc.value)


def test_deleted_file_is_named(written):
    out, _, _ = written
    (out / "val.parquet").unlink()
    with pytest.raises(ShardError, match=r"val\.parquet: file missing .*split 'val'"):
        open_split(out, "val", verify=False)


def test_wrong_shape_caught_even_without_verify(written):
    out, _, _ = written
    np.save(out / "train_inputs.npy", np.zeros((10, 5), np.float32))
    with pytest.raises(ShardError) as exc:
        open_split(out, "train", verify=False)
    assert "train_inputs.npy: shape differs from the manifest: expected (10, 4), found (10, 5)" \
        in str(exc.value)


def test_wrong_dtype_caught(written):
    out, _, _ = written
    np.save(out / "val_targets.npy", np.zeros((3, 4), np.float64))
    with pytest.raises(ShardError, match=r"val_targets\.npy: dtype differs from the manifest: "
                                         r"expected float32, found float64"):
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
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))
    with pytest.raises(ShardError, match="format_version is 2, expected 1"):
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
        write_shards(out, {"train": make_split(6, offset=7), "val": make_split(2, offset=9)},
                     {"name": "other"})
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
    real_replace = shards.os.replace

    def replace(src, dst):
        # Let "old away" happen, fail "new in".
        if str(dst) == str(out) and ".tmp" in str(src):
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(shards.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        write_shards(out, {"train": make_split(2)}, TEACHER)
    assert load_manifest(out) == manifest
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


def test_rewrite_replaces_whole_directory(written):
    out, _, _ = written
    (out / "stray.txt").write_text("from an older run")
    write_shards(out, {"test": make_split(2, dim=8)}, TEACHER)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.parquet",
                                                     "test_inputs.npy", "test_targets.npy"]
    assert open_split(out, "test").dim == 8
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


@pytest.mark.parametrize("splits,fragment", [
    ({"train": (make_split(3)[0], np.zeros((4, 4), np.float32), np.zeros((3, 4), np.float32))},
     "inputs have shape (4, 4); expected (3, dim)"),
    ({"train": (make_split(3)[0], np.zeros((3, 4), np.float32), np.zeros((3,), np.float32))},
     "targets have shape (3,)"),
    ({"train": make_split(3, dim=4), "val": make_split(2, dim=5)},
     "split 'val': inputs have dim 5; expected 4"),
    ({"train": (make_split(2)[0], np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32))},
     "targets have dim 3; expected 4"),
    ({"train": (make_split(2)[0], np.full((2, 4), np.nan, np.float32),
                np.zeros((2, 4), np.float32))}, "row 1 contains NaN or inf"),
    ({"train": (make_split(2)[0].drop(columns="id"), *make_split(2)[1:])}, "lacks column(s) ['id']"),
    ({"../x": make_split(2)}, "split name '../x'"),
    ({}, "no splits"),
])
def test_invalid_inputs(tmp_path, splits, fragment):
    with pytest.raises(ValueError) as exc:
        write_shards(tmp_path / "s", splits, TEACHER)
    assert fragment in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_extra_cannot_override_reserved(tmp_path):
    with pytest.raises(ValueError, match=r"\['dim'\]"):
        write_shards(tmp_path / "s", {"train": make_split(2)}, TEACHER, extra={"dim": 3})
