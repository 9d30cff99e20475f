"""The answer bank: every distinct target text of the dataset with its teacher vector. build_bank
makes it from the splits (Bank: what the evaluate stage scores retrieval against); the answer
model carries the same bank (AnswerBank, bank_from_shards over train, val and test) saved to one
`.npz` of plain arrays with no pickle in it (its layout: docs/serving.md). The groups let the model
answer with distinct facts rather than one fact in several phrasings. Its digest (`bank_digest`)
is a sha256 over the vectors' bytes, the texts and the groups, computed the same way on save and
on load: the logged model records it, and a file whose content does not match is refused. A bank
written before banks held groups still loads, each text its own group, with the digest it was
logged with (the format without groups)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError

SPLITS = ("train", "val", "test")  # build_bank's order: a text's first row decides nothing else
_DIGEST_TAG = b"energy-flow answer bank v1\0"  # banks without groups, as they were logged
_DIGEST_TAG_GROUPS = b"energy-flow answer bank v2\0"  # a format change must change every digest


@dataclass(frozen=True)
class AnswerBank:
    texts: list[str]
    vectors: np.ndarray  # float32 (size, dim), unit length, row i is texts[i]'s
    sha256: str
    # groups[i]: texts[i]'s group; None: a bank saved without groups, each text its own group.
    groups: list[str] | None = None

    @property
    def size(self) -> int:
        return len(self.texts)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def group_ids(self) -> np.ndarray:
        """int64 (size,): each text's group as a number, 0 .. groups - 1."""
        return np.arange(self.size, dtype=np.int64) if self.groups is None else group_numbers(self.groups)


def group_numbers(groups: Sequence[str]) -> np.ndarray:
    """int64: each text's group as a number, 0 .. groups - 1 (groups in sorted order)."""
    return np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)[1].astype(np.int64)


@dataclass
class Bank:
    """Every distinct target text of the dataset, with the groups it answers."""

    texts: list[str]
    ids: list[str]  # the id of the first row (train, then val, then test) with that text
    vectors: torch.Tensor  # (size, dim), unit length
    index: dict[str, int]  # text -> bank position
    group_members: dict[str, np.ndarray]  # group -> bank positions of its texts
    # The group of each text's first row: the one group the answer model gives it, so that its
    # top answers are distinct facts (a text in several groups is rare: one answer to two facts).
    groups: list[str]

    @property
    def size(self) -> int:
        return len(self.texts)


def build_bank(shards: Sequence) -> Bank:
    """The retrieval bank over the given splits (pass all of them: train, val, test)."""
    index: dict[str, int] = {}
    ids, rows, first_groups = [], [], []
    members: dict[str, set[int]] = {}
    for shard in shards:
        firsts = []
        for i, (text, group) in enumerate(zip(shard.target_texts, shard.groups)):
            j = index.get(text)
            if j is None:
                j = index[text] = len(ids)
                ids.append(str(shard.ids[i]))
                first_groups.append(str(group))
                firsts.append(i)
            members.setdefault(str(group), set()).add(j)
        if firsts:
            rows.append(np.asarray(shard.targets[np.asarray(firsts, dtype=np.int64)], dtype=np.float32))
    vectors = F.normalize(torch.from_numpy(np.concatenate(rows)), dim=1)
    return Bank(
        list(index),
        ids,
        vectors,
        index,
        {g: np.fromiter(sorted(m), dtype=np.int64, count=len(m)) for g, m in members.items()},
        first_groups,
    )


def _texts_bytes(texts: list[str]) -> bytes:
    return json.dumps(texts, ensure_ascii=False).encode("utf-8")


def bank_digest(vectors: np.ndarray, texts: list[str], groups: list[str] | None = None) -> str:
    """sha256 over the shape, the float32 little-endian C-order bytes of the vectors, the UTF-8
    JSON of the texts and, when there are groups, of the groups: the same bank gives the same
    digest wherever it was written. Without groups it is the digest banks had before they held
    groups, so a model logged then still loads."""
    v = np.ascontiguousarray(vectors, dtype="<f4")
    h = hashlib.sha256(_DIGEST_TAG if groups is None else _DIGEST_TAG_GROUPS)
    h.update(f"{v.shape[0]}x{v.shape[1]}\0".encode())
    h.update(v.tobytes())
    h.update(_texts_bytes(texts))
    if groups is not None:
        h.update(b"\0")
        h.update(_texts_bytes(groups))
    return h.hexdigest()


def bank_from_shards(shard_dir: str | os.PathLike) -> AnswerBank:
    """The evaluate stage's bank, from the shards it was built from (their checksums verified)."""
    from pipeline.data.shards import open_split

    bank = build_bank([open_split(shard_dir, split) for split in SPLITS])
    vectors = bank.vectors.numpy().astype(np.float32, copy=False)
    texts, groups = list(bank.texts), list(bank.groups)
    return AnswerBank(texts, vectors, bank_digest(vectors, texts, groups), groups)


def save_bank(bank: AnswerBank, path: str | os.PathLike) -> Path:
    """Write `bank` to `path` (.npz, uncompressed: the vectors do not compress and loading stays
    a plain read). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "vectors": np.ascontiguousarray(bank.vectors, dtype=np.float32),
        "texts": np.frombuffer(_texts_bytes(bank.texts), dtype=np.uint8),
    }
    if bank.groups is not None:
        arrays["groups"] = np.frombuffer(_texts_bytes(bank.groups), dtype=np.uint8)
    with open(path, "wb") as f:  # a file object: np.savez would otherwise append ".npz"
        np.savez(f, **arrays)
    return path


def load_bank(path: str | os.PathLike, expected_sha256: str) -> AnswerBank:
    """Read a bank written by save_bank and check its digest against `expected_sha256` (what the
    logged model recorded). Raises PipelineError naming the file on any mismatch."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            vectors, raw = f["vectors"], f["texts"]
            raw_groups = f["groups"] if "groups" in f.files else None  # absent: saved before banks held groups
    except (OSError, ValueError, KeyError) as e:
        raise PipelineError(
            f"{path}: not a readable answer bank ({e}); expected the .npz of `vectors` (float32), "
            "`texts` and `groups` (UTF-8 JSON) that pipeline.answer.bank.save_bank writes"
        ) from None
    texts = _json_list(path, "texts", raw)
    groups = None if raw_groups is None else _json_list(path, "groups", raw_groups)
    if vectors.dtype != np.float32 or vectors.ndim != 2 or len(texts) != len(vectors):
        raise PipelineError(
            f"{path}: `vectors` is {vectors.dtype} {vectors.shape} for {len(texts)} texts; "
            "expected float32 (texts, dim), one row per text"
        )
    if groups is not None and len(groups) != len(texts):
        raise PipelineError(f"{path}: {len(groups)} `groups` for {len(texts)} texts; expected one group per text")
    digest = bank_digest(vectors, texts, groups)
    if digest != expected_sha256:
        raise PipelineError(
            f"{path}: the answer bank's content has sha256 {digest[:16]}..., but the model was logged with "
            f"{str(expected_sha256)[:16]}...: the file was changed or belongs to another model; refusing to "
            "answer from it (log the model again with its own bank)"
        )
    return AnswerBank(texts, vectors, digest, groups)


def _json_list(path: Path, name: str, raw: np.ndarray) -> list[str]:
    try:
        values = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise PipelineError(f"{path}: its `{name}` are not UTF-8 JSON ({e}); expected a JSON list of strings") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise PipelineError(f"{path}: its `{name}` are not a JSON list of strings")
    return values
