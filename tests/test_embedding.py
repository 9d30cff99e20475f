import numpy as np
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError, DatasetError
from pipeline.embed.embedding import embed_texts_once, prepare_pairs
from pipeline.embed.teacher import encode_texts, load_teacher, teacher_identity

pytestmark = pytest.mark.unit


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


def write_pairs(path, rows) -> str:
    path.write_text("id,question,answer\n" + "".join(f"{i},{q},{a}\n" for i, (q, a) in enumerate(rows)))
    return str(path)


@pytest.mark.parametrize(
    "rows, fragments",
    [
        pytest.param(
            [(f"q{i}", f"a{i}") for i in range(3)],
            [
                "split 'val' has 0 rows (3 rows used of 3 read from ",
                "embed.splits.val = 0.1",
                "Add rows (a 0.1 share needs about 10 or more rows to hold one), or raise embed.splits.val",
            ],
            id="3 rows",
        ),
        pytest.param(
            [("Same question?", "Same answer.")] * 50,
            [
                "has 0 rows (1 row used of 50 read from ",
                "49 repeated (input, target) pairs dropped",
                "or set embed.drop_duplicates=false if the repeats are meant",
            ],
            id="identical rows, distinct ids",
        ),
        pytest.param(
            [(f"Question {i}?", "Same answer.") for i in range(200)],
            [
                "every one of the 200 rows has the same target text ('Same answer.'",
                "expected at least 2 distinct texts in the column embed.target_field = 'answer' names",
            ],
            id="one target text",
        ),
        pytest.param(
            [("Same question?", f"Answer {i}.") for i in range(200)],
            ["every one of the 200 rows has the same input text"],
            id="one input text",
        ),
    ],
)
def test_data_that_parses_but_cannot_train_stops_before_the_teacher(tmp_path, rows, fragments):
    cfg = load_config(
        [
            f"embed.dataset={write_pairs(tmp_path / 'pairs.csv', rows)}",
            "embed.group_field=null",
            "run.allow_external_paths=true",
        ]
    )
    with pytest.raises(DatasetError) as exc:
        prepare_pairs(cfg.embed, allow_external_paths=True)
    for fragment in fragments:
        assert fragment in str(exc.value), str(exc.value)


def test_a_small_test_split_is_warned_about(tmp_path, caplog):
    path = write_pairs(tmp_path / "pairs.csv", [(f"What is {i}?", f"It is {i}.") for i in range(60)])
    cfg = load_config([f"embed.dataset={path}", "embed.group_field=null", "run.allow_external_paths=true"])
    prepared = prepare_pairs(cfg.embed, allow_external_paths=True)
    assert 0 < prepared.stats["rows_test"] < 30
    assert f"the test split has only {prepared.stats['rows_test']} rows" in caplog.text


@pytest.fixture(scope="module")
def teacher():
    return load_teacher("bundled")


def test_bundled_teacher_embeds_offline_with_meaning(teacher):
    emb = encode_texts(
        teacher,
        ["What is the capital of France?", "Paris is the capital of France.", "Sodium has the symbol Na."],
        batch_size=2,
        progress=False,
    )
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.2  # question is nearer its answer
    ident = teacher_identity("bundled", teacher)
    assert ident["dim"] == 384 and ident["name"] == "bundled:all-MiniLM-L6-v2" and ident["config_sha256"]


def test_a_teacher_that_cannot_load_names_the_parameter(tmp_path):
    with pytest.raises(ConfigError, match="embed.teacher"):
        load_teacher(str(tmp_path / "no-such-model"))


def test_texts_longer_than_the_window_are_counted(teacher):
    from pipeline.embed.teacher import truncated

    long_text = "word " * (teacher.max_seq_length + 10)
    assert truncated(teacher, ["short", long_text, "also short", long_text + "!"]).tolist() == [0, 1, 0, 1]
