"""bench.data's loader part: the anonymous memory one shuffled epoch of BatchLoader takes over a
large synthetic split, less a small one's, each epoch in a fresh child process (`python -m
bench.data --loader-child DIR`; the figures are described in bench/data.py's docstring)."""

from __future__ import annotations

import functools
import gc
import inspect
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import results

DIM = 384  # the bundled teacher's embedding size (bench.model's: not imported, the loader child stays light)
LOADER_BATCH = 256
ROWS_PER_SHARD = 131072  # passed to write_shards
say = functools.partial(results.say, "data")


def proc_status_kb(field: str) -> int:
    """A `field:  N kB` line of /proc/self/status, in kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line; expected Linux >= 4.5")


def write_synthetic(out_dir: Path, rows: int, scratch: Path, seed: int = 0) -> dict:
    """A `train` split of `rows` random 384-d rows. The arrays are generated chunk by chunk into
    .npy memory maps (file-backed, never whole in anonymous memory), handed to write_shards, and
    deleted after; returns the manifest."""
    import pandas as pd

    from pipeline.data.shard_writer import write_shards

    raw = Path(tempfile.mkdtemp(prefix="raw-", dir=scratch))
    try:
        rng = np.random.default_rng(seed)
        arrays = []
        for kind in ("inputs", "targets"):
            mm = np.lib.format.open_memmap(raw / f"{kind}.npy", mode="w+", dtype=np.float32, shape=(rows, DIM))
            for start in range(0, rows, 65536):
                stop = min(rows, start + 65536)
                mm[start:stop] = rng.standard_normal((stop - start, DIM), dtype=np.float32)
            mm.flush()
            arrays.append(mm)
        ids = [f"q{i}" for i in range(rows)]
        frame = pd.DataFrame({"id": ids, "input_text": ids, "target_text": [f"a{i}" for i in range(rows)]})
        manifest = write_shards(
            out_dir,
            {"train": (frame, arrays[0], arrays[1])},
            {"name": "synthetic", "dim": DIM},
            rows_per_shard=ROWS_PER_SHARD,
        )
        del arrays, frame, ids
    finally:
        gc.collect()
        shutil.rmtree(raw, ignore_errors=True)
    return manifest


def malloc_trim() -> bool:
    """Hand glibc's free heap pages back to the kernel (False where there is no glibc). Opening a
    split frees as much as it keeps (the text columns pass through lists), and without this the
    epoch's first allocations reuse those resident free pages, and even the big epoch's shuffle
    permutation would not show as growth."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)  # returns 1 if memory was released, 0 if there was none to release
        return True
    except (OSError, AttributeError):
        return False


def loader_child(shard_dir: str, batch_size: int, prefetch) -> dict:
    """One shuffled epoch over the split, in this (fresh) process; RssAnon read after each batch."""
    from pipeline.data.loader import BatchLoader
    from pipeline.data.shards import open_split

    split = open_split(shard_dir, "train", verify=False)
    kw = {} if prefetch is None else {"prefetch": prefetch}
    loader = BatchLoader(split.inputs, split.targets, batch_size=batch_size, shuffle=True, seed=0, **kw)
    loader.set_epoch(0)
    gc.collect()
    trimmed = malloc_trim()
    anon0, file0 = proc_status_kb("RssAnon"), proc_status_kb("RssFile")
    peak, batches, rows = anon0, 0, 0
    t0 = time.perf_counter()
    for x, y in loader:
        batches += 1
        rows += len(x)
        del x, y
        peak = max(peak, proc_status_kb("RssAnon"))
    epoch_s = time.perf_counter() - t0
    anon1, file1 = proc_status_kb("RssAnon"), proc_status_kb("RssFile")
    return {
        "rows": int(split.count),
        "rows_seen": rows,
        "batches": batches,
        "epoch_s": epoch_s,
        "rss_anon_before_mb": anon0 / 1024,
        "rss_anon_peak_mb": peak / 1024,
        "rss_anon_after_mb": anon1 / 1024,
        "rss_anon_growth_mb": (peak - anon0) / 1024,
        "rss_file_growth_mb": (file1 - file0) / 1024,
        "prefetch": getattr(loader, "prefetch", prefetch),
        "malloc_trimmed": trimmed,
    }


def loader_memory(big_rows: int, small_rows: int, scratch: Path, prefetch) -> dict:
    from pipeline.data.loader import BatchLoader

    if prefetch is None:
        prefetch = inspect.signature(BatchLoader.__init__).parameters["prefetch"].default  # what the trainer gets
    work = Path(tempfile.mkdtemp(prefix="bench-data-shards-", dir=scratch))
    out: dict = {}
    try:
        for label, rows in (("small", small_rows), ("big", big_rows)):
            shards = work / f"shards-{rows}"
            t0 = time.perf_counter()
            manifest = write_synthetic(shards, rows, work)
            write_s = time.perf_counter() - t0
            args = ["-m", "bench.data", "--loader-child", str(shards), "--prefetch", str(prefetch)]
            child = results.child_json(args, f"loader child on {shards}", 900)
            shutil.rmtree(shards, ignore_errors=True)
            if child["rows_seen"] != rows:
                raise RuntimeError(f"the epoch yielded {child['rows_seen']} rows of {rows}")
            out[label] = child
            say(
                f"loader {rows} rows: wrote in {write_s:.1f} s ({len(manifest['files'])} files); epoch "
                f"{child['epoch_s']:.1f} s, RssAnon +{child['rss_anon_growth_mb']:.1f} MB, "
                f"RssFile +{child['rss_file_growth_mb']:.0f} MB"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    big, small = out["big"], out["small"]
    tag = lambda n: f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k"  # noqa: E731
    return {
        "loader_rss_growth_mb": big["rss_anon_growth_mb"] - small["rss_anon_growth_mb"],
        f"loader_rss_anon_growth_mb_{tag(big_rows)}": big["rss_anon_growth_mb"],
        f"loader_rss_anon_growth_mb_{tag(small_rows)}": small["rss_anon_growth_mb"],
        "loader_rows_big": big_rows,
        "loader_rows_small": small_rows,
        "loader_batch_size": LOADER_BATCH,
        "loader_batches_big": big["batches"],
        "loader_epoch_s_big": big["epoch_s"],
        "loader_rss_anon_before_mb_big": big["rss_anon_before_mb"],
        "loader_rss_file_growth_mb_big": big["rss_file_growth_mb"],
        # The same two under fixed names (the tagged ones follow the row counts asked for).
        "loader_rss_anon_growth_mb_big": big["rss_anon_growth_mb"],
        "loader_rss_anon_growth_mb_small": small["rss_anon_growth_mb"],
        "loader_prefetch": big["prefetch"],
        "loader_malloc_trimmed": big["malloc_trimmed"],
        "loader_rows_per_shard": ROWS_PER_SHARD,
    }
