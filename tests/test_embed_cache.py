"""The content-addressed embedding cache: each distinct text embedded once per teacher."""
import numpy as np
import pytest

from pipeline.embed_cache import EmbeddingCache, embed_distinct, teacher_key, text_key
from pipeline.errors import ShardError

TEACHER = {"name": "t", "dim": 8, "max_seq_length": 16, "config_sha256": "c", "weights_sha256": "w", "path": "/a"}


class CountingEncoder:
    """A deterministic stand-in for the teacher in unit tests of the cache itself."""

    def __init__(self, dim=8):
        self.dim, self.calls, self.texts = dim, 0, 0

    def __call__(self, texts):
        self.calls += 1
        self.texts += len(texts)
        return np.stack([np.random.default_rng(int.from_bytes(text_key(t)[:4], "little")).normal(size=self.dim)
                         for t in texts]).astype(np.float32)


def test_second_run_embeds_only_new_texts_and_returns_identical_vectors(tmp_path):
    enc = CountingEncoder()
    texts = [f"text {i}" for i in range(100)]
    first, s1 = embed_distinct(texts, enc, EmbeddingCache(tmp_path, TEACHER))
    assert s1 == {"cached": 0, "embedded": 100}
    more = texts + ["new a", "new b"]
    second, s2 = embed_distinct(more, enc, EmbeddingCache(tmp_path, TEACHER))
    assert s2 == {"cached": 100, "embedded": 2} and enc.texts == 102
    assert np.array_equal(second[:100], first)
    assert np.array_equal(second[100:], enc(["new a", "new b"]))


def test_another_teacher_shares_nothing_and_the_path_does_not_matter(tmp_path):
    enc = CountingEncoder()
    embed_distinct(["x", "y"], enc, EmbeddingCache(tmp_path, TEACHER))
    assert teacher_key({**TEACHER, "path": "/elsewhere"}) == teacher_key(TEACHER)
    other = {**TEACHER, "weights_sha256": "w2"}
    _, stats = embed_distinct(["x", "y"], enc, EmbeddingCache(tmp_path, other))
    assert stats == {"cached": 0, "embedded": 2}


def test_a_killed_write_leaves_no_part_and_a_broken_part_is_named(tmp_path):
    cache = EmbeddingCache(tmp_path, TEACHER)
    cache.put([text_key("a")], np.ones((1, 8), np.float32))
    (cache.dir / ".part-000001-x.parquet.tmp").write_bytes(b"half")  # what a kill mid-write leaves
    assert len(EmbeddingCache(tmp_path, TEACHER)) == 1
    bad = cache.dir / "part-000009-bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ShardError, match="part-000009-bad.parquet"):
        len(EmbeddingCache(tmp_path, TEACHER))


def test_wrong_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="dim 8"):
        EmbeddingCache(tmp_path, TEACHER).put([text_key("a")], np.ones((1, 4), np.float32))
