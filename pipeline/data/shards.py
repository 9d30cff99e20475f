"""Embedding shards: the on-disk hand-off from the embed stage to train and evaluate.

Layout of a shard directory (format_version 2):
    manifest.json                 format version, dim, dtype, rows_per_shard, teacher, splits
                                  (count, texts file, shards in order with their rows) and the
                                  sha256 + size of every file
    {split}.parquet               id, input_text, target_text
    {split}-00000_inputs.npy      (rows, dim) float32 or float16, C order, rows <= rows_per_shard
    {split}-00000_targets.npy     the same rows' targets
    {split}-00001_inputs.npy      ... and so on; a split with no rows has no shard files

The arrays are plain .npy so readers can memory-map them: training never loads a split whole,
and a split larger than memory is read a batch at a time (ShardedArray.take). The manifest
records checksums so a truncated copy or a stale file from another run is caught before it
silently trains on the wrong data. Format 1 directories (one {split}_inputs.npy /
{split}_targets.npy pair per split, float32) are still read.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.core.errors import ShardError
from pipeline.core.paths import check_readable_inside

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
TEXT_COLUMNS = ("id", "input_text", "target_text")
GROUP_COLUMN = "group"  # optional on read: shards written before it existed have none
DTYPES = ("float32", "float16")
_HINT = "run the embed stage to (re)create the shards"
_SHARD_FILE = "the shards' file (embed.out_dir)"
KINDS = ("inputs", "targets")  # the arrays of a shard, in the order they are written


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:  # read a block at a time: shard files can be many GiB
        return hashlib.file_digest(f, "sha256").hexdigest()


def dataset_digest(files: list[Path]) -> str:
    """sha256 of one file, or, for several, of their names and sha256s in order."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def shard_names(split: str, index: int) -> tuple[str, str]:
    """File names of shard `index` of `split`: (inputs, targets)."""
    return f"{split}-{index:05d}_inputs.npy", f"{split}-{index:05d}_targets.npy"


