"""Embedding shards: the on-disk hand-off from the embed stage to train and evaluate.

Layout of a shard directory:
    manifest.json            format version, dim, teacher, splits, sha256 + size of every file
    {split}.parquet          id, input_text, target_text
    {split}_inputs.npy       (count, dim) float32, C order
    {split}_targets.npy      (count, dim) float32, C order

The arrays are plain .npy so readers can memory-map them: training never loads a split whole.
The manifest records checksums so a truncated copy or a stale file from another run is caught
before it silently trains on the wrong data.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.atomic import write_json
from pipeline.errors import ShardError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TEXT_COLUMNS = ("id", "input_text", "target_text")
_CHUNK = 1 << 20  # hash in 1 MiB chunks: shard files can be many GiB
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # becomes part of file names
_RESERVED = {"format_version", "dim", "dtype", "teacher", "splits", "files"}


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def dataset_digest(files: list[Path]) -> str:
    """sha256 of one file, or, for several, of their names and sha256s in order."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- writing


def _check_finite(name: str, arr: np.ndarray) -> None:
    # Chunked so a large array does not need a same-sized boolean temporary.
    for start in range(0, arr.shape[0], 65536):
        block = arr[start:start + 65536]
        if not np.isfinite(block).all():
            row = start + int(np.argmin(np.isfinite(block).all(axis=1)))
            raise ValueError(f"{name}: row {row + 1} contains NaN or inf; expected finite "
                             "embeddings")


def _prepare(splits: dict[str, tuple[pd.DataFrame, np.ndarray, np.ndarray]]):
    if not splits:
        raise ValueError("no splits to write; expected at least one, e.g. {'train': (...)}")
    dim = None
    prepared = {}
    for split, value in splits.items():
        if not isinstance(split, str) or not _SPLIT_NAME.match(split):
            raise ValueError(f"split name {split!r} is not usable in a file name; expected "
                             "letters, digits, '_' or '-'")
        frame, inputs, targets = value
        missing = [c for c in TEXT_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"split {split!r}: frame lacks column(s) {missing}; "
                             f"expected {list(TEXT_COLUMNS)}")
        n = len(frame)
        arrays = {}
        for kind, arr in (("inputs", inputs), ("targets", targets)):
            arr = np.asarray(arr)
            if arr.ndim != 2 or arr.shape[0] != n:
                raise ValueError(f"split {split!r}: {kind} have shape {arr.shape}; expected "
                                 f"({n}, dim) to match the frame's {n} rows")
            if not np.issubdtype(arr.dtype, np.floating):
                raise ValueError(f"split {split!r}: {kind} have dtype {arr.dtype}; expected "
                                 "floating point (stored as float32)")
            if dim is None:
                dim = arr.shape[1]
            if arr.shape[1] != dim:
                raise ValueError(f"split {split!r}: {kind} have dim {arr.shape[1]}; expected "
                                 f"{dim} like the other arrays")
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            _check_finite(f"split {split!r} {kind}", arr)
            arrays[kind] = arr
        prepared[split] = (frame, arrays["inputs"], arrays["targets"])
    return prepared, int(dim)


