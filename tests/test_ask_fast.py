"""./dev ask's quick way to its first answer: the teacher's weights digest kept between loads (and
hashed again whenever a weight file changes, so a changed teacher is still refused), and a logged
model loaded from its local directory without MLflow when its code is this checkout's
(pipeline/serve/teacher_digest.py, pipeline/serve/local_model.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.embed.teacher import weights_digest
from pipeline.serve import teacher_digest
from pipeline.serve.local_model import PACKAGE_DIR, open_local
from pipeline.serve.teacher_digest import WEIGHT_SUFFIXES, teacher_weights_digest

pytestmark = pytest.mark.unit


@pytest.fixture
def teacher(tmp_path) -> Path:
    d = tmp_path / "teacher"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"weights-1" * 1000)
    (d / "sub" / "extra.bin").write_bytes(b"more")
    (d / "config.json").write_text("{}")
    return d


def test_the_digest_is_kept_and_reused_while_the_weight_files_are_unchanged(teacher, tmp_path):
    cache = tmp_path / "cache" / "digest.json"
    assert teacher_weights_digest(teacher, cache) == weights_digest(teacher)
    entries = json.loads(cache.read_text())
    # A planted digest under the same file identities is what comes back: the weights were not read.
    entries[str(teacher.resolve())]["sha256"] = "planted"
    cache.write_text(json.dumps(entries))
    assert teacher_weights_digest(teacher, cache) == "planted"


@pytest.mark.parametrize(
    "change",
    ["rewrite", "same_size", "add", "remove"],
)
def test_any_change_to_the_weight_files_hashes_them_again(teacher, tmp_path, change):
    cache = tmp_path / "digest.json"
    before = teacher_weights_digest(teacher, cache)
    weights = teacher / "model.safetensors"
    if change == "rewrite":
        weights.write_bytes(b"weights-2" * 2000)
    elif change == "same_size":  # same size, the mtime put back: the inode and ctime still differ
        st = weights.stat()
        replacement = teacher / "new.tmp"
        replacement.write_bytes(b"weights-X" * 1000)
        replacement.replace(weights)
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "add":
        (teacher / "adapter.pt").write_bytes(b"lora")
    else:
        (teacher / "sub" / "extra.bin").unlink()
    after = teacher_weights_digest(teacher, cache)
    assert after == weights_digest(teacher) != before


def test_the_cache_keys_exactly_the_files_weights_digest_reads(teacher, tmp_path):
    cache = tmp_path / "digest.json"
    for suffix in WEIGHT_SUFFIXES:  # each one changes the digest, and so must change the key
        key = teacher_digest.weight_files_key(teacher)
        digest = weights_digest(teacher)
        (teacher / f"w{suffix}").write_bytes(b"x")
        assert weights_digest(teacher) != digest and teacher_digest.weight_files_key(teacher) != key
    key, digest = teacher_digest.weight_files_key(teacher), weights_digest(teacher)
    (teacher / "tokenizer.json").write_text("{}")  # read by neither
    assert weights_digest(teacher) == digest and teacher_digest.weight_files_key(teacher) == key
    assert teacher_weights_digest(teacher, cache) == digest


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b'{"x": 1}', b"{" + b" " * (2 << 20) + b"}"])
def test_a_damaged_or_foreign_cache_is_ignored_and_written_anew(teacher, tmp_path, content):
    cache = tmp_path / "digest.json"
    cache.write_bytes(content)
    assert teacher_weights_digest(teacher, cache) == weights_digest(teacher)
    assert json.loads(cache.read_text())[str(teacher.resolve())]["sha256"] == weights_digest(teacher)


def test_a_changed_teacher_is_refused_though_its_old_digest_is_cached(teacher, tmp_path, monkeypatch):
    from pipeline.serve import answering

    # The teacher's loading is not what is tested: its weights check is.
    monkeypatch.setattr(answering, "load_answering_teacher", lambda name: object())
    monkeypatch.setattr(answering, "resolve_teacher", lambda name: str(teacher))
    cache = tmp_path / "digest.json"
    recorded = weights_digest(teacher)
    answering.Answerer._load_teacher("bundled", recorded, cache)  # accepted, and cached
    (teacher / "model.safetensors").write_bytes(b"fine-tuned" * 1000)
    with pytest.raises(PipelineError, match="its weights have sha256 .* but the model was trained on embeddings"):
        answering.Answerer._load_teacher("bundled", recorded, cache)


MLMODEL = {
    "flavors": {
        "python_function": {
            "loader_module": "mlflow.pyfunc.loaders.code_model",
            "artifacts": {"model": {"path": "artifacts/model.pt"}, "bank": {"path": "artifacts/answer_bank.npz"}},
            "config": {
                "train_batch_size": 32,
                "embed_batch_size": 64,
                "embed_dtype": "float32",
                "teacher": "bundled",
                "dim": 384,
                "bank_sha256": "b" * 64,
            },
        }
    },
    "signature": {"inputs": '[{"type": "string", "name": "question", "required": true}]'},
    "metadata": {"model_sha256": "m" * 64},
    "run_id": "r1",
    "model_id": "m-1",
}


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A model directory laid out as MLflow saves the answer model, its code this checkout's."""
    import yaml

    d = tmp_path / "model"
    (d / "artifacts").mkdir(parents=True)
    (d / "artifacts" / "model.pt").write_bytes(b"m")
    (d / "artifacts" / "answer_bank.npz").write_bytes(b"b")
    shutil.copytree(PACKAGE_DIR, d / "code" / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    (d / "MLmodel").write_text(yaml.safe_dump(MLMODEL))
    return d


def test_a_model_with_this_checkouts_code_opens_without_mlflow(model_dir):
    model, why = open_local(model_dir)
    assert why == "" and model is not None
    assert model.artifacts == {
        "model": str((model_dir / "artifacts" / "model.pt").resolve()),
        "bank": str((model_dir / "artifacts" / "answer_bank.npz").resolve()),
    }
    assert model.config["bank_sha256"] == "b" * 64 and model.run_id == "r1"


def edit_mlmodel(model_dir: Path, edit) -> None:
    import yaml

    info = yaml.safe_load((model_dir / "MLmodel").read_text())
    edit(info)
    (model_dir / "MLmodel").write_text(yaml.safe_dump(info))


@pytest.mark.parametrize(
    "spoil, why",
    [
        (lambda d: (d / "code" / "pipeline" / "serve" / "answering.py").write_text("# other code\n"), "code is not"),
        (lambda d: (d / "code" / "pipeline" / "serve" / "added.py").write_text(""), "code is not"),
        (lambda d: shutil.rmtree(d / "code"), "code is not"),
        (lambda d: (d / "artifacts" / "answer_bank.npz").unlink(), "bank file is missing"),
        (
            lambda d: edit_mlmodel(
                d, lambda i: i["flavors"]["python_function"]["artifacts"]["bank"].update(path="../../etc/passwd")
            ),
            "bank file is missing",
        ),
        (lambda d: edit_mlmodel(d, lambda i: i["signature"].update(inputs="[]")), "not an answer model"),
        (
            lambda d: edit_mlmodel(d, lambda i: i["flavors"]["python_function"].update(loader_module="x")),
            "not an answer model",
        ),
        (lambda d: edit_mlmodel(d, lambda i: i["flavors"]["python_function"]["config"].pop("dim")), "no answer model"),
        (lambda d: (d / "MLmodel").write_text("- a list"), "not a mapping"),
        (lambda d: (d / "MLmodel").write_bytes(b"x" * (2 << 20)), "is over"),
        (lambda d: (d / "MLmodel").unlink(), "cannot be read"),
    ],
)
def test_anything_else_is_left_to_mlflow_saying_why(model_dir, spoil, why):
    spoil(model_dir)
    model, reason = open_local(model_dir)
    assert model is None and why in reason


# Prints without flushing (a pipe buffers it), leaves a temporary directory and an atexit handler
# to the end, as ./dev ask's run leaves them, then ends through exit_now.
_EXIT = """
import atexit, sys, tempfile
from tools.ask import exit_now
tmp = tempfile.TemporaryDirectory(prefix="ask-exit-")
print(tmp.name)
print("Q: Who wrote 1984?")
atexit.register(lambda: print("atexit ran", file=sys.stderr))
exit_now(int(sys.argv[1]))
"""


@pytest.mark.parametrize("rc", [0, 2, 130])
def test_ask_ends_without_teardown_yet_with_its_output_status_and_clean_up(tmp_path, rc):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT, str(rc)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == rc, proc.stderr
    name, answer = proc.stdout.splitlines()
    assert answer == "Q: Who wrote 1984?" and "atexit ran" in proc.stderr
    assert Path(name).parent == tmp_path and not Path(name).exists()  # removed at exit
    assert list(tmp_path.iterdir()) == []
