"""The content-addressed embedding cache: each distinct text embedded once per teacher."""

import numpy as np
import pytest

from pipeline.core.errors import ShardError
from pipeline.embed.cache import EmbeddingCache, embed_distinct, teacher_key, text_key

pytestmark = pytest.mark.integration  # runs a stage or a bench: outside the ~2-minute unit tier

TEACHER = {"name": "t", "dim": 8, "max_seq_length": 16, "config_sha256": "c", "weights_sha256": "w", "path": "/a"}


class CountingEncoder:
    """A deterministic stand-in for the teacher in unit tests of the cache itself."""

    def __init__(self, dim=8):
        self.dim, self.calls, self.texts = dim, 0, 0

    def __call__(self, texts):
        self.calls += 1
        self.texts += len(texts)
        return np.stack(
            [np.random.default_rng(int.from_bytes(text_key(t)[:4], "little")).normal(size=self.dim) for t in texts]
        ).astype(np.float32)


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
    # Vectors made under other numerics (natively, or with another thread count) are not reused:
    # they would carry that run's last bits into this one.
    for tag in ("native/AMD EPYC 7B13", "portable/2"):
        _, stats = embed_distinct(["x", "y"], enc, EmbeddingCache(tmp_path, {**TEACHER, "numerics": tag}))
        assert stats == {"cached": 0, "embedded": 2}, tag


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


def test_embed_stage_rerun_after_appending_one_percent_embeds_only_the_new_texts(tmp_path, monkeypatch):
    """The real embed stage and teacher: 300 pairs, then the same file with 3 more appended."""
    import pandas as pd

    from pipeline.data.shards import open_split
    from stages import embed

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    src = pd.read_csv("data/raw/qa_pairs.csv").drop_duplicates(["question", "answer"])
    data, cache = tmp_path / "pairs.csv", tmp_path / "cache"
    args = [
        f"embed.dataset={data}",
        "embed.group_field=null",
        f"embed.cache_dir={cache}",
        "embed.max_rows=0",
        "run.allow_external_paths=true",
    ]
    src.iloc[:300].to_csv(data, index=False)
    assert embed.main([*args, f"embed.out_dir={tmp_path / 'a'}"]) == 0
    first = len(EmbeddingCache(cache, _bundled_identity()))
    src.iloc[:303].to_csv(data, index=False)
    assert embed.main([*args, f"embed.out_dir={tmp_path / 'b'}"]) == 0
    added = len(EmbeddingCache(cache, _bundled_identity())) - first
    new_texts = set(src.iloc[300:303][["question", "answer"]].to_numpy().ravel()) - set(
        src.iloc[:300][["question", "answer"]].to_numpy().ravel()
    )
    assert added == len(new_texts) > 0  # only the texts the first run had not seen
    # The rows both runs share carry identical vectors.
    a, b = open_split(tmp_path / "a", "train"), open_split(tmp_path / "b", "train")
    ids_a = {i: n for n, i in enumerate(a.ids)}
    shared = [(ids_a[i], n) for n, i in enumerate(b.ids) if i in ids_a]
    assert shared and all(np.array_equal(a.inputs[x], b.inputs[y]) for x, y in shared)
    # Each embed run records its dataset as an MLflow input: digest and row count.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    inputs = [d for r in runs for d in r.inputs.dataset_inputs]
    assert len(inputs) == 2 and {d.dataset.name for d in inputs} == {"pairs.csv"}
    assert len({d.dataset.digest for d in inputs}) == 2  # 300 and 303 rows: different data


def _bundled_identity():
    """The key the embed stage, run in this process, gives its cache: the teacher's identity and
    this process's numerics."""
    from pipeline.core import numerics
    from pipeline.embed.teacher import load_teacher, teacher_identity

    return {**teacher_identity("bundled", load_teacher("bundled")), "numerics": numerics.vectors_tag()}


def test_streamed_embeddings_are_made_one_shard_at_a_time(tmp_path):
    import pandas as pd

    from pipeline.data.shard_writer import write_shards
    from pipeline.data.shards import open_split
    from pipeline.embed.embedding import StreamedEmbeddings

    enc = CountingEncoder()
    calls = []
    encode = lambda texts: (calls.append(len(texts)), enc(texts))[1]  # noqa: E731
    texts = [f"t{i % 40}" for i in range(100)]  # 40 distinct, each repeated across shards
    frame = pd.DataFrame({"id": [str(i) for i in range(100)], "input_text": texts, "target_text": texts[::-1]})
    cache, stats = EmbeddingCache(tmp_path / "c", TEACHER), {}
    streamed = [StreamedEmbeddings(frame[c].tolist(), encode, cache, 8, stats) for c in ("input_text", "target_text")]
    write_shards(tmp_path / "s", {"train": (frame, *streamed)}, TEACHER, rows_per_shard=16)
    assert max(calls) <= 16  # never more than one shard's texts at once
    assert sum(calls) == 40 and stats["embedded"] == 40  # each distinct text encoded once, across shards
    split = open_split(tmp_path / "s", "train")
    assert np.array_equal(split.inputs[:], enc(texts)) and np.array_equal(split.targets[:], enc(texts[::-1]))


def test_lookups_span_row_groups_and_parts(tmp_path, monkeypatch):
    from pipeline.embed import cache as embed_cache

    monkeypatch.setattr(embed_cache, "ROW_GROUP", 4)  # parts of 10 rows: groups 0-3, 4-7, 8-9
    enc, cache = CountingEncoder(), EmbeddingCache(tmp_path, TEACHER)
    first = [f"a{i}" for i in range(10)]
    second = [f"b{i}" for i in range(10)]
    cache.put([text_key(t) for t in first], enc(first))
    cache.put([text_key(t) for t in second], enc(second))
    wanted = ["b9", "a0", "zz", "a9", "b4", "a5", "a5"]  # unsorted, a miss, a repeat, several groups
    for reader in (cache, EmbeddingCache(tmp_path, TEACHER)):  # the index kept in place, and re-read
        found, vectors = reader.get([text_key(t) for t in wanted])
        assert found.tolist() == [True, True, False, True, True, True, True]
        hits = [t for t in wanted if t != "zz"]
        assert np.array_equal(vectors[found], enc(hits)) and not vectors[~found].any()