class ShardedArray:
    """A read-only (count, dim) array over consecutive memory-mapped shards.

    Nothing is read until asked for: `take(idx)` gathers rows by global index with one fancy
    index per shard touched, into a fresh float32 array (float16 shards are widened there, a
    batch at a time). Indexing with an int, a slice, an integer array or a boolean mask also
    returns float32 numpy; `np.asarray(a)` materialises the whole array (for small splits)."""

    ndim = 2

    def __init__(self, parts: Sequence[np.ndarray], dim: int, dtype: Any, names: Sequence[str] = ()):
        self._parts = [np.asarray(p) for p in parts]  # ndarray views of the memmaps
        self._dim = int(dim)
        self._dtype = np.dtype(dtype)
        rows = np.array([len(p) for p in self._parts], dtype=np.int64)
        self._ends = np.cumsum(rows)
        self._starts = self._ends - rows
        self._count = int(self._ends[-1]) if len(rows) else 0
        self.names = tuple(names)
        for p in self._parts:
            if p.ndim != 2 or p.shape[1] != self._dim or p.dtype != self._dtype:
                raise ValueError(
                    f"shard of shape {p.shape} and dtype {p.dtype}; expected (rows, {self._dim}) {self._dtype}"
                )

    # array-like attributes
    @property
    def shape(self) -> tuple[int, int]:
        return (self._count, self._dim)

    @property
    def dtype(self) -> np.dtype:
        """The on-disk dtype; everything read comes back as float32."""
        return self._dtype

    @property
    def size(self) -> int:
        return self._count * self._dim

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def num_shards(self) -> int:
        return len(self._parts)

    @property
    def shard_rows(self) -> list[int]:
        return [len(p) for p in self._parts]

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"ShardedArray(shape={self.shape}, dtype={self._dtype.name}, shards={self.num_shards})"

    # reading
    def _normalise(self, idx: Any) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                idx = idx.astype(np.int64)
            else:
                raise IndexError(f"row indices have dtype {idx.dtype}; expected integers")
        idx = idx.astype(np.int64, copy=False)
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            n = self._count
            if lo < -n or hi >= n:
                bad = lo if lo < -n else hi
                raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
            if lo < 0:
                idx = np.where(idx < 0, idx + n, idx)
        return idx

    def take(self, idx: Any) -> np.ndarray:
        """Rows `idx` (any order, repeats allowed, negatives from the end) as a new float32
        array of shape (len(idx), dim), in the order given."""
        idx = self._normalise(idx)
        if idx.ndim != 1:
            return self.take(idx.ravel()).reshape(idx.shape + (self._dim,))
        out = np.empty((len(idx), self._dim), dtype=np.float32)
        if not len(idx):
            return out
        shard = np.searchsorted(self._ends, idx, side="right")
        first, last = int(shard.min()), int(shard.max())
        if first == last:  # the common case: a batch within one shard
            part = self._parts[first]
            local = idx - self._starts[first] if first else idx
            if part.dtype == np.float32:
                np.take(part, local, axis=0, out=out)
            else:
                out[...] = part[local]
            return out
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=len(self._parts))
        pos = 0
        for s in np.flatnonzero(counts):
            sel = order[pos : pos + counts[s]]
            pos += int(counts[s])
            out[sel] = self._parts[s][idx[sel] - self._starts[s]]
        return out

    def _range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(0, stop - start), self._dim), dtype=np.float32)
        for s, part in enumerate(self._parts):
            a, b = max(start, int(self._starts[s])), min(stop, int(self._ends[s]))
            if a < b:
                out[a - start : b - start] = part[a - self._starts[s] : b - self._starts[s]]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            if not key:
                return self._range(0, self._count)
            rows = self[key[0]]
            rest = key[1:]
            if rows.ndim == 1:  # an int row: the rest index the row itself
                return rows[rest]
            return rows[(slice(None),) + rest]
        if key is Ellipsis:
            return self._range(0, self._count)
        if isinstance(key, slice):
            start, stop, step = key.indices(self._count)
            if step == 1:
                return self._range(start, stop)
            return self.take(np.arange(start, stop, step))
        if not isinstance(key, (bool, np.bool_)):
            try:
                i = operator.index(key)
            except TypeError:
                i = None
            if i is not None:
                return self.take(np.array([i]))[0]
        arr = np.asarray(key)
        if arr.dtype == np.bool_:
            if arr.shape != (self._count,):
                raise IndexError(f"boolean index of shape {arr.shape}; expected ({self._count},)")
            return self.take(np.flatnonzero(arr))
        return self.take(arr)

    def __iter__(self):
        for start in range(0, self._count, 4096):
            yield from self._range(start, min(start + 4096, self._count))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a ShardedArray cannot be viewed as one array without a copy")
        out = self._range(0, self._count)
        return out if dtype is None else out.astype(dtype, copy=False)


