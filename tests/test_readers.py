"""read_pairs: every format, dotted paths, and every user error with a precise message."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.readers import content_id, drop_duplicate_pairs, read_pairs
from pipeline.errors import DatasetError

ROWS = [
    {"id": "a", "q": "What is 2+2?", "a": "4"},
    {"id": "b", "q": "Capital of France?", "a": "Paris"},
    {"id": "c", "q": "NA", "a": "null"},  # literal text that pandas would turn into NaN
]


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def expect_error(path, *fragments, **kw) -> str:
    """read_pairs must raise DatasetError mentioning the file name and every fragment."""
    kw.setdefault("input_field", "q")
    kw.setdefault("target_field", "a")
    with pytest.raises(DatasetError) as exc:
        read_pairs(path, **kw)
    msg = str(exc.value)
    assert Path(path).name in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


def check_rows(df: pd.DataFrame, with_ids: bool = True) -> None:
    assert list(df.columns) == ["id", "input_text", "target_text"]
    assert isinstance(df.index, pd.RangeIndex) and df.index.start == 0
    assert df["input_text"].tolist() == [r["q"] for r in ROWS]
    assert df["target_text"].tolist() == [r["a"] for r in ROWS]
    if with_ids:
        assert df["id"].tolist() == ["a", "b", "c"]
    assert all(isinstance(v, str) for col in df.columns for v in df[col])


# --------------------------------------------------------------------------- formats


def test_csv(tmp_path):
    p = write(tmp_path / "d.csv",
              'id,q,a\na,What is 2+2?,4\nb,Capital of France?,Paris\nc,NA,null\n')
    check_rows(read_pairs(p, "q", "a", id_field="id"))


def test_csv_quoted_fields_keep_commas_and_newlines(tmp_path):
    p = write(tmp_path / "d.csv", 'q,a\n"x, y","line1\nline2"\n')
    df = read_pairs(p, "q", "a")
    assert df["input_text"].tolist() == ["x, y"]
    assert df["target_text"].tolist() == ["line1\nline2"]


def test_csv_utf8_bom_is_not_part_of_header(tmp_path):
    p = write(tmp_path / "d.csv", "\ufeffq,a\nhé,ü\n".encode("utf-8"))
    assert read_pairs(p, "q", "a")["input_text"].tolist() == ["hé"]


def test_tsv(tmp_path):
    p = write(tmp_path / "d.tsv", "id\tq\ta\n" + "".join(
        f"{r['id']}\t{r['q']}\t{r['a']}\n" for r in ROWS))
    check_rows(read_pairs(p, "q", "a", id_field="id"))


def test_csv_dotted_name_is_a_literal_column(tmp_path):
    p = write(tmp_path / "d.csv", "question.text,a\nhello,world\n")
    assert read_pairs(p, "question.text", "a")["input_text"].tolist() == ["hello"]


def test_jsonl_and_ndjson_skip_blank_lines(tmp_path):
    text = jsonl(ROWS[:2]) + "\n   \n" + jsonl(ROWS[2:])
    check_rows(read_pairs(write(tmp_path / "d.jsonl", text), "q", "a", id_field="id"))
    check_rows(read_pairs(write(tmp_path / "d.ndjson", text), "q", "a", id_field="id"))


def test_json_array(tmp_path):
    p = write(tmp_path / "d.json", json.dumps(ROWS, indent=2))
    check_rows(read_pairs(p, "q", "a", id_field="id"))


def test_parquet(tmp_path):
    p = tmp_path / "d.pq"
    pq.write_table(pa.Table.from_pylist(ROWS), p)
    check_rows(read_pairs(p, "q", "a", id_field="id"))


def nested(rows):
    return [{"meta": {"id": r["id"]}, "question": {"text": r["q"], "lang": "en"},
             "answer": {"value": {"text": r["a"]}}} for r in rows]


def test_dotted_paths_json_jsonl(tmp_path):
    for p in (write(tmp_path / "d.json", json.dumps(nested(ROWS))),
              write(tmp_path / "d.jsonl", jsonl(nested(ROWS)))):
        df = read_pairs(p, "question.text", "answer.value.text", id_field="meta.id")
        check_rows(df)


def test_dotted_paths_parquet_structs(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(nested(ROWS)), p)
    check_rows(read_pairs(p, "question.text", "answer.value.text", id_field="meta.id"))


def test_literal_dotted_key_wins_over_nested_path(tmp_path):
    p = write(tmp_path / "d.json",
              json.dumps([{"q.text": "literal", "q": {"text": "nested"}, "a": "x"}]))
    assert read_pairs(p, "q.text", "a")["input_text"].tolist() == ["literal"]


def test_explicit_fmt_overrides_extension(tmp_path):
    p = write(tmp_path / "data.txt", jsonl(ROWS))
    check_rows(read_pairs(p, "q", "a", id_field="id", fmt="jsonl"))


def test_integer_ids_become_strings(tmp_path):
    p = write(tmp_path / "d.json", json.dumps([{"n": 7, "q": "x", "a": "y"}]))
    assert read_pairs(p, "q", "a", id_field="n")["id"].tolist() == ["7"]


def test_content_hash_ids(tmp_path):
    p = write(tmp_path / "d.jsonl", jsonl(ROWS))
    df = read_pairs(p, "q", "a")
    want = hashlib.sha256("What is 2+2?\x1f4".encode()).hexdigest()[:16]
    assert df["id"].iloc[0] == want == content_id("What is 2+2?", "4")
    assert df["id"].str.len().eq(16).all() and df["id"].is_unique


def test_drop_duplicate_pairs_keeps_first(tmp_path):
    rows = [{"q": "x", "a": "1"}, {"q": "y", "a": "2"}, {"q": "x", "a": "1"},
            {"q": "x", "a": "3"}, {"q": "y", "a": "2"}]
    df = read_pairs(write(tmp_path / "d.jsonl", jsonl(rows)), "q", "a")
    out, dropped = drop_duplicate_pairs(df)
    assert dropped == 2
    assert list(zip(out["input_text"], out["target_text"])) == [("x", "1"), ("y", "2"),
                                                                ("x", "3")]
    assert out["id"].is_unique and isinstance(out.index, pd.RangeIndex)
    assert out.index.tolist() == [0, 1, 2]


# --------------------------------------------------------------------------- file-level errors


def test_unknown_extension_lists_supported(tmp_path):
    p = write(tmp_path / "d.xlsx", "x")
    expect_error(p, "'.xlsx'", ".csv", ".jsonl", ".ndjson", ".parquet", ".pq", ".tsv", ".json")


def test_unknown_fmt(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")
    expect_error(p, "'xml'", "csv, tsv, jsonl, json, parquet", fmt="xml")


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.csv", "file not found")


def test_zero_byte_file(tmp_path):
    for name in ("e.csv", "e.jsonl", "e.json", "e.parquet"):
        expect_error(write(tmp_path / name, b""), "empty file (0 bytes)")


@pytest.mark.parametrize("name,text,detail", [
    ("h.csv", "q,a\n", "header only"),
    ("h.tsv", "q\ta\n", "header only"),
    ("w.csv", "\n\n", "no header and no rows"),
    ("e.json", "[]", "empty JSON array"),
    ("b.jsonl", "\n  \n", "no JSON objects"),
])
def test_empty_dataset(tmp_path, name, text, detail):
    expect_error(write(tmp_path / name, text), "empty dataset", detail)


def test_empty_parquet(tmp_path):
    p = tmp_path / "e.parquet"
    pq.write_table(pa.table({"q": pa.array([], pa.string()), "a": pa.array([], pa.string())}), p)
    expect_error(p, "empty dataset", "0 rows")


def test_non_utf8_names_line_and_offset(tmp_path):
    p = write(tmp_path / "d.csv", b"q,a\nok,fine\ncaf\xe9,x\n")
    expect_error(p, "not valid UTF-8", "line 3", "byte offset 15", "expected UTF-8 CSV")


def test_binary_file_with_text_extension(tmp_path):
    expect_error(write(tmp_path / "d.jsonl", b"\x00\x01\x02garbage\x00"),
                 "binary data", "expected UTF-8 JSONL text")


def test_parquet_named_csv(tmp_path):
    p = tmp_path / "d.csv"
    pq.write_table(pa.Table.from_pylist(ROWS), p)
    expect_error(p, "looks like a Parquet file", "expected UTF-8 CSV text")


def test_gzip_named_jsonl(tmp_path):
    import gzip
    p = write(tmp_path / "d.jsonl", gzip.compress(jsonl(ROWS).encode()))
    expect_error(p, "gzip-compressed", "expected UTF-8 JSONL text")


def test_parquet_without_magic(tmp_path):
    p = write(tmp_path / "d.parquet", "q,a\nx,y\n")
    expect_error(p, "not a Parquet file", "expected the 'PAR1' magic at the start")


def test_truncated_parquet(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), good)
    p = write(tmp_path / "cut.parquet", good.read_bytes()[:-20])
    expect_error(p, "truncated or corrupt Parquet", "expected the 'PAR1' magic at the end")


def test_corrupt_parquet_footer(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), good)
    data = bytearray(good.read_bytes())
    # Keep both magics but scramble the footer metadata just before the trailing length+magic.
    data[-40:-8] = b"\xff" * 32
    p = write(tmp_path / "bad.parquet", bytes(data))
    expect_error(p, "corrupt Parquet file", "expected a readable Parquet file")


def test_json_syntax_error_line_and_column(tmp_path):
    p = write(tmp_path / "d.json", '[\n  {"q": "x", "a": "y"},\n  {"q": "x" "a": "y"}\n]')
    expect_error(p, "invalid JSON at line 3, column 13", "Expecting ',' delimiter")


def test_jsonl_given_as_json_hints_jsonl(tmp_path):
    p = write(tmp_path / "d.json", jsonl(ROWS))
    expect_error(p, "line 2, column 1", "Extra data", "name it .jsonl")


def test_json_not_an_array(tmp_path):
    p = write(tmp_path / "d.json", json.dumps({"data": ROWS}))
    expect_error(p, "expected a top-level JSON array of objects, found an object")


def test_json_array_element_not_object(tmp_path):
    p = write(tmp_path / "d.json", json.dumps([ROWS[0], ["x", "y"]]))
    expect_error(p, "row 2", "expected a JSON object, found list")


def test_jsonl_syntax_error_line(tmp_path):
    p = write(tmp_path / "d.jsonl", jsonl(ROWS[:2]) + "\n" + '{"q": "x", "a": }\n')
    expect_error(p, "invalid JSON on line 4, column 17", "one JSON object per line")


def test_jsonl_line_that_is_not_an_object(tmp_path):
    p = write(tmp_path / "d.jsonl", jsonl(ROWS[:1]) + '["q", "a"]\n')
    expect_error(p, "line 2", "expected a JSON object, found list", "should be named .json")


def test_csv_ragged_row(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,y\nx,y,z\n")
    expect_error(p, "not valid CSV", "Expected 2 fields in line 3, saw 3",
                 "same number of fields on every line")


def test_csv_unbalanced_quote(tmp_path):
    p = write(tmp_path / "d.csv", 'q,a\n"unterminated,x\ny,z\n')
    expect_error(p, "not valid CSV", "EOF inside string", "balanced double quotes")


# --------------------------------------------------------------------------- field errors


def test_missing_column_csv_lists_columns(tmp_path):
    p = write(tmp_path / "d.csv", "question,answer\nx,y\n")
    expect_error(p, "missing field 'q'", "Available columns: 'question', 'answer'")


def test_missing_key_json_names_first_row_lacking_it(tmp_path):
    rows = [{"q": "x", "a": "y"}, {"q": "x", "a": "y"}, {"q": "x", "answer": "y"}]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)),
                 "missing field 'a'", "row 3", "at the top level", "Keys there: 'answer', 'q'")


def test_missing_key_jsonl_names_row_and_line(tmp_path):
    text = jsonl([{"q": "x", "a": "y"}]) + "\n" + jsonl([{"q": "x"}])
    expect_error(write(tmp_path / "d.jsonl", text),
                 "missing field 'a'", "row 2 (line 3)", "Keys there: 'q'")


def test_missing_nested_key(tmp_path):
    rows = nested(ROWS)
    del rows[1]["question"]["text"]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)),
                 "missing field 'question.text'", "row 2", "under 'question'",
                 "Keys there: 'lang'", input_field="question.text", target_field="answer.value.text")


def test_nested_path_through_non_object(tmp_path):
    rows = [{"question": "plain string", "a": "y"}]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)),
                 "missing field 'question.text'", "row 1", "'question' is str, not an object",
                 input_field="question.text")


def test_missing_parquet_field_lists_nested_fields(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(nested(ROWS)), p)
    expect_error(p, "missing field 'question.body'", "'question.text'", "'answer.value.text'",
                 "'meta.id'", input_field="question.body", target_field="answer.value.text")


@pytest.mark.parametrize("value,detail", [
    (None, "value is null; expected non-empty text"),
    ("", "text is empty; expected non-empty text"),
    ("  \t", "text is whitespace-only; expected non-empty text"),
    (42, "found int, expected a string"),
    (["x"], "found list, expected a string"),
    ({"t": "x"}, "found dict, expected a string"),
])
def test_bad_text_values_json(tmp_path, value, detail):
    rows = [{"q": "ok", "a": "ok"}, {"q": "ok", "a": value}]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)), "row 2", "field 'a'", detail)


def test_empty_cell_csv(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,y\nx,\n")
    expect_error(p, "row 2", "field 'a'", "text is empty")


def test_null_text_parquet(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"q": ["x", None], "a": ["y", "z"]}), p)
    expect_error(p, "row 2", "field 'q'", "value is null")


def test_null_parent_struct_parquet(tmp_path):
    p = tmp_path / "d.parquet"
    rows = nested(ROWS)
    rows[2]["question"] = None
    pq.write_table(pa.Table.from_pylist(rows), p)
    expect_error(p, "row 3", "field 'question.text'", "value is null",
                 input_field="question.text", target_field="answer.value.text")


def test_non_string_parquet_column(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"q": ["x", "y"], "a": pa.array([1, 2], pa.int64())}), p)
    expect_error(p, "row 1", "field 'a'", "found int (Parquet type int64), expected a string")


def test_duplicate_ids_name_both_rows(tmp_path):
    rows = [{"id": "x", "q": "1", "a": "1"}, {"id": "y", "q": "2", "a": "2"},
            {"id": "x", "q": "3", "a": "3"}]
    expect_error(write(tmp_path / "d.jsonl", jsonl(rows)),
                 "duplicate id 'x'", "row 1 (line 1) and row 3 (line 3)", "unique",
                 id_field="id")


def test_duplicate_ids_csv(tmp_path):
    p = write(tmp_path / "d.csv", "id,q,a\n1,x,y\n2,x,y\n2,z,w\n")
    expect_error(p, "duplicate id '2'", "row 2 and row 3", id_field="id")


@pytest.mark.parametrize("value,detail", [
    (None, "value is null"), ("", "id is empty"), (1.5, "found float"), (True, "found bool"),
])
def test_bad_ids(tmp_path, value, detail):
    rows = [{"id": "ok", "q": "x", "a": "y"}, {"id": value, "q": "x", "a": "y"}]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)),
                 "row 2", "id field 'id'", detail, id_field="id")
