"""Writing embedding shards (the layout: shards.py): every split's arrays checked and written
shard by shard into a new directory beside the old one, the manifest last, then swapped in; with
several ranks, each writes its shards and rank 0 gathers their records into one manifest."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core.atomic import DiskFull, current_umask, disk_full_error, is_disk_full, write_json
from pipeline.core.errors import ConfigError, ShardError
from pipeline.core.output_dirs import SHARDS, ownership_problem, remove_stale_siblings, write_mark
from pipeline.data.shards import (
    DTYPES,
    FORMAT_VERSION,
    GROUP_COLUMN,
    KINDS,
    MANIFEST,
    TEXT_COLUMNS,
    first_nonfinite,
    load_manifest,
    sha256_file,
    shard_names,
)

DEFAULT_ROWS_PER_SHARD = 262144
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # becomes part of file names
_RESERVED = {"format_version", "dim", "dtype", "rows_per_shard", "teacher", "splits", "files"}


def _check_finite(name: str, arr: np.ndarray, first_row: int = 0, why: str = "") -> None:
    bad = first_nonfinite(arr)
    if bad is not None:
        raise ValueError(f"{name}: row {first_row + bad[0] + 1} contains NaN or inf{why}; expected finite embeddings")


def _as_rows(arr: Any) -> Any:
    """Keep anything that already looks like an array (ndarray, memmap, ShardedArray) as is, so
    that writing can slice it a shard at a time; turn anything else (lists) into an ndarray."""
    if hasattr(arr, "shape") and hasattr(arr, "dtype") and hasattr(arr, "__getitem__"):
        try:
            np.dtype(arr.dtype)
            return arr
        except TypeError:  # e.g. a torch tensor: its dtype is not numpy's
            pass
    return np.asarray(arr)


def _check_dtype(dtype: Any) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; expected one of {list(DTYPES)}")
    return name


def _check_rows_per_shard(rows: Any) -> int:
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"rows_per_shard={rows!r}; expected a positive integer")
    return int(rows)


def _prepare(splits: dict[str, tuple[pd.DataFrame, Any, Any]]):
    if not splits:
        raise ValueError("no splits to write; expected at least one, e.g. {'train': (...)}")
    dim = None
    prepared = {}
    for split, value in splits.items():
        if not isinstance(split, str) or not _SPLIT_NAME.match(split):
            raise ValueError(f"split name {split!r} is not usable in a file name; expected letters, digits, '_' or '-'")
        frame, inputs, targets = value
        missing = [c for c in TEXT_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"split {split!r}: frame lacks column(s) {missing}; expected {list(TEXT_COLUMNS)}")
        n = len(frame)
        arrays = {}
        for kind, arr in (("inputs", inputs), ("targets", targets)):
            arr = _as_rows(arr)
            shape = tuple(arr.shape)
            if len(shape) != 2 or shape[0] != n:
                raise ValueError(
                    f"split {split!r}: {kind} have shape {shape}; expected ({n}, dim) to match the frame's {n} rows"
                )
            if not np.issubdtype(np.dtype(arr.dtype), np.floating):
                raise ValueError(
                    f"split {split!r}: {kind} have dtype {arr.dtype}; expected "
                    "floating point (stored as float32 or float16)"
                )
            if dim is None:
                dim = shape[1]
            if shape[1] != dim:
                raise ValueError(f"split {split!r}: {kind} have dim {shape[1]}; expected {dim} like the other arrays")
            arrays[kind] = arr
        prepared[split] = (frame, arrays["inputs"], arrays["targets"])
    return prepared, int(dim)


def _shard_block(split: str, kind: str, arr: Any, start: int, stop: int, dtype: np.dtype) -> np.ndarray:
    """Rows [start, stop) as a C-ordered array of `dtype`: only one shard is in memory at once."""
    block = np.asarray(arr[start:stop])
    _check_finite(f"split {split!r} {kind}", block, start)
    with np.errstate(over="ignore"):  # an overflow becomes inf, reported just below
        out = np.ascontiguousarray(block, dtype=dtype)
    if out.dtype != block.dtype:
        _check_finite(f"split {split!r} {kind}", out, start, f" once stored as {dtype.name} (a value beyond its range)")
    return out


def _write_texts(path: Path, frame: pd.DataFrame) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # The group column (which targets are one answer in other words) is optional in the frame:
    # without it each target text is its own group.
    groups = frame["group"] if "group" in frame.columns else frame["target_text"]
    columns = {**{c: frame[c] for c in TEXT_COLUMNS}, GROUP_COLUMN: groups}
    table = pa.table({c: pa.array([str(v) for v in values], type=pa.string()) for c, values in columns.items()})
    pq.write_table(table, path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def shard_ranges(count: int, rows_per_shard: int) -> list[tuple[int, int]]:
    """[start, stop) of each shard of a split of `count` rows, in file order (none for 0 rows)."""
    return [(start, min(start + rows_per_shard, count)) for start in range(0, count, rows_per_shard)]


def write_shards(
    out_dir: str | os.PathLike,
    splits: dict[str, tuple[pd.DataFrame, Any, Any]],
    teacher: dict,
    extra: dict | None = None,
    *,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    dtype: str = "float32",
    place: Any = None,
) -> dict:
    """Write all splits and the manifest, replacing `out_dir` as a whole; return the manifest.

    Each split's (count, dim) inputs and targets become consecutive shard files of at most
    `rows_per_shard` rows in `dtype`, converted one shard at a time so the split is never held
    twice in memory. The arrays are read in KINDS order per shard, shard by shard, split by split
    (the embed stage's plan of encode calls relies on this order).

    `place` (a Dist with more than one rank): every rank calls this with the same arguments and
    writes its share of the shard files (shard n of all splits counted together goes to rank
    n % world) into rank 0's temporary directory; after a barrier rank 0 writes the texts files
    and the manifest, exactly as one process would, and swaps the directory in. `extra` is read on
    rank 0 only. On an error the temporary directory is removed; a full disk is raised as DiskFull
    naming the file whose write failed. An existing `out_dir` is replaced only if it is the shards'
    own (output_dirs.ownership_problem), checked before any file is written; a symlinked `out_dir`
    is followed: the directory it points to is replaced, the link stays."""
    out_dir = Path(out_dir).resolve()
    rank, world = (place.rank, place.world_size) if place is not None else (0, 1)
    main = rank == 0
    rows_per_shard = _check_rows_per_shard(rows_per_shard)
    dtype_name = _check_dtype(dtype)
    np_dtype = np.dtype(dtype_name)
    extra = dict(extra or {})
    clash = sorted(_RESERVED & set(extra))
    if clash:
        raise ValueError(
            f"extra manifest keys {clash} would overwrite reserved keys; expected none of {sorted(_RESERVED)}"
        )
    prepared, dim = _prepare(splits)
    if rank == 0:
        problem = ownership_problem(out_dir, SHARDS)
        if problem:
            raise ConfigError(
                f"{out_dir} {problem}; expected a new or empty directory, or shards the embed stage "
                "wrote (it replaces them as a whole)"
            )

    tmp: Path | None = None
    files: dict[str, Any] = {}
    writing = ""  # the file being written, named if the disk fills up

    def record(name: str) -> None:
        _fsync(tmp / name)
        files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}

    try:
        if main:
            tmp = _new_dir_beside(out_dir)
        if world > 1:
            tmp = _shared_dir(place, tmp)
        split_entries: dict[str, Any] = {}
        counter = 0  # shards of all splits so far: shard n is rank n % world's
        for split, (frame, inputs, targets) in prepared.items():
            count = len(frame)
            texts = f"{split}.parquet"
            if main:
                writing = texts
                _write_texts(tmp / texts, frame)
                record(texts)
            shard_entries = []
            for index, (start, stop) in enumerate(shard_ranges(count, rows_per_shard)):
                entry = {"rows": stop - start}
                for kind, arr, name in zip(KINDS, (inputs, targets), shard_names(split, index)):
                    if counter % world == rank:
                        block = _shard_block(split, kind, arr, start, stop, np_dtype)
                        writing = name
                        np.save(tmp / name, block, allow_pickle=False)
                        del block
                        record(name)
                    entry[kind] = name
                shard_entries.append(entry)
                counter += 1
            split_entries[split] = {"count": count, "texts": texts, "shards": shard_entries}
        if world > 1:
            writing = _rank_file(rank)
            files = _gather_records(place, tmp, files, split_entries)
        if main:
            manifest = {
                "format_version": FORMAT_VERSION,
                "dim": dim,
                "dtype": dtype_name,
                "rows_per_shard": rows_per_shard,
                "teacher": teacher,
                "splits": split_entries,
                "files": files,
                **extra,
            }
            writing = MANIFEST
            write_json(tmp / MANIFEST, manifest)
            _swap_in(tmp, out_dir)
        if world > 1:
            place.barrier()  # rank 0 has swapped the directory in: every rank may read it
            if not main:
                manifest = load_manifest(out_dir)
    except BaseException as e:
        # Safe on any rank: rank 0 moves `tmp` only after the barrier that every rank reaches after
        # its last write, and os.replace is atomic, so a rank failing after it finds `tmp` either
        # unswapped or gone. A rank failing mid-write, while a peer is already removing `tmp`,
        # removes it again when its own next collective fails.
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(e) and not (isinstance(e, DiskFull) and tmp is not None and tmp not in e.path.parents):
            # Named as the file it would have become: the temporary directory is gone by now. (A DiskFull
            # from elsewhere, the embedding cache, already names its own place.)
            kept = (
                f"the previous shards in {out_dir} are left as they were"
                if out_dir.is_dir()
                else f"{out_dir} was not created"
            ) + " and the partly written ones removed"
            raise disk_full_error(out_dir / writing, e, kept, "set embed.out_dir to another disk") from e
        raise
    # Round-trip through JSON so the caller sees exactly what a reader will (tuples -> lists).
    return json.loads(json.dumps(manifest))


def _new_dir_beside(out_dir: Path) -> Path:
    """A fresh hidden `.{name}.*.tmp` directory beside `out_dir`, with the usual permissions and the
    shards' mark, written first: a killed run's leftover is recognised (and removed) by the next."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(out_dir, SHARDS)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; the shard dir should look like any other
    write_mark(tmp, SHARDS)
    return tmp


def _shared_dir(place: Any, tmp: Path | None) -> Path:
    """Rank 0's directory on every rank; a rank that cannot see it (another node without a shared
    filesystem) fails with the reason."""
    path = Path(place.broadcast_text(str(tmp) if tmp is not None else ""))
    if not path.is_dir():
        raise ShardError(
            f"{path}: rank 0's directory is not visible to rank {place.rank}; every rank must write "
            "to the same filesystem (one machine, or a shared one)"
        )
    return path


def _rank_file(rank: int) -> str:
    return f".rank-{rank:05d}.json"  # a leading dot: no split's file name can start so


def _gather_records(place: Any, tmp: Path, files: dict, split_entries: dict) -> dict:
    """Every rank's file records, on rank 0, in the order one process records them (texts, then
    shards, split by split); {} on the other ranks. A barrier: all shard files are written."""
    write_json(tmp / _rank_file(place.rank), files)
    place.barrier()
    if not place.is_main:
        return {}
    for r in range(1, place.world_size):
        path = tmp / _rank_file(r)
        files = {**files, **json.loads(path.read_text(encoding="utf-8"))}
        path.unlink()
    (tmp / _rank_file(0)).unlink()
    order = [
        name
        for entry in split_entries.values()
        for name in (entry["texts"], *(s[k] for s in entry["shards"] for k in KINDS))
    ]
    missing = [n for n in order if n not in files]
    if missing:
        raise ShardError(f"{tmp}: no rank recorded {missing[:3]}; expected every shard file written")
    return {n: files[n] for n in order}


def _swap_in(new: Path, dest: Path) -> None:
    """Replace `dest` with directory `new`: rename old away, rename new in, delete old. `dest` is
    checked again here, just before it goes: only the shards' own directory is replaced."""
    problem = ownership_problem(dest, SHARDS)
    if problem:
        raise ConfigError(f"{dest} {problem}; it was left as it was")
    if not dest.exists():
        os.replace(new, dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
    os.rmdir(old)  # only reserved a unique name; rename needs it absent
    os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(old, dest)  # put the previous shards back rather than leave nothing
        raise
    shutil.rmtree(old, ignore_errors=True)