def load_manifest(shard_dir: str | os.PathLike) -> dict:
    path = check_readable_inside(Path(shard_dir) / MANIFEST, _SHARD_FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ShardError(f"{path}: shard manifest not found; {_HINT}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ShardError(f"{path}: cannot read shard manifest ({e}); {_HINT}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise ShardError(
            f"{path}: shard manifest is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); {_HINT}"
        ) from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{path}: shard manifest is not a JSON object; {_HINT}")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise ShardError(
            f"{path}: shard format_version is {version!r}, expected "
            f"{FORMAT_VERSION} (or the older {READABLE_VERSIONS[0]}); {_HINT}"
        )
    missing = [k for k in ("dim", "dtype", "splits", "files") if k not in manifest]
    if missing:
        raise ShardError(f"{path}: shard manifest lacks {missing}; {_HINT}")
    if manifest["dtype"] not in DTYPES:
        raise ShardError(f"{path}: shard dtype is {manifest['dtype']!r}, expected one of {list(DTYPES)}; {_HINT}")
    dim = manifest["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ShardError(f"{path}: shard dim is {dim!r}, expected a positive integer; {_HINT}")
    if not isinstance(manifest["splits"], dict) or not isinstance(manifest["files"], dict):
        raise ShardError(f"{path}: shard manifest's splits and files are not JSON objects; {_HINT}")
    return manifest


@dataclass(frozen=True)
class SplitShard:
    """One split: texts in memory, embeddings as read-only memory-mapped ShardedArrays."""

    split: str
    ids: np.ndarray  # object array of str
    input_texts: np.ndarray  # object array of str
    target_texts: np.ndarray  # object array of str
    groups: np.ndarray  # object array of str: rows of one group have one answer (else = target_texts)
    inputs: ShardedArray  # (count, dim); reads come back float32
    targets: ShardedArray  # (count, dim)
    dim: int
    count: int


def _verify_file(shard_dir: Path, name: str, manifest: dict) -> None:
    path = shard_dir / name
    entry = manifest["files"].get(name)
    if entry is None:
        raise ShardError(
            f"{path}: not listed in the manifest's files; expected an entry with its sha256 — run the embed stage again"
        )
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ShardError(
            f"{path}: size differs from the manifest: expected {entry['bytes']} "
            f"bytes, found {size} (changed or cut short since the embed stage wrote it); {_HINT}"
        )
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise ShardError(
            f"{path}: sha256 differs from the manifest: expected {entry['sha256']}, "
            f"found {digest} (changed since the embed stage wrote it); {_HINT}"
        )


_CHECK_ELEMENTS = 1 << 22  # values per finiteness block on read: a few MiB of temporaries whatever the dim


def first_nonfinite(arr: np.ndarray) -> tuple[int, int, str] | None:
    """(row, column, "NaN" | "inf" | "-inf") of the first value of a (rows, dim) array that is not
    finite, 0-based, or None. Read in blocks of rows, so a memory map is scanned without being
    copied whole and the boolean temporaries stay small."""
    rows_per_block = max(1, _CHECK_ELEMENTS // max(1, arr.shape[1] if arr.ndim == 2 else 1))
    for start in range(0, arr.shape[0], rows_per_block):
        block = arr[start : start + rows_per_block]
        finite = np.isfinite(block)
        if not finite.all():
            row, col = np.unravel_index(int(np.argmin(finite.reshape(-1))), block.shape)
            value = float(block[row, col])
            return start + int(row), int(col), "NaN" if value != value else ("inf" if value > 0 else "-inf")
    return None


def _check_values(path: Path, arr: np.ndarray, split: str, first_row: int) -> None:
    """Refuse a shard holding NaN or inf: the checksums only say a file is the one the manifest
    lists, not that what wrote it wrote numbers. Named by file, row of the file and of the split."""
    bad = first_nonfinite(arr)
    if bad is None:
        return
    row, col, what = bad
    of_split = f", row {first_row + row + 1} of the split" if first_row else ""
    raise ShardError(
        f"{path}: row {row + 1} holds {what} (column {col + 1}; split {split!r}{of_split}); expected finite "
        f"embeddings: the shard is damaged or was not written by the embed stage; {_HINT} (dvc repro embed)"
    )


def _load_array(path: Path, rows: int, dim: int, dtype: np.dtype) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ShardError(f"{path}: not a readable .npy array ({e}); expected ({rows}, {dim}) {dtype.name}") from None
    if arr.shape != (rows, dim):
        raise ShardError(f"{path}: shape differs from the manifest: expected {(rows, dim)}, found {arr.shape}")
    if arr.dtype != dtype:
        raise ShardError(f"{path}: dtype differs from the manifest: expected {dtype.name}, found {arr.dtype}")
    # A plain ndarray view of the map (it keeps the map alive): gathers from it return plain
    # arrays, without np.memmap's per-result bookkeeping.
    return arr.view(np.ndarray)


def _load_texts(path: Path, count: int) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        has_group = GROUP_COLUMN in pq.read_schema(path).names
        table = pq.read_table(path, columns=list(TEXT_COLUMNS) + ([GROUP_COLUMN] if has_group else []))
    except (pa.ArrowException, OSError) as e:
        raise ShardError(f"{path}: not a readable Parquet file with columns {list(TEXT_COLUMNS)} ({e})") from None
    if table.num_rows != count:
        raise ShardError(f"{path}: row count differs from the manifest: expected {count}, found {table.num_rows}")
    out = {}
    for c in TEXT_COLUMNS + ((GROUP_COLUMN,) if has_group else ()):
        col = np.empty(count, dtype=object)
        col[:] = table.column(c).to_pylist()
        out[c] = col
    out.setdefault(GROUP_COLUMN, out["target_text"])
    return out


def split_layout(manifest: dict, split: str, where: Path) -> tuple[int, str, list[dict]]:
    """(count, texts file, shards [{"inputs", "targets", "rows"}]) of a split in either format."""
    entry = manifest["splits"][split]
    try:
        count = int(entry["count"])
        if manifest["format_version"] == 1:  # one float32 file per array
            shards = [{"inputs": entry["inputs"], "targets": entry["targets"], "rows": count}]
        else:
            shards = [{"inputs": s["inputs"], "targets": s["targets"], "rows": int(s["rows"])} for s in entry["shards"]]
        texts = entry["texts"]
    except (KeyError, TypeError, ValueError) as e:
        raise ShardError(f"{where}: split {split!r} entry is malformed ({e!r}); {_HINT}") from None
    for name in [texts] + [s[k] for s in shards for k in KINDS]:
        # A name is joined to the shard directory: one with a separator or '..' would read elsewhere.
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise ShardError(f"{where}: split {split!r} lists the file {name!r}; expected a plain file name; {_HINT}")
    if any(s["rows"] < 0 for s in shards) or count < 0:
        raise ShardError(f"{where}: split {split!r} has a negative row count; {_HINT}")
    total = sum(s["rows"] for s in shards)
    if total != count:
        raise ShardError(f"{where}: split {split!r} shards hold {total} rows but its count is {count}; {_HINT}")
    return count, texts, shards


def open_split(shard_dir: str | os.PathLike, split: str, verify: bool = True, need_rows: str = "") -> SplitShard:
    """Open one split. Existence, shapes, dtype and row count of every file are always checked
    (they are cheap); verify=True also checks every file's size and sha256 against the
    manifest and that every value is finite (one more pass over the data, a block at a time: a
    NaN would otherwise surface deep in the model as an index out of range). The arrays are
    memory-mapped, not read into memory. `need_rows` (what the rows are for, e.g.
    "to evaluate on"): a split with no rows is then an error saying so, not an empty result."""
    shard_dir = Path(shard_dir)
    manifest = load_manifest(shard_dir)
    splits = manifest["splits"]
    if split not in splits:
        raise ShardError(
            f"{shard_dir / MANIFEST}: no split {split!r}; splits present: {', '.join(sorted(splits)) or '(none)'}"
        )
    count, texts_name, shards = split_layout(manifest, split, shard_dir / MANIFEST)
    if need_rows and count == 0:
        raise ShardError(
            f"{shard_dir / MANIFEST}: split {split!r} has 0 rows; expected rows {need_rows}. Re-run "
            "the embed stage (it refuses a dataset that leaves a split empty and says what to change)"
        )
    dim, dtype = int(manifest["dim"]), np.dtype(manifest["dtype"])
    names = [texts_name] + [s[k] for s in shards for k in KINDS]
    for name in names:
        check_readable_inside(shard_dir / name, _SHARD_FILE)
        if not (shard_dir / name).is_file():
            raise ShardError(
                f"{shard_dir / name}: file missing (listed in the manifest for "
                f"split {split!r}); run the embed stage again"
            )
    if verify:
        for name in names:
            _verify_file(shard_dir, name, manifest)
    texts = _load_texts(shard_dir / texts_name, count)
    arrays = {}
    for kind in KINDS:
        parts, first_row = [], 0
        for s in shards:
            part = _load_array(shard_dir / s[kind], s["rows"], dim, dtype)
            if verify:
                _check_values(shard_dir / s[kind], part, split, first_row)
            parts.append(part)
            first_row += s["rows"]
        arrays[kind] = ShardedArray(parts, dim, dtype, names=[s[kind] for s in shards])
    return SplitShard(
        split=split,
        ids=texts["id"],
        input_texts=texts["input_text"],
        target_texts=texts["target_text"],
        groups=texts[GROUP_COLUMN],
        inputs=arrays["inputs"],
        targets=arrays["targets"],
        dim=dim,
        count=count,
    )