def _write_texts(path: Path, frame: pd.DataFrame) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: pa.array([str(v) for v in frame[c]], type=pa.string())
                      for c in TEXT_COLUMNS})
    pq.write_table(table, path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_shards(out_dir: str | os.PathLike,
                 splits: dict[str, tuple[pd.DataFrame, np.ndarray, np.ndarray]],
                 teacher: dict, extra: dict | None = None) -> dict:
    """Write all splits and the manifest, replacing `out_dir` as a whole; return the manifest.

    Everything is written into a fresh directory beside `out_dir` and swapped in at the end, so
    a killed run leaves either the previous shards or the new ones, never a mix."""
    out_dir = Path(out_dir)
    extra = dict(extra or {})
    clash = sorted(_RESERVED & set(extra))
    if clash:
        raise ValueError(f"extra manifest keys {clash} would overwrite reserved keys; "
                         f"expected none of {sorted(_RESERVED)}")
    prepared, dim = _prepare(splits)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes 0700; the shard dir should look like any other
    try:
        split_entries: dict[str, Any] = {}
        files: dict[str, Any] = {}
        for split, (frame, inputs, targets) in prepared.items():
            names = {"texts": f"{split}.parquet", "inputs": f"{split}_inputs.npy",
                     "targets": f"{split}_targets.npy"}
            _write_texts(tmp / names["texts"], frame)
            np.save(tmp / names["inputs"], inputs, allow_pickle=False)
            np.save(tmp / names["targets"], targets, allow_pickle=False)
            split_entries[split] = {"count": len(frame), **names}
            for name in names.values():
                _fsync(tmp / name)
                files[name] = {"sha256": sha256_file(tmp / name),
                               "bytes": (tmp / name).stat().st_size}
        manifest = {"format_version": FORMAT_VERSION, "dim": dim, "dtype": "float32",
                    "teacher": teacher, "splits": split_entries, "files": files, **extra}
        write_json(tmp / MANIFEST, manifest)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Round-trip through JSON so the caller sees exactly what a reader will (tuples -> lists).
    return json.loads(json.dumps(manifest))


def _swap_in(new: Path, dest: Path) -> None:
    """Replace `dest` with directory `new`: rename old away, rename new in, delete old."""
    if not dest.exists():
        os.replace(new, dest)
        return
    if not dest.is_dir() or dest.is_symlink():
        raise ValueError(f"{dest} exists and is not a directory; expected a shard directory")
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
    os.rmdir(old)  # only reserved a unique name; rename needs it absent
    os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(old, dest)  # put the previous shards back rather than leave nothing
        raise
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- reading


def load_manifest(shard_dir: str | os.PathLike) -> dict:
    path = Path(shard_dir) / MANIFEST
    hint = "run the embed stage to (re)create the shards"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ShardError(f"{path}: shard manifest not found; {hint}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ShardError(f"{path}: cannot read shard manifest ({e}); {hint}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise ShardError(f"{path}: shard manifest is not valid JSON (line {e.lineno}, column "
                         f"{e.colno}: {e.msg}); {hint}") from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{path}: shard manifest is not a JSON object; {hint}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ShardError(f"{path}: shard format_version is {version!r}, expected "
                         f"{FORMAT_VERSION}; {hint}")
    missing = [k for k in ("dim", "dtype", "splits", "files") if k not in manifest]
    if missing:
        raise ShardError(f"{path}: shard manifest lacks {missing}; {hint}")
    return manifest


@dataclass(frozen=True)
class SplitShard:
    """One split: texts in memory, embeddings as read-only memory maps."""
    split: str
    ids: np.ndarray           # object array of str
    input_texts: np.ndarray   # object array of str
    target_texts: np.ndarray  # object array of str
    inputs: np.ndarray        # (count, dim) float32 memmap
    targets: np.ndarray       # (count, dim) float32 memmap
    dim: int
    count: int


def _verify_file(shard_dir: Path, name: str, manifest: dict) -> None:
    path = shard_dir / name
    entry = manifest["files"].get(name)
    if entry is None:
        raise ShardError(f"{path}: not listed in the manifest's files; expected an entry with "
                         "its sha256 — run the embed stage again")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ShardError(f"{path}: size differs from the manifest: expected {entry['bytes']} "
                         f"bytes, found {size}")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise ShardError(f"{path}: sha256 differs from the manifest: expected {entry['sha256']}, "
                         f"found {digest}")


def _load_array(path: Path, count: int, dim: int) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ShardError(f"{path}: not a readable .npy array ({e}); expected ({count}, {dim}) "
                         "float32") from None
    if arr.shape != (count, dim):
        raise ShardError(f"{path}: shape differs from the manifest: expected {(count, dim)}, "
                         f"found {arr.shape}")
    if arr.dtype != np.float32:
        raise ShardError(f"{path}: dtype differs from the manifest: expected float32, "
                         f"found {arr.dtype}")
    return arr


def _load_texts(path: Path, count: int) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=list(TEXT_COLUMNS))
    except (pa.ArrowException, OSError) as e:
        raise ShardError(f"{path}: not a readable Parquet file with columns "
                         f"{list(TEXT_COLUMNS)} ({e})") from None
    if table.num_rows != count:
        raise ShardError(f"{path}: row count differs from the manifest: expected {count}, "
                         f"found {table.num_rows}")
    out = {}
    for c in TEXT_COLUMNS:
        col = np.empty(count, dtype=object)
        col[:] = table.column(c).to_pylist()
        out[c] = col
    return out


def open_split(shard_dir: str | os.PathLike, split: str, verify: bool = True) -> SplitShard:
    """Open one split. Existence, shapes, dtype and row count are always checked (they are
    cheap); verify=True also checks every file's size and sha256 against the manifest."""
    shard_dir = Path(shard_dir)
    manifest = load_manifest(shard_dir)
    splits = manifest["splits"]
    if split not in splits:
        raise ShardError(f"{shard_dir / MANIFEST}: no split {split!r}; splits present: "
                         f"{', '.join(sorted(splits)) or '(none)'}")
    entry = splits[split]
    count, dim = int(entry["count"]), int(manifest["dim"])
    names = [entry["texts"], entry["inputs"], entry["targets"]]
    for name in names:
        if not (shard_dir / name).is_file():
            raise ShardError(f"{shard_dir / name}: file missing (listed in the manifest for "
                             f"split {split!r}); run the embed stage again")
    if verify:
        for name in names:
            _verify_file(shard_dir, name, manifest)
    texts = _load_texts(shard_dir / entry["texts"], count)
    return SplitShard(
        split=split,
        ids=texts["id"],
        input_texts=texts["input_text"],
        target_texts=texts["target_text"],
        inputs=_load_array(shard_dir / entry["inputs"], count, dim),
        targets=_load_array(shard_dir / entry["targets"], count, dim),
        dim=dim,
        count=count,
    )
