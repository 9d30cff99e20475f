"""The teacher's weights digest, kept between loads of the answer model.

The answer model refuses a teacher whose weights are not the ones it was trained with, which
means hashing every weight file on every load. The digest is kept in a small JSON file with what
identifies each weight file on disk (its path, size, modification and change times, inode); a
load whose files all still match reuses it, and any difference (a file changed, replaced, added
or removed) hashes the weights again, so a changed teacher is still refused. The file is a cache:
one that is missing, too large, damaged or of another shape is ignored and written anew."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.core.atomic import write_json
from pipeline.embed.teacher import weights_digest

log = logging.getLogger(__name__)

# The files weights_digest reads (pipeline/embed/teacher.py; tests/test_ask_fast.py checks the two agree).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
# Far above an entry per teacher (a few hundred bytes each): a larger file is not one this module wrote.
MAX_CACHE_BYTES = 1 << 20


def weight_files_key(model_dir: Path) -> list[list] | None:
    """What identifies the weight files of `model_dir` on disk, in the order weights_digest reads
    them; None where weights_digest gives None (not a directory, no weight files)."""
    if not model_dir.is_dir():
        return None
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        return None
    key = []
    for f in files:
        st = f.stat()
        key.append([f.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return key


def _read(cache: Path) -> dict:
    try:
        if cache.stat().st_size > MAX_CACHE_BYTES:
            return {}
        entries = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def teacher_weights_digest(model_dir: Path, cache: Path | None = None) -> str | None:
    """weights_digest(model_dir), from `cache` when the weight files are those it was computed on
    (`cache` None: hashed every time)."""
    if cache is None:
        return weights_digest(model_dir)
    key = weight_files_key(model_dir)
    if key is None:
        return weights_digest(model_dir)
    name = str(model_dir.resolve())
    entries = _read(cache)
    entry = entries.get(name)
    if isinstance(entry, dict) and entry.get("files") == key and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = weights_digest(model_dir)
    if weight_files_key(model_dir) != key:  # changed while it was read: nothing to keep
        return digest
    entries[name] = {"files": key, "sha256": digest}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, entries)
    except OSError as e:  # a cache that cannot be written costs time on the next load, nothing else
        log.debug("teacher digest cache %s not written (%s)", cache, e)
    return digest
