"""The answer model's teacher run with transformers alone (pipeline/serve/plain_teacher.py): the
same vectors as sentence-transformers' encode for the bundled teacher, on texts of every kind, and
sentence-transformers itself for any layout it cannot reproduce."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.embed.teacher import encode_texts, load_teacher, resolve_teacher, truncated
from pipeline.serve.plain_teacher import PlainTeacher, load_answering_teacher, plain_layout

# Each test names its tier: all unit, but the last, which starts a fresh interpreter (integration).

BUNDLED = Path(resolve_teacher("bundled"))

# Short and long (past the 256-token window, in words and in one unbroken run), empty-ish,
# whitespace around, unicode of several scripts, emoji, zero-width, repeats and near-repeats
# (ties in the length sort), and enough of them for several batches.
TEXTS = [
    "Who wrote 1984?",
    "Who wrote 1984?",
    "",
    " ",
    "\t\n",
    "  padded on both sides  ",
    "a",
    "?",
    "\u200b",
    "Ünïcödé — 東京 🚀",
    "مرحبا بالعالم",
    "Привет, мир",
    "emoji only 😀😀😀",
    "tab\tseparated\twords",
    "UPPER and lower CASE",
    "a b",
    "b a",
    "word " * 300,
    "x" * 3000,
    "The capital of Peru, a country in South America, is Lima. " * 6,
    "What is the capital of Peru?",
    "What currency is used in Angola?",
] + [f"question {i}: " + "energy flows through the lattice " * (i % 9) for i in range(30)]


@pytest.fixture(scope="module")
def teachers():
    settings, why = plain_layout(BUNDLED)
    assert settings is not None, why
    return load_teacher("bundled"), PlainTeacher(BUNDLED, settings["max_seq_length"], settings["normalize"])


@pytest.mark.unit
def test_the_bundled_teacher_is_in_the_plain_layout():
    assert plain_layout(BUNDLED) == ({"max_seq_length": 256, "normalize": True}, "")


@pytest.mark.unit
def test_the_plain_teacher_gives_the_vectors_sentence_transformers_gives(teachers):
    st, plain = teachers
    assert len(TEXTS) >= 50
    # Batches of 8, each padded to its longest text.
    want = encode_texts(st, TEXTS, 8, progress=False)
    got = encode_texts(plain, TEXTS, 8, progress=False)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == (len(TEXTS), 384)
    # The same tokens, model, pooling and batches: equal, not merely close (1e-6 leaves room for
    # a kernel that sums in another order).
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # A question asked alone, as ./dev ask asks one: a batch of one, no padding.
    for text in (TEXTS[0], TEXTS[5], TEXTS[9], TEXTS[17]):
        np.testing.assert_allclose(
            encode_texts(plain, [text], 8, progress=False), encode_texts(st, [text], 8, progress=False), atol=1e-6
        )


@pytest.mark.unit
def test_the_plain_teacher_reads_the_same_window_of_each_text(teachers):
    st, plain = teachers
    assert plain.max_seq_length == st.max_seq_length == 256
    assert plain.get_sentence_embedding_dimension() == 384
    np.testing.assert_array_equal(truncated(plain, TEXTS), truncated(st, TEXTS))
    # The 300 words; the unbroken run of 3000 characters is one unknown token.
    assert truncated(plain, TEXTS).sum() == 1
    assert len(plain.encode([])) == 0


def layout_copy(tmp_path: Path, edit) -> Path:
    """The bundled teacher's directory, its files linked (the weights are not copied), with
    `edit(directory)` applied to its own copies of the small JSON files."""
    d = tmp_path / "teacher"
    d.mkdir()
    for f in BUNDLED.iterdir():
        if f.is_file():
            target = d / f.name
            if f.suffix == ".json":
                target.write_bytes(f.read_bytes())
            else:
                target.symlink_to(f)
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_bytes((BUNDLED / "1_Pooling" / "config.json").read_bytes())
    edit(d)
    return d


def edit_json(path: Path, change):
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(change(doc)))


NOT_PLAIN = {
    "cls pooling": lambda d: edit_json(
        d / "1_Pooling" / "config.json",
        lambda c: {**c, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
    ),
    "mean and max pooling": lambda d: edit_json(
        d / "1_Pooling" / "config.json", lambda c: {**c, "pooling_mode_max_tokens": True}
    ),
    "a Dense layer": lambda d: edit_json(
        d / "modules.json",
        lambda m: m[:2] + [{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
    ),
    "lower-casing": lambda d: edit_json(d / "sentence_bert_config.json", lambda c: {**c, "do_lower_case": True}),
    "a prompt": lambda d: edit_json(
        d / "config_sentence_transformers.json",
        lambda c: {**c, "prompts": {"query": "query: "}, "default_prompt_name": "query"},
    ),
    "another model type": lambda d: edit_json(d / "config.json", lambda c: {**c, "model_type": "t5"}),
    "no modules.json": lambda d: (d / "modules.json").unlink(),
    "a damaged pooling config": lambda d: (d / "1_Pooling" / "config.json").write_text("{"),
}


@pytest.mark.unit
@pytest.mark.parametrize("change", NOT_PLAIN, ids=list(NOT_PLAIN))
def test_a_layout_the_plain_teacher_cannot_reproduce_is_not_taken_for_plain(tmp_path, change):
    settings, why = plain_layout(layout_copy(tmp_path, NOT_PLAIN[change]))
    assert settings is None and why


@pytest.mark.unit
def test_a_teacher_directory_not_in_the_plain_layout_is_loaded_by_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    prompted = layout_copy(tmp_path, NOT_PLAIN["a prompt"])
    teacher = load_answering_teacher(str(prompted))
    assert isinstance(teacher, SentenceTransformer)
    assert teacher.default_prompt_name == "query"  # loaded as its layout says, prompt included


@pytest.mark.unit
def test_a_plain_teacher_directory_of_ones_own_is_run_without_sentence_transformers(tmp_path):
    own = layout_copy(tmp_path, lambda d: None)
    teacher = load_answering_teacher(str(own))
    assert isinstance(teacher, PlainTeacher) and teacher.path == own


_NO_ST = """
import sys
from pipeline.serve.plain_teacher import load_answering_teacher
teacher = load_answering_teacher("bundled")
teacher.encode(["Who wrote 1984?"])
print(type(teacher).__name__, sorted({m.split(".")[0] for m in sys.modules} & {"sentence_transformers", "sklearn"}))
"""


@pytest.mark.integration
def test_the_bundled_teacher_answers_without_importing_sentence_transformers():
    proc = subprocess.run([sys.executable, "-c", _NO_ST], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "PlainTeacher []"
