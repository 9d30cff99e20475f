"""What is read is checked where it is read: shards whose checksums match but whose values are not
finite (or whose arrays are of another shape or dtype), model files with non-finite weights or
that hold pickled code, checkpoints the same. Each is one message naming the file (and the split,
row or parameter), never an IndexError from deep inside the model or torch's advice to load the
file unsafely."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import PipelineError, ShardError
from pipeline.data.shard_writer import write_shards
from pipeline.data.shards import first_nonfinite, open_split, sha256_file
from pipeline.model import EnergyFlowModel
from pipeline.model.model_file import load_model, save_model
from pipeline.train.resume_state import load_state, save_state

pytestmark = pytest.mark.unit

DIM = 4
MODEL = dict(
    lattice_width=3,
    lattice_height=3,
    lattice_depth=2,
    max_active_flows=16,
    cell_state_dim=2,
    neuron_hidden=4,
    carrier_layers=1,
    carrier_hidden=4,
    min_forward=0.5,
    max_forward=1.5,
    max_lateral=1.0,
    energy_min=0.0,
    convergence_threshold=0.95,
    patience=2,
    max_steps=10,
    adaptive_stop=True,
    output_hidden=8,
    checkpoint_steps=False,
)


def _split(n: int, offset: int = 0):
    frame = pd.DataFrame(
        {
            "id": [f"id{offset + i}" for i in range(n)],
            "input_text": [f"q {i}" for i in range(n)],
            "target_text": [f"a {i}" for i in range(n)],
        }
    )
    rng = np.random.default_rng(offset)
    return frame, rng.standard_normal((n, DIM)).astype(np.float32), rng.standard_normal((n, DIM)).astype(np.float32)


def _shards(tmp_path, rows_per_shard: int = 262144, dtype: str = "float32"):
    out = tmp_path / "shards"
    write_shards(
        out,
        {"train": _split(12), "val": _split(4, 100)},
        {"name": "t"},
        rows_per_shard=rows_per_shard,
        dtype=dtype,
    )
    return out


def _rewrite(shard_dir, name: str, arr: np.ndarray) -> None:
    """Replace a shard file as something other than the embed stage would, and make the manifest's
    checksum match it: only the values are wrong."""
    path = shard_dir / name
    np.save(path, arr, allow_pickle=False)
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (shard_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("value, shown", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_a_shard_holding_a_non_finite_value_is_named_by_file_split_and_row(tmp_path, value, shown):
    out = _shards(tmp_path)
    name = "train-00000_targets.npy"
    arr = np.load(out / name)
    arr[6, 2] = value
    _rewrite(out, name, arr)
    with pytest.raises(ShardError) as refused:
        open_split(out, "train")
    message = str(refused.value)
    assert message.startswith(f"{out / name}: row 7 holds {shown} (column 3; split 'train')")
    assert "embed" in message  # what to do
    open_split(out, "val")  # the other split is untouched


def test_all_nan_targets_are_refused_at_their_first_row(tmp_path):
    out = _shards(tmp_path)
    name = "val-00000_targets.npy"
    _rewrite(out, name, np.full((4, DIM), np.nan, dtype=np.float32))
    with pytest.raises(ShardError, match=r"val-00000_targets\.npy: row 1 holds NaN \(column 1; split 'val'\)"):
        open_split(out, "val", need_rows="to evaluate on")


def test_the_row_of_the_split_is_named_when_it_is_not_the_file_s(tmp_path):
    out = _shards(tmp_path, rows_per_shard=5)  # train: 5 + 5 + 2 rows
    name = "train-00001_inputs.npy"
    arr = np.load(out / name)
    arr[3, 0] = np.nan
    _rewrite(out, name, arr)
    with pytest.raises(ShardError, match=r"row 4 holds NaN \(column 1; split 'train', row 9 of the split\)"):
        open_split(out, "train")


def test_float16_shards_are_checked_too(tmp_path):
    out = _shards(tmp_path, dtype="float16")
    name = "train-00000_inputs.npy"
    arr = np.load(out / name)
    arr[0, 0] = np.inf
    _rewrite(out, name, arr)
    with pytest.raises(ShardError, match="row 1 holds inf"):
        open_split(out, "train")


@pytest.mark.parametrize(
    "replacement, fragment",
    [
        (np.zeros((12, DIM), dtype=np.float64), "dtype differs from the manifest: expected float32, found float64"),
        (np.zeros((12, DIM), dtype=np.int32), "dtype differs from the manifest"),
        (np.zeros((12, DIM + 1), dtype=np.float32), "shape differs from the manifest: expected (12, 4), found (12, 5)"),
        (np.zeros((11, DIM), dtype=np.float32), "shape differs from the manifest"),
        (np.zeros(12 * DIM, dtype=np.float32), "shape differs from the manifest"),
        (np.zeros((12, DIM), dtype=">f4"), "dtype differs from the manifest"),
    ],
    ids=["float64", "int32", "wider", "shorter", "flat", "big-endian"],
)
def test_a_shard_of_another_shape_or_dtype_is_named(tmp_path, replacement, fragment):
    out = _shards(tmp_path)
    _rewrite(out, "train-00000_inputs.npy", replacement)
    with pytest.raises(ShardError) as refused:
        open_split(out, "train")
    assert str(refused.value).startswith(str(out / "train-00000_inputs.npy"))
    assert fragment in str(refused.value)


@pytest.mark.parametrize("name", ["../elsewhere.npy", "/etc/passwd", "sub/dir.npy", ""])
def test_a_manifest_naming_a_file_outside_its_directory_is_refused(tmp_path, name):
    out = _shards(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["inputs"] = name
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="expected a plain file name"):
        open_split(out, "train")


@pytest.mark.parametrize("dim", ["4", 0, -1, 4.5, True, None])
def test_a_manifest_dim_that_is_not_a_positive_integer_is_refused(tmp_path, dim):
    out = _shards(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["dim"] = dim
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="shard dim is .*expected a positive integer"):
        open_split(out, "train")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    kind=st.sampled_from(["inputs", "targets"]),
    value=st.sampled_from([np.nan, np.inf, -np.inf, 1e30, 0.0]),
    rows_per_shard=st.integers(1, 13),
)
def test_any_single_value_corruption_is_refused_or_read_back_exactly(
    tmp_path_factory, data, kind, value, rows_per_shard
):
    """Whatever one value of one shard becomes (the checksum made to match): a non-finite value is
    refused naming that file, its row and column; a finite one reads back as written."""
    out = _shards(tmp_path_factory.mktemp("s"), rows_per_shard=rows_per_shard)
    split = data.draw(st.sampled_from(["train", "val"]))
    count = 12 if split == "train" else 4
    row = data.draw(st.integers(0, count - 1))
    col = data.draw(st.integers(0, DIM - 1))
    index, local = divmod(row, rows_per_shard)
    name = f"{split}-{index:05d}_{kind}.npy"
    arr = np.load(out / name)
    arr[local, col] = value
    _rewrite(out, name, arr)
    if np.isfinite(value):
        got = getattr(open_split(out, split), kind)
        assert got[row][col] == np.float32(value)
        return
    with pytest.raises(ShardError) as refused:
        open_split(out, split)
    message = str(refused.value)
    assert message.startswith(f"{out / name}: row {local + 1} holds ")
    assert f"column {col + 1}; split {split!r}" in message


def test_first_nonfinite_reads_in_blocks_and_finds_the_first(monkeypatch):
    from pipeline.data import shards

    monkeypatch.setattr(shards, "_CHECK_ELEMENTS", 8)  # two rows of 4 per block
    arr = np.zeros((9, 4), dtype=np.float32)
    assert first_nonfinite(arr) is None
    arr[7, 1], arr[8, 0] = np.nan, np.inf
    assert first_nonfinite(arr) == (7, 1, "NaN")


# --------------------------------------------------------------------------- model files


def _model_file(tmp_path, spoil=None):
    torch.manual_seed(0)
    model = EnergyFlowModel(DIM, **MODEL)
    if spoil:
        with torch.no_grad():
            spoil(model)
    path = tmp_path / "model.pt"
    save_model(path, model, dict(MODEL))
    return path


def test_a_model_with_finite_weights_loads(tmp_path):
    model, payload = load_model(_model_file(tmp_path))
    assert payload["dim"] == DIM and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (float("inf"), "inf")])
def test_a_model_with_non_finite_weights_is_refused_naming_the_parameter(tmp_path, value, shown):
    def spoil(model):
        name, param = list(model.named_parameters())[1]
        param.view(-1)[1] = value
        spoil.name = name

    path = _model_file(tmp_path, spoil)
    with pytest.raises(PipelineError) as refused:
        load_model(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: parameter {spoil.name}[") and f"= {shown} is not finite" in message
    assert "dvc repro train" in message


@pytest.mark.parametrize(
    "write, fragment",
    [
        (lambda p: p.write_bytes(pickle.dumps({"state_dict": {}})), "a plain pickle or other data, refused for safety"),
        (lambda p: torch.save({"x": np.float64}, p), "it holds pickled code or objects"),
        (lambda p: p.write_bytes(b"hello"), "not a readable model file"),
        (lambda p: p.write_bytes(p.read_bytes()[:300]), "not a readable model file"),
    ],
    ids=["plain pickle", "pickled class", "text", "truncated"],
)
def test_an_unloadable_model_file_never_shows_torch_s_unsafe_hint(tmp_path, write, fragment, recwarn):
    path = _model_file(tmp_path)
    write(path)
    with pytest.raises(PipelineError) as refused:
        load_model(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and fragment in message and "\n" not in message
    assert "weights_only" not in message and "trusted source" not in message
    assert not [w for w in recwarn if "pickle" in str(w.message)]  # torch's protocol warning is not shown


def test_a_checkpoint_with_non_finite_weights_is_set_aside(tmp_path, caplog):
    path = tmp_path / "last.pt"
    state = {"fingerprint": "fp", "model": {"w": torch.tensor([1.0, float("nan")])}, "optimizer": {"state": {}}}
    save_state(path, state)
    with caplog.at_level("WARNING"):
        assert load_state(path, "fp") is None
    assert "w[1] = NaN" in caplog.text and "starting from step 0" in caplog.text
    state["model"]["w"] = torch.tensor([1.0, 2.0])
    state["optimizer"] = {"state": {0: {"exp_avg": torch.tensor([float("inf")])}}}
    save_state(path, state)
    assert load_state(path, "fp") is None
    assert "optimizer.state.0.exp_avg[0] = inf" in caplog.text
