"""Bad input and full disks (docs/bad-inputs.md): every case stops with a message that names the file, row,
field or key and says what was expected, exits non-zero before any work, and leaves the previous
outputs as they were.

Stage-level cases call `stages.<name>.main([...])` in-process with every output pointed at
tmp_path and MLflow at a temporary store. The teacher is loaded once for the module, and only two
tests use it; the dataset cases prove they stop before it by making its loading fail the test.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.core.atomic import DiskFull
from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError, PipelineError
from pipeline.data.shard_writer import write_shards
from pipeline.data.shards import open_split, sha256_file
from pipeline.model import EnergyFlowModel
from pipeline.model.model_file import load_model, model_shapes, save_model
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.loop import train_model
from pipeline.train.resume_state import STATE_FILE, load_state, save_state
from stages import embed, evaluate, train
from tests.helpers.shards import fake_shards

pytestmark = pytest.mark.integration  # runs a stage or a bench: outside the ~2-minute unit tier

DIM = 16


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    # One store for the module: creating a SQLite store costs ~2 s; only two tests start a run.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def _isolated_tracking(monkeypatch, tracking_uri):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)


@pytest.fixture(scope="module")
def teacher():
    from pipeline.embed.teacher import load_teacher

    return load_teacher("bundled")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes): equal before and after means untouched."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# Stand-ins that fail as the real writers do on a full disk (seen on a 512 KiB tmpfs): each writes a
# part of its file first, as a write that runs out of space midway does.
def full_disk_np_save(path, *args, **kw):
    Path(path).write_bytes(b"\x93NUMPY partial" * 64)
    raise OSError("76800 requested and 48096 written")  # numpy's tofile: a short write, no errno


def full_disk_torch_save(obj, f, *args, **kw):
    f.write(b"PK partial" * 64)
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what Python's file write raised
    except OSError:
        # torch.save into a file object: its own error, raised while handling Python's OSError
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


# --------------------------------------------------------------------------- dataset


def _parquet_cut(path: Path) -> None:
    pq.write_table(pa.table({"id": ["1", "2"], "question": ["Q1", "Q2"], "answer": ["A1", "A2"]}), path)
    path.write_bytes(path.read_bytes()[:-20])


DATASET_CASES = {
    # case: (file name, content (text, bytes, a function writing it, or None: no file), overrides, fragments)
    "missing file": ("pairs.csv", None, [], ["file not found", "expected a csv dataset"]),
    "empty file": ("pairs.csv", b"", [], ["empty file (0 bytes)", "expected a csv dataset"]),
    "header only": (
        "pairs.csv",
        "id,question,answer\n",
        [],
        ["empty dataset (header only, no data rows)", "expected at least one data row"],
    ),
    "missing field": (
        "pairs.csv",
        "id,question,reply\n1,Q,A\n",
        [],
        ["missing field 'answer'", "expected a column with that name", "Available columns: 'id', 'question', 'reply'"],
    ),
    "null field": (
        "pairs.jsonl",
        '{"id": "1", "question": "Q", "answer": "A"}\n{"id": "2", "question": "Q2", "answer": null}\n',
        [],
        ["row 2 (line 2), field 'answer': value is null", "expected non-empty text", "empty_text=skip"],
    ),
    "empty string": (
        "pairs.csv",
        "id,question,answer\n1,Q,A\n2,,A2\n",
        [],
        ["row 2, field 'question': text is empty", "expected non-empty text"],
    ),
    "whitespace-only string": (
        "pairs.json",
        json.dumps([{"id": "1", "question": "Q", "answer": " \t "}]),
        [],
        ["row 1, field 'answer': text is whitespace-only", "expected non-empty text"],
    ),
    "non-UTF-8 bytes": (
        "pairs.csv",
        b"id,question,answer\n1,ok,fine\n2,caf\xe9,x\n",
        [],
        ["not valid UTF-8 at line 3 (byte offset 34", "expected UTF-8 CSV text"],
    ),
    "binary file named .csv": (
        "pairs.csv",
        bytes(range(256)) * 8,
        [],
        ["looks like binary data", "expected UTF-8 CSV text"],
    ),
    "truncated Parquet": (
        "pairs.parquet",
        _parquet_cut,
        [],
        ["truncated or corrupt Parquet file", "expected the 'PAR1' magic at the end"],
    ),
    "JSON syntax error": (
        "pairs.json",
        '[\n  {"id": "1", "question": "Q", "answer": "A"},\n  {"id": "2" "question": "Q2", "answer": "A2"}\n]',
        [],
        ["invalid JSON at line 3, column 14", "Expecting ',' delimiter", "expected a top-level array of objects"],
    ),
    "nested field path that does not exist": (
        "pairs.json",
        json.dumps([{"id": "1", "question": {"text": "Q", "lang": "en"}, "answer": "A"}]),
        ["embed.input_field=question.body"],
        [
            "missing field 'question.body'",
            "row 1 (under 'question')",
            "expected every row to have it",
            "Keys there: 'lang', 'text'",
        ],
    ),
    "duplicate ids": (
        "pairs.csv",
        "id,question,answer\n1,Q1,A1\n2,Q2,A2\n2,Q3,A3\n",
        [],
        ["duplicate id '2' in field 'id': row 2 and row 3", "expected every id to be unique"],
    ),
}


@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_bad_dataset_stops_embed_before_work_and_keeps_previous_shards(case, tmp_path, capsys, monkeypatch):
    name, content, overrides, fragments = DATASET_CASES[case]
    data = tmp_path / "data" / name
    data.parent.mkdir()
    if callable(content):
        content(data)
    elif isinstance(content, bytes):
        data.write_bytes(content)
    elif content is not None:
        data.write_text(content, encoding="utf-8")
    out = tmp_path / "shards"
    out.mkdir()
    (out / "manifest.json").write_text('{"from": "the previous run"}\n')
    before, listing = tree(tmp_path), sorted(p.name for p in tmp_path.iterdir())

    def no_teacher(*a, **kw):
        raise AssertionError("the teacher was loaded: validation must stop the stage before any work")

    monkeypatch.setattr(embed, "load_teacher", no_teacher)
    code = embed.main(
        [
            f"embed.dataset={data}",
            "embed.group_field=null",
            f"embed.out_dir={out}",
            "embed.cache_dir=",
            "run.allow_external_paths=true",
            *overrides,
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("[embed] error: ") and str(data) in err, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert tree(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == listing


def test_bad_dataset_creates_no_output_directory(tmp_path, capsys, monkeypatch):
    data = tmp_path / "pairs.csv"
    data.write_text("id,question,answer\n")
    monkeypatch.setattr(embed, "load_teacher", lambda *a, **kw: pytest.fail("teacher loaded"))
    assert (
        embed.main(
            [
                f"embed.dataset={data}",
                "embed.group_field=null",
                f"embed.out_dir={tmp_path / 'shards'}",
                "embed.cache_dir=",
                "run.allow_external_paths=true",
            ]
        )
        == 1
    )
    assert "header only" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.csv"]


def test_one_megabyte_text_is_embedded_and_counted_as_truncated(tmp_path, capsys, caplog, monkeypatch, teacher):
    long_text = ("word " * 200_000)[:1_000_000]  # ~200k tokens against a 256-token window
    rows = [{"id": str(i), "question": f"What is item {i}?", "answer": f"It is thing {i}."} for i in range(11)]
    rows.append({"id": "long", "question": long_text, "answer": "A very long question."})
    data = tmp_path / "pairs.csv"
    pd.DataFrame(rows).to_csv(data, index=False)
    assert len(data.read_bytes()) > 1_000_000
    out = tmp_path / "shards"
    monkeypatch.setattr(embed, "load_teacher", lambda *a, **kw: teacher)
    with caplog.at_level(logging.WARNING):
        code = embed.main(
            [
                f"embed.dataset={data}",
                "embed.group_field=null",
                f"embed.out_dir={out}",
                "embed.cache_dir=",
                "run.allow_external_paths=true",
            ]
        )
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["texts_truncated"] == 1 and manifest["stats"]["rows_used"] == 12
    assert "1 distinct texts are longer than the teacher's window of 256 tokens" in caplog.text
    split = next(s for s in ("train", "val", "test") if "long" in set(open_split(out, s).ids))
    shard = open_split(out, split)
    row = list(shard.ids).index("long")
    assert shard.input_texts[row] == long_text  # the text is kept whole; only its embedding is truncated
    assert np.isfinite(shard.inputs[row]).all()


# --------------------------------------------------------------------------- shards


def train_args(tmp_path, shards):
    return [
        f"embed.out_dir={shards}",
        f"train.out_dir={tmp_path / 'models'}",
        "run.allow_external_paths=true",
        f"train.checkpoint_dir={tmp_path / 'ckpt'}",
        "preset=smoke",
        "train.device=cpu",
    ]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _rewrite_matching(path: Path, change) -> None:
    """A shard rewritten by something other than the embed stage, its manifest checksum made to
    match: only what the file holds is wrong."""
    np.save(path, change(np.load(path)), allow_pickle=False)
    manifest_path = path.parent / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest_path.write_text(json.dumps(manifest))


def _with(value, rows=slice(4, 5)):
    def change(arr):
        arr[rows] = value
        return arr

    return change


SHARD_CASES = {
    "NaN, checksum matching": (
        lambda out: _rewrite_matching(out / "train-00000_inputs.npy", _with(np.nan)),
        ["train-00000_inputs.npy: row 5 holds NaN (column 1; split 'train')", "dvc repro embed"],
    ),
    "inf in val, checksum matching": (
        lambda out: _rewrite_matching(out / "val-00000_inputs.npy", _with(np.inf)),
        ["val-00000_inputs.npy: row 5 holds inf (column 1; split 'val')", "dvc repro embed"],
    ),
    "all-NaN targets, checksum matching": (
        lambda out: _rewrite_matching(out / "train-00000_targets.npy", _with(np.nan, slice(None))),
        ["train-00000_targets.npy: row 1 holds NaN (column 1; split 'train')"],
    ),
    "float64, checksum matching": (
        lambda out: _rewrite_matching(out / "train-00000_inputs.npy", lambda a: a.astype(np.float64)),
        ["train-00000_inputs.npy: dtype differs from the manifest: expected float32, found float64"],
    ),
    "sha256 differs from the manifest": (
        lambda out: _flip_last_byte(out / "train-00000_inputs.npy"),
        ["train-00000_inputs.npy: sha256 differs from the manifest: expected ", "run the embed stage"],
    ),
    "missing shard": (
        lambda out: (out / "val-00000_targets.npy").unlink(),
        ["val-00000_targets.npy: file missing (listed in the manifest for split 'val')", "run the embed stage"],
    ),
}


@pytest.mark.parametrize("case", list(SHARD_CASES))
def test_bad_shards_stop_train_before_work(case, tmp_path, capsys, monkeypatch):
    spoil, fragments = SHARD_CASES[case]
    shards = tmp_path / "shards"
    fake_shards(shards)
    spoil(shards)
    monkeypatch.setattr(train, "train_model", lambda *a, **kw: pytest.fail("training started"))
    code = train.main(train_args(tmp_path, shards))
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("[train] error: "), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not (tmp_path / "models").exists() and not (tmp_path / "ckpt").exists()


def model_dir_with(tmp_path, model: EnergyFlowModel, model_cfg) -> Path:
    models = tmp_path / "models"
    save_model(models / "model.pt", model, model_cfg, extra={"seed": 0})
    return models


def run_evaluate(tmp_path, monkeypatch, shards, models, *extra: str) -> int:
    metrics = tmp_path / "metrics"
    # Where evaluate writes: a check that failed to stop it would show as files here, not in the repo.
    monkeypatch.setattr(evaluate, "METRICS_DIR", metrics)
    monkeypatch.setattr(evaluate, "SAMPLES_CSV", tmp_path / "reports" / "eval_samples.csv")
    monkeypatch.setattr(evaluate, "ridge_fit", lambda *a, **kw: pytest.fail("evaluation started"))
    return evaluate.main(
        [f"embed.out_dir={shards}", f"train.out_dir={models}", "preset=smoke", "run.allow_external_paths=true", *extra]
    )


def test_embedding_dim_other_than_the_models_is_refused_by_evaluate(tmp_path, capsys, monkeypatch):
    cfg = load_config(["preset=smoke"]).model
    models = model_dir_with(tmp_path, EnergyFlowModel.from_config(cfg, DIM), cfg)
    shards = tmp_path / "shards"
    fake_shards(shards, dim=8)
    before = tree(tmp_path)
    assert run_evaluate(tmp_path, monkeypatch, shards, models) == 1
    err = capsys.readouterr().err
    assert err.startswith("[evaluate] error: ") and str(models / "model.pt") in err, err
    assert f"the model takes {DIM}-d embeddings but the shards in {shards} hold 8-d ones (teacher tiny-teacher)" in err
    assert "expected the shards it was trained on" in err
    assert tree(tmp_path) == before and not (tmp_path / "metrics").exists()


@pytest.mark.parametrize("case", [c for c in SHARD_CASES if "checksum matching" in c])
def test_shards_holding_what_the_embed_stage_never_writes_stop_evaluate_before_work(
    case, tmp_path, capsys, monkeypatch
):
    spoil, fragments = SHARD_CASES[case]
    cfg = load_config(["preset=smoke"]).model
    models = model_dir_with(tmp_path, EnergyFlowModel.from_config(cfg, DIM), cfg)
    shards = tmp_path / "shards"
    fake_shards(shards)
    spoil(shards)
    before = tree(tmp_path)
    assert run_evaluate(tmp_path, monkeypatch, shards, models, "run.tracking=disabled") == 1
    err = capsys.readouterr().err
    assert err.startswith("[evaluate] error: ") and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert tree(tmp_path) == before and not (tmp_path / "metrics").exists()


def test_a_model_with_nan_weights_stops_evaluate_before_work(tmp_path, capsys, monkeypatch):
    cfg = load_config(["preset=smoke"]).model
    model = EnergyFlowModel.from_config(cfg, DIM)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    models = model_dir_with(tmp_path, model, cfg)
    shards = tmp_path / "shards"
    fake_shards(shards)
    assert run_evaluate(tmp_path, monkeypatch, shards, models) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"[evaluate] error: {models / 'model.pt'}: parameter ") and "= NaN is not finite" in err


def test_float16_shards_are_widened_for_a_float32_config(tmp_path):
    """Converted, not an error: train and evaluate follow the manifest's dtype (embed.dtype only
    says how embed stores them) and every batch is widened to float32 as it is gathered."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, DIM)).astype(np.float32)
    frame = pd.DataFrame({"id": [str(i) for i in range(64)], "input_text": ["q"] * 64, "target_text": ["a"] * 64})
    write_shards(tmp_path / "s", {"train": (frame, x, x[:, ::-1])}, {"name": "t"}, dtype="float16")
    s = open_split(tmp_path / "s", "train")
    assert s.inputs.dtype == np.float16 and s.inputs.take([0, 5]).dtype == np.float32
    cfg = load_config(
        [
            "preset=smoke",
            "embed.dtype=float32",
            "train.epochs=1",
            "train.batch_size=16",
            "train.device=cpu",
            "train.log_every=2",
        ]
    )
    result = train_model(cfg, s.inputs, s.targets, s.inputs, s.targets, progress=False)
    assert result.summary["train/steps"] == 4 and np.isfinite(result.summary["train/loss"])
    assert all(p.dtype == torch.float32 for p in result.model.parameters())


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "override, fragments",
    [
        pytest.param("embed.foo=1", ["'embed.foo'"], id="unknown key"),
        pytest.param("+embed.foo=1", ["unknown key 'embed.foo'", "rows_per_shard"], id="unknown key added with +"),
        pytest.param(
            "embed.batch_size=many",
            ["parameter 'embed.batch_size' = 'many': expected an integer > 0"],
            id="wrong type",
        ),
        pytest.param("train.batch_size=-4", ["'train.batch_size' = -4: expected an integer > 0"], id="negative size"),
        pytest.param("embed.rows_per_shard=0", ["'embed.rows_per_shard' = 0: expected an integer > 0"], id="zero size"),
        pytest.param(
            "model.lattice_width=0", ["'model.lattice_width' = 0: expected an integer > 0"], id="zero lattice"
        ),
        pytest.param(
            "embed.splits.val=0.3",
            ["'embed.splits' = {'train': 0.8, 'val': 0.3, 'test': 0.1}: expected fractions summing to 1"],
            id="fractions not summing to 1",
        ),
    ],
)
def test_bad_config_stops_the_stage_naming_the_key(override, fragments, tmp_path, capsys):
    out = tmp_path / "shards"
    code = embed.main(
        [
            f"embed.dataset={tmp_path / 'none.csv'}",
            "embed.group_field=null",
            f"embed.out_dir={out}",
            override,
            "run.allow_external_paths=true",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("[embed] config error: "), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override", ["embed.foo=1", "+embed.foo=1"])
def test_unknown_key_says_which_keys_are_expected(override):
    with pytest.raises(ConfigError) as exc:
        load_config([override])
    assert "unknown key 'embed.foo'; expected one of the keys of 'embed': " in str(exc.value)
    assert "rows_per_shard" in str(exc.value) and "+embed.foo" not in str(exc.value)


def test_a_misspelt_key_gets_the_nearest_spelling():
    with pytest.raises(ConfigError, match=r"unknown key 'train.batchsize' \(did you mean 'train.batch_size'\?\)"):
        load_config(["train.batchsize=8"])


def test_model_file_of_another_model_config_names_the_tensors(tmp_path, capsys, monkeypatch):
    trained = load_config(["preset=smoke"]).model
    other = load_config(["preset=smoke", "model.lattice_width=5", "model.carrier_hidden=32"]).model
    models = model_dir_with(tmp_path, EnergyFlowModel.from_config(trained, DIM), other)
    shards = tmp_path / "shards"
    fake_shards(shards)
    before = tree(tmp_path)
    assert run_evaluate(tmp_path, monkeypatch, shards, models) == 1
    err = capsys.readouterr().err
    assert err.startswith("[evaluate] error: ") and str(models / "model.pt") in err, err
    assert "its weights do not fit the model its own model_config builds (16-d embeddings, lattice 5x4x3" in err
    assert "lattice.state (file (48, 8), model (60, 8))" in err
    assert "input_mapper.proj.weight (file (16, 16), model (20, 16))" in err
    assert "expected the weights of that config" in err and "dvc repro train" in err
    assert tree(tmp_path) == before and not (tmp_path / "metrics").exists()


def _misspelt_config_key(path: Path) -> None:
    payload = torch.load(path, weights_only=True)
    payload["model_config"]["lattice_widht"] = 4
    torch.save(payload, path)


@pytest.mark.parametrize(
    "spoil, fragments",
    [
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes()[:400]),
            ["not a readable model file", "expected the model.pt"],
            id="truncated",
        ),
        pytest.param(
            _misspelt_config_key,
            ["keys the model does not take: ['lattice_widht']", "expected the keys of the model section"],
            id="unknown model_config key",
        ),
    ],
)
def test_unusable_model_file_is_named(tmp_path, spoil, fragments):
    cfg = load_config(["preset=smoke"]).model
    path = tmp_path / "model.pt"
    save_model(path, EnergyFlowModel.from_config(cfg, DIM), cfg)
    spoil(path)
    with pytest.raises(PipelineError) as exc:
        load_model(path)
    assert str(path) in str(exc.value)
    for fragment in fragments:
        assert fragment in str(exc.value), str(exc.value)


