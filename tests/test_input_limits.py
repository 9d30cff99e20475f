"""Inputs are read with limits a user can raise: a dataset file's size (before it is read), its
line lengths and header columns (before it is parsed), its rows (as soon as they are known). Each
refusal names the file, the limit, what the file holds and the key that raises it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError, DatasetError
from pipeline.core.paths import REPO_ROOT
from pipeline.data.input_limits import InputLimits
from pipeline.data.readers import delimited, json_objects
from pipeline.data.readers.dataset import read_dataset, read_pairs
from pipeline.embed.embedding import prepare_pairs

pytestmark = pytest.mark.unit


def _csv(path, rows: int = 3, extra: str = ""):
    lines = ["id,question,answer"] + [f"{i},q{i}{extra},a{i}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _read(path, **limits):
    return read_pairs(path, "question", "answer", "id", limits=InputLimits(**limits))


@pytest.fixture
def no_parsing(monkeypatch):
    """Fail the test if a parser is reached: a refusal must come before the memory is spent."""

    def parse(*a, **k):
        raise AssertionError("the file was parsed before it was refused")

    monkeypatch.setattr(delimited.pd, "read_csv", parse)
    monkeypatch.setattr(json_objects, "JsonLoader", parse)


def test_the_defaults_let_the_bundled_dataset_through():
    cfg = load_config([])
    df = read_pairs(REPO_ROOT / cfg.embed.dataset, "question", "answer", "id", limits=InputLimits.of(cfg.embed))
    assert len(df) > 6000


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = _csv(tmp_path / "big.csv", rows=200)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read before refused"))
    with pytest.raises(DatasetError) as refused:
        _read(path, max_mb=0.001)
    message = str(refused.value)
    assert message.startswith(f"{path}: 0.0 MB, more than embed.max_input_mb = 0.001 MB; refused before reading")
    assert "raise embed.max_input_mb" in message


def test_the_size_limit_comes_from_the_config_through_the_embed_stage_s_reader(tmp_path):
    path = _csv(tmp_path / "big.csv", rows=5000)
    args = [f"embed.dataset={path}", "run.allow_external_paths=true", "embed.group_field=null"]
    with pytest.raises(DatasetError, match=r"big\.csv: 0\.1 MB, more than embed\.max_input_mb = 0\.05 MB"):
        prepare_pairs(load_config([*args, "embed.max_input_mb=0.05"]).embed, True)
    assert len(prepare_pairs(load_config(args).embed, True).frame) == 5000


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_line_over_the_line_limit_is_refused_before_parsing(tmp_path, no_parsing, fmt):
    if fmt == "csv":
        path = tmp_path / "long.csv"
        path.write_text("id,question,answer\n1,q,a\n2," + "x" * 5000 + ",a\n3,q,a\n")
    else:
        path = tmp_path / "long.jsonl"
        rows = [{"id": "1", "question": "q", "answer": "a"}, {"id": "2", "question": "x" * 5000, "answer": "a"}]
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    line = 3 if fmt == "csv" else 2
    with pytest.raises(DatasetError) as refused:
        _read(path, max_line_kb=1)
    message = str(refused.value)
    assert message.startswith(f"{path}: line {line} is 5 KB long, more than embed.max_line_kb = 1 KB")
    assert "raise embed.max_line_kb (now 1 KB)" in message


def test_a_one_line_json_array_is_not_held_to_the_line_limit(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"id": str(i), "question": "q" * 100, "answer": f"a{i}"} for i in range(50)]))
    assert len(_read(path, max_line_kb=1)) == 50


def test_a_header_with_too_many_columns_is_refused_before_parsing(tmp_path, no_parsing):
    path = tmp_path / "wide.csv"
    path.write_text("id,question,answer," + ",".join(f"c{i}" for i in range(30)) + "\n1,q,a" + ",x" * 30 + "\n")
    with pytest.raises(DatasetError) as refused:
        _read(path, max_columns=20)
    assert str(refused.value).startswith(
        f"{path}: the header has 33 columns, more than embed.max_input_columns = 20; refused before reading its rows"
    )
    assert "raise embed.max_input_columns" in str(refused.value)


def test_quoted_separators_are_not_counted_as_columns(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text('id,question,"answer, with commas, inside"\n1,q,a\n')
    assert (
        len(read_pairs(path, "question", "answer, with commas, inside", "id", limits=InputLimits(max_columns=3))) == 1
    )


def test_a_one_line_csv_of_a_great_many_columns_is_refused_under_the_default_limits(tmp_path, no_parsing):
    """The shape of a file that once took gigabytes to parse: one line, millions of fields."""
    limits = InputLimits.of(load_config([]).embed)
    path = tmp_path / "one-line.csv"
    path.write_text("id,question,answer," + "x," * 1_500_000 + "x\n")
    with pytest.raises(DatasetError, match=r"line 1 is 2,930 KB long, more than embed.max_line_kb = 1024 KB"):
        read_pairs(path, "question", "answer", "id", limits=limits)
    wider = InputLimits(**{**limits.__dict__, "max_line_kb": 10_000.0})
    with pytest.raises(DatasetError, match=r"1,500,004 columns, more than embed.max_input_columns = 10,000"):
        read_pairs(path, "question", "answer", "id", limits=wider)


def test_rows_over_the_limit_are_refused_per_file_and_over_the_dataset(tmp_path):
    (tmp_path / "d").mkdir()
    one = _csv(tmp_path / "d" / "a.csv", rows=4)
    with pytest.raises(DatasetError, match=rf"{one}: 4 rows, more than embed.max_input_rows = 3; refused before"):
        _read(one, max_rows=3)
    two = tmp_path / "d" / "b.csv"
    two.write_text("id,question,answer\n" + "".join(f"b{i},q,a\n" for i in range(4)))
    with pytest.raises(DatasetError) as refused:
        read_dataset(tmp_path / "d", "question", "answer", "id", limits=InputLimits(max_rows=6))
    assert "(2 of its 2 files): 8 rows, more than embed.max_input_rows = 6; refused before reading the rest" in str(
        refused.value
    )
    assert len(read_dataset(tmp_path / "d", "question", "answer", "id", limits=InputLimits(max_rows=8))) == 8


def test_a_parquet_file_s_rows_and_columns_are_refused_from_its_footer(tmp_path, monkeypatch):
    path = tmp_path / "rows.parquet"
    frame = pd.DataFrame({"id": [str(i) for i in range(10)], "question": ["q"] * 10, "answer": ["a"] * 10})
    frame.assign(**{f"c{i}": [0] * 10 for i in range(5)}).to_parquet(path)
    import pyarrow.parquet as pq

    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("read before refused"))
    with pytest.raises(
        DatasetError, match=r"rows\.parquet: its schema has 8 columns, more than embed.max_input_columns"
    ):
        _read(path, max_columns=5)
    with pytest.raises(
        DatasetError, match=r"rows\.parquet: 10 rows, more than embed.max_input_rows = 9; refused before"
    ):
        _read(path, max_rows=9)


@pytest.mark.parametrize(
    "override", ["embed.max_input_mb=0", "embed.max_input_mb=-1", "embed.max_line_kb=inf", "embed.max_input_rows=0"]
)
def test_a_limit_must_be_positive(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config([override])
