import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.embedding import embed_texts_once, prepare_pairs
from pipeline.errors import ConfigError
from pipeline.teacher import encode_texts, load_teacher, teacher_identity


def test_each_distinct_text_is_embedded_once():
    calls = []

    def encode(texts):
        calls.append(list(texts))
        return np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)

    a, b, n, _ = embed_texts_once(encode, ["q1", "q2", "q1"], ["ans", "ans", "q2"])
    assert calls == [["q1", "q2", "ans"]] and n == 3
    np.testing.assert_array_equal(a[:, 1], [0, 1, 0])
    np.testing.assert_array_equal(b[:, 1], [2, 2, 1])


def test_prepare_pairs_splits_the_shipped_data_and_subsets_deterministically():
    cfg = load_config(["preset=smoke"])
    first, second = prepare_pairs(cfg.embed), prepare_pairs(cfg.embed)
    assert len(first.frame) == cfg.embed.max_rows == 600
    assert first.frame.equals(second.frame)
    assert set(first.frame.split) == {"train", "val", "test"}
    assert first.stats["rows_read"] > 3000 and first.stats["rows_used"] == 600
    # Mixed across topics, not the file's first 600 rows (which are all one topic).
    assert first.frame.id.str.split("-").str[0].nunique() > 5


@pytest.fixture(scope="module")
def teacher():
    return load_teacher("bundled")


def test_bundled_teacher_embeds_offline_with_meaning(teacher):
    emb = encode_texts(teacher, ["What is the capital of France?", "Paris is the capital of France.",
                                 "Sodium has the symbol Na."], batch_size=2, progress=False)
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.2  # question is nearer its answer
    ident = teacher_identity("bundled", teacher)
    assert ident["dim"] == 384 and ident["name"] == "bundled:all-MiniLM-L6-v2" and ident["config_sha256"]


def test_a_teacher_that_cannot_load_names_the_parameter(tmp_path):
    with pytest.raises(ConfigError, match="embed.teacher"):
        load_teacher(str(tmp_path / "no-such-model"))


def test_text_bridge_encodes_like_the_teacher(teacher):
    from pipeline.bridge import TextBridge

    texts = ["Helium has the symbol He.", "What is the symbol of helium?"]
    np.testing.assert_allclose(TextBridge(teacher).encode_text(texts).numpy(),
                               encode_texts(teacher, texts, 8, progress=False), atol=1e-5)


def test_texts_longer_than_the_window_are_counted(teacher):
    from pipeline.teacher import count_truncated

    long_text = "word " * (teacher.max_seq_length + 10)
    assert count_truncated(teacher, ["short", long_text, "also short", long_text + "!"]) == 2