def test_checkpoint_whose_tensors_do_not_fit_is_set_aside_naming_them(tmp_path, caplog):
    """Same fingerprint (so the same config as far as it can tell) but tensors of another model,
    as a checkpoint from another version of the code: resuming would crash in load_state_dict on
    every attempt; instead it is set aside, named, and the run starts afresh."""
    cfg = load_config(["preset=smoke"]).model
    other = load_config(["preset=smoke", "model.cell_state_dim=4"]).model
    path = tmp_path / STATE_FILE
    save_state(path, {"fingerprint": "fp", "model": EnergyFlowModel.from_config(other, DIM).state_dict()})
    assert load_state(path, "fp")["fingerprint"] == "fp"  # without the shapes it would be resumed
    with caplog.at_level(logging.WARNING):
        assert load_state(path, "fp", model_shapes=model_shapes(cfg, DIM)) is None
    assert str(path) in caplog.text and "lattice.state (file (48, 4), model (48, 8))" in caplog.text
    assert "starting from step 0" in caplog.text
    save_state(path, {"fingerprint": "fp", "model": EnergyFlowModel.from_config(cfg, DIM).state_dict()})
    assert load_state(path, "fp", model_shapes=model_shapes(cfg, DIM)) is not None


# --------------------------------------------------------------------------- disk full


@pytest.mark.parametrize("where", ["shard", "embedding cache"])
def test_disk_full_while_embedding_keeps_the_previous_shards(where, tmp_path, capsys, monkeypatch, teacher):
    data = tmp_path / "pairs.csv"
    data.write_text("id,question,answer\n" + "".join(f"{i},What is {i}?,It is {i}.\n" for i in range(10)))
    out, cache = tmp_path / "shards", tmp_path / "cache"
    fake_shards(out)
    before, listing = tree(out), sorted(p.name for p in tmp_path.iterdir())
    if where == "shard":
        monkeypatch.setattr(np, "save", full_disk_np_save)
        name, hint = out / "train-00000_inputs.npy", "set embed.out_dir to another disk"
    else:
        real_write = pq.write_table

        def write_table(table, path, *a, **kw):  # the cache's part files fail, the shards' texts do not
            if cache not in Path(path).parents:
                return real_write(table, path, *a, **kw)
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

        monkeypatch.setattr(pq, "write_table", write_table)
        name, hint = cache, "set embed.cache_dir to another disk"
    monkeypatch.setattr(embed, "load_teacher", lambda *a, **kw: teacher)
    code = embed.main(
        [
            f"embed.dataset={data}",
            "embed.group_field=null",
            f"embed.out_dir={out}",
            f"embed.cache_dir={cache}",
            "run.allow_external_paths=true",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"[embed] error: {name}" in err and "the disk is full (No space left on device) while writing to it" in err
    assert hint in err, err
    if where == "shard":
        assert f"the previous shards in {out} are left as they were and the partly written ones removed" in err
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == sorted([*listing, "cache"])
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]  # the cache holds whole parts only


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, DIM)).astype(np.float32)
    cfg = load_config(
        [
            "preset=smoke",
            "train.epochs=2",
            "train.batch_size=16",
            "train.device=cpu",
            "train.log_every=2",
            "train.checkpoint_every=4",
        ]
    )
    path = tmp_path / "ckpt" / STATE_FILE
    previous, real_save = {}, torch.save

    def save(*args, **kw):  # the first checkpoint (step 4) is written, the second (step 8) finds the disk full
        if not path.exists():
            return real_save(*args, **kw)
        previous["bytes"] = path.read_bytes()
        return full_disk_torch_save(*args, **kw)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(DiskFull) as exc:
        train_model(cfg, x, x, progress=False, checkpointing=Checkpointing(path, "fp", 4))
    msg = str(exc.value)
    assert isinstance(exc.value, PipelineError)  # so the stage prints "[train] error: ..." and exits 1
    assert msg.startswith(f"{path}: the disk is full (No space left on device) while writing to it"), msg
    assert "the previous last.pt is left as it was and the partial file removed" in msg
    assert path.read_bytes() == previous["bytes"] and os.listdir(path.parent) == [STATE_FILE]
    monkeypatch.undo()
    assert load_state(path, "fp")["step"] == 4


def test_disk_full_while_saving_the_model_keeps_the_previous_model(tmp_path, monkeypatch):
    cfg = load_config(["preset=smoke"]).model
    path = tmp_path / "models" / "model.pt"
    save_model(path, EnergyFlowModel.from_config(cfg, DIM), cfg, extra={"seed": 0})
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", full_disk_torch_save)
    with pytest.raises(DiskFull) as exc:
        save_model(path, EnergyFlowModel.from_config(cfg, DIM), cfg, extra={"seed": 1})
    msg = str(exc.value)
    assert msg.startswith(f"{path}: the disk is full (No space left on device) while writing to it"), msg
    assert "the previous model.pt is left as it was and the partial file removed" in msg
    assert path.read_bytes() == before and os.listdir(path.parent) == ["model.pt"]
