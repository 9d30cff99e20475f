"""read_pairs: every format, dotted paths, and every user error with a precise message."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import ConfigError, DatasetError
from pipeline.data.readers.checks import content_id
from pipeline.data.readers.dataset import drop_duplicate_pairs, read_dataset, read_pairs
from pipeline.data.readers.files import dataset_files

pytestmark = pytest.mark.unit

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
    assert list(df.columns) == ["id", "input_text", "target_text", "group"]
    assert isinstance(df.index, pd.RangeIndex) and df.index.start == 0
    assert df["input_text"].tolist() == [r["q"] for r in ROWS]
    assert df["target_text"].tolist() == [r["a"] for r in ROWS]
    if with_ids:
        assert df["id"].tolist() == ["a", "b", "c"]
    assert all(isinstance(v, str) for col in df.columns for v in df[col])


# --------------------------------------------------------------------------- formats


def test_csv(tmp_path):
    p = write(tmp_path / "d.csv", "id,q,a\na,What is 2+2?,4\nb,Capital of France?,Paris\nc,NA,null\n")
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
    p = write(tmp_path / "d.tsv", "id\tq\ta\n" + "".join(f"{r['id']}\t{r['q']}\t{r['a']}\n" for r in ROWS))
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
    return [
        {"meta": {"id": r["id"]}, "question": {"text": r["q"], "lang": "en"}, "answer": {"value": {"text": r["a"]}}}
        for r in rows
    ]


def test_dotted_paths_json_jsonl(tmp_path):
    for p in (write(tmp_path / "d.json", json.dumps(nested(ROWS))), write(tmp_path / "d.jsonl", jsonl(nested(ROWS)))):
        df = read_pairs(p, "question.text", "answer.value.text", id_field="meta.id")
        check_rows(df)


def test_dotted_paths_parquet_structs(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(nested(ROWS)), p)
    check_rows(read_pairs(p, "question.text", "answer.value.text", id_field="meta.id"))


def test_literal_dotted_key_wins_over_nested_path(tmp_path):
    p = write(tmp_path / "d.json", json.dumps([{"q.text": "literal", "q": {"text": "nested"}, "a": "x"}]))
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
    rows = [
        {"q": "x", "a": "1"},
        {"q": "y", "a": "2"},
        {"q": "x", "a": "1"},
        {"q": "x", "a": "3"},
        {"q": "y", "a": "2"},
    ]
    df = read_pairs(write(tmp_path / "d.jsonl", jsonl(rows)), "q", "a")
    out, dropped = drop_duplicate_pairs(df)
    assert dropped == 2
    assert list(zip(out["input_text"], out["target_text"])) == [("x", "1"), ("y", "2"), ("x", "3")]
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


@pytest.mark.parametrize(
    "name,text,detail",
    [
        ("h.csv", "q,a\n", "header only"),
        ("h.tsv", "q\ta\n", "header only"),
        ("w.csv", "\n\n", "no header and no rows"),
        ("e.json", "[]", "empty JSON array"),
        ("b.jsonl", "\n  \n", "no JSON objects"),
    ],
)
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
    expect_error(write(tmp_path / "d.jsonl", b"\x00\x01\x02garbage\x00"), "binary data", "expected UTF-8 JSONL text")


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
    expect_error(p, "not valid CSV", "Expected 2 fields in line 3, saw 3", "same number of fields on every line")


def test_csv_unbalanced_quote(tmp_path):
    p = write(tmp_path / "d.csv", 'q,a\n"unterminated,x\ny,z\n')
    expect_error(p, "not valid CSV", "EOF inside string", "balanced double quotes")


# --------------------------------------------------------------------------- field errors


def test_missing_column_csv_lists_columns(tmp_path):
    p = write(tmp_path / "d.csv", "question,answer\nx,y\n")
    expect_error(p, "missing field 'q'", "Available columns: 'question', 'answer'")


def test_missing_key_json_names_first_row_lacking_it(tmp_path):
    rows = [{"q": "x", "a": "y"}, {"q": "x", "a": "y"}, {"q": "x", "answer": "y"}]
    expect_error(
        write(tmp_path / "d.json", json.dumps(rows)),
        "missing field 'a'",
        "row 3",
        "at the top level",
        "Keys there: 'answer', 'q'",
    )


def test_missing_key_jsonl_names_row_and_line(tmp_path):
    text = jsonl([{"q": "x", "a": "y"}]) + "\n" + jsonl([{"q": "x"}])
    expect_error(write(tmp_path / "d.jsonl", text), "missing field 'a'", "row 2 (line 3)", "Keys there: 'q'")


def test_missing_nested_key(tmp_path):
    rows = nested(ROWS)
    del rows[1]["question"]["text"]
    expect_error(
        write(tmp_path / "d.json", json.dumps(rows)),
        "missing field 'question.text'",
        "row 2",
        "under 'question'",
        "Keys there: 'lang'",
        input_field="question.text",
        target_field="answer.value.text",
    )


def test_nested_path_through_non_object(tmp_path):
    rows = [{"question": "plain string", "a": "y"}]
    expect_error(
        write(tmp_path / "d.json", json.dumps(rows)),
        "missing field 'question.text'",
        "row 1",
        "'question' is str, not an object",
        input_field="question.text",
    )


def test_missing_parquet_field_lists_nested_fields(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(nested(ROWS)), p)
    expect_error(
        p,
        "missing field 'question.body'",
        "'question.text'",
        "'answer.value.text'",
        "'meta.id'",
        input_field="question.body",
        target_field="answer.value.text",
    )


@pytest.mark.parametrize(
    "value,detail",
    [
        (None, "value is null; expected non-empty text"),
        ("", "text is empty; expected non-empty text"),
        ("  \t", "text is whitespace-only; expected non-empty text"),
        (42, "found int, expected a string"),
        (["x"], "found list, expected a string"),
        ({"t": "x"}, "found dict, expected a string"),
    ],
)
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
    expect_error(
        p,
        "row 3",
        "field 'question.text'",
        "value is null",
        input_field="question.text",
        target_field="answer.value.text",
    )


def test_non_string_parquet_column(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"q": ["x", "y"], "a": pa.array([1, 2], pa.int64())}), p)
    expect_error(p, "row 1", "field 'a'", "found int (Parquet type int64), expected a string")


def test_duplicate_ids_name_both_rows(tmp_path):
    rows = [{"id": "x", "q": "1", "a": "1"}, {"id": "y", "q": "2", "a": "2"}, {"id": "x", "q": "3", "a": "3"}]
    expect_error(
        write(tmp_path / "d.jsonl", jsonl(rows)),
        "duplicate id 'x'",
        "row 1 (line 1) and row 3 (line 3)",
        "unique",
        id_field="id",
    )


def test_duplicate_ids_csv(tmp_path):
    p = write(tmp_path / "d.csv", "id,q,a\n1,x,y\n2,x,y\n2,z,w\n")
    expect_error(p, "duplicate id '2'", "row 2 and row 3", id_field="id")


@pytest.mark.parametrize(
    "value,detail",
    [
        (None, "value is null"),
        ("", "id is empty"),
        (1.5, "found float"),
        (True, "found bool"),
    ],
)
def test_bad_ids(tmp_path, value, detail):
    rows = [{"id": "ok", "q": "x", "a": "y"}, {"id": value, "q": "x", "a": "y"}]
    expect_error(write(tmp_path / "d.json", json.dumps(rows)), "row 2", "id field 'id'", detail, id_field="id")


# --------------------------------------------------------------------------- repeated names


def read_error(spec, *fragments, error=DatasetError, **kw) -> str:
    """read_dataset must raise `error` naming the spec and every fragment; returns the message."""
    kw.setdefault("input_field", "q")
    kw.setdefault("target_field", "a")
    with pytest.raises(error) as exc:
        read_dataset(spec, **kw)
    msg = str(exc.value)
    assert str(spec).rstrip("/") in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize(
    "name,text,times,positions",
    [
        ("d.csv", "id,a,q,a\n1,first,x,second\n", "twice", "columns 2 and 4"),
        ("d.tsv", "a\tq\ta\ta\nfirst\tx\tsecond\tthird\n", "3 times", "columns 1, 3 and 4"),
    ],
)
def test_repeated_column_in_header_is_refused(tmp_path, name, text, times, positions):
    # pandas would rename the second to 'a.1' and read the first: a silent choice of one.
    p = write(tmp_path / name, text)
    assert expect_error(p) == (
        f"{p}: column 'a' appears {times} in the header ({positions}); expected each column "
        "name once — rename or remove the repeats (only one of them could be read)"
    )


def test_repeated_empty_header_cells_are_not_names(tmp_path):
    # Spreadsheets export trailing empty columns: "q,a,," is two unnamed columns, not a repeat.
    df = read_pairs(write(tmp_path / "d.csv", "q,a,,\nx,y,,\n"), "q", "a")
    assert df["input_text"].tolist() == ["x"]


def test_repeated_key_json_names_row_and_key(tmp_path):
    p = write(tmp_path / "d.json", '[{"q": "x", "a": "y"},\n {"q": "x", "a": "first", "a": "second"}]')
    assert expect_error(p) == (
        f"{p}: row 2: key 'a' appears twice in one object (at the top level); expected each "
        "key once — JSON keeps only the last value, so the other would be silently lost"
    )


def test_repeated_nested_key_jsonl_names_row_line_and_where(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"q": "x", "a": "y"}\n\n{"q": {"text": "1", "text": "2"}, "a": "y"}\n')
    expect_error(p, "row 2 (line 3): key 'text' appears twice in one object (under 'q')")


def test_repeated_parquet_column(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table([pa.array(["x"]), pa.array(["y"]), pa.array(["z"])], names=["q", "a", "q"]), p)
    expect_error(
        p, "column 'q' appears twice in the Parquet schema (positions 1 and 3)", "expected each column name once"
    )


# --------------------------------------------------------------------------- delimiters


@pytest.mark.parametrize(
    "name,text,advice",
    [
        ("semi.csv", "q;a\nx;y\n", "set embed.delimiter=';' (in a shell: \"embed.delimiter=';'\")"),
        ("pipe.csv", "q|a\nx|y\n", "set embed.delimiter='|' (in a shell: \"embed.delimiter='|'\")"),
        ("tabs.csv", "q\ta\nx\ty\n", "set embed.format=tsv (or name the file .tsv)"),
        ("commas.tsv", "q,a\nx,y\n", "set embed.format=csv (or name the file .csv)"),
    ],
)
def test_missing_field_names_the_delimiter_the_header_uses(tmp_path, name, text, advice):
    p = write(tmp_path / name, text)
    msg = expect_error(p, "missing field 'q' (embed.input_field)", "Available columns: ", advice)
    if name == "semi.csv":
        assert msg == (
            f"{p}: missing field 'q' (embed.input_field); expected a column with that name in the "
            "header. Available columns: 'q;a' (1 when split at commas). The header line has 1 ';': it "
            "looks ';'-separated, not comma-separated; set embed.delimiter=';' (in a shell: "
            "\"embed.delimiter=';'\")"
        )


def test_wrong_delimiter_with_ragged_rows_gets_the_same_advice(tmp_path):
    # Commas inside ';'-separated text make the rows ragged before any field is looked up.
    p = write(tmp_path / "d.csv", "q;a\nx, y;z\n")
    expect_error(p, "not valid CSV (Expected 1 fields in line 2, saw 2)", "set embed.delimiter=';'")


@pytest.mark.parametrize("delimiter,sep", [(";", ";"), ("|", "|"), ("tab", "\t"), ("\\t", "\t"), ("", ",")])
def test_delimiter_parameter(tmp_path, delimiter, sep):
    p = write(tmp_path / "d.csv", f'q{sep}a\n"x{sep} x"{sep}y\n')
    df = read_dataset(p, "q", "a", delimiter=delimiter)
    assert df["input_text"].tolist() == [f"x{sep} x"] and df["target_text"].tolist() == ["y"]


def test_explicit_delimiter_that_is_wrong_suggests_the_right_one(tmp_path):
    p = write(tmp_path / "d.csv", "q\ta\nx\ty\n")
    expect_error(p, "not ';'-separated; set embed.delimiter=tab", delimiter=";")


def test_bad_delimiter_is_a_config_error(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")
    with pytest.raises(ConfigError, match=r"embed\.delimiter = 'ab': expected one character"):
        read_dataset(p, "q", "a", delimiter="ab")


def test_row_longer_than_header_is_an_error_not_an_index(tmp_path):
    # With the header read as names, pandas would take the first column as the index.
    expect_error(write(tmp_path / "d.csv", "q,a\n1,x,y\n"), "not valid CSV (Expected 2 fields in line 2, saw 3)")


def test_row_shorter_than_header_says_so(tmp_path):
    expect_error(
        write(tmp_path / "d.csv", "q,a\nx,y\nz\n"),
        "row 2, field 'a': text is empty (the row has 1 of the header's 2 fields)",
    )


def test_unclosed_quote_names_its_line(tmp_path):
    expect_error(
        write(tmp_path / "d.csv", 'q,a\nx,y\n\nz,"open\nmore\n'),
        "EOF inside string: the double quote opened at line 4, column 3 is never closed",
    )


# --------------------------------------------------------------------------- JSON vs JSON Lines


def test_json_array_in_jsonl_file(tmp_path):
    p = write(tmp_path / "d.jsonl", json.dumps(ROWS, indent=1))
    assert expect_error(p) == (
        f"{p}: this is a JSON array (line 1 opens it with '['), not JSON Lines (one object "
        "per line); name the file .json or set embed.format=json"
    )


def test_broken_json_array_in_jsonl_file_still_gets_the_hint(tmp_path):
    p = write(tmp_path / "d.jsonl", '[\n {"q": "x", "a": "y"},\n')
    expect_error(p, "invalid JSON on line 1", "Line 1 starts with '['", "set embed.format=json")


def test_jsonl_lines_split_at_newline_only(tmp_path):
    # U+2028 and U+0085 are allowed raw inside JSON strings; str.splitlines would split there.
    rows = [{"q": "a\u2028b", "a": "c\x85d\x1ce"}]
    p = write(tmp_path / "d.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows))
    df = read_pairs(p, "q", "a")
    assert df["input_text"].tolist() == ["a\u2028b"] and df["target_text"].tolist() == ["c\x85d\x1ce"]


# --------------------------------------------------------------------------- what does not exist


def test_missing_directory_says_it_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert read_error("data/nope/") == (
        "data/nope/: does not exist (no such file or directory; nearest existing "
        "parent: data); expected a dataset file, a directory of dataset files or a "
        "glob pattern"
    )


def test_missing_file_with_unknown_extension_is_not_found_first(tmp_path):
    read_error(tmp_path / "nope" / "pairs.xlsx", "file not found", f"nearest existing parent: {tmp_path})")
    with pytest.raises(DatasetError, match="file not found"):
        read_pairs(tmp_path / "pairs.xlsx", "q", "a")


def test_missing_file_suggests_a_close_name(tmp_path):
    write(tmp_path / "pairs.csv", "q,a\nx,y\n")
    read_error(tmp_path / "pair.csv", "file not found", "did you mean 'pairs.csv'?", "expected a csv dataset")


def test_broken_symlink(tmp_path):
    (tmp_path / "link.csv").symlink_to(tmp_path / "gone.csv")
    read_error(tmp_path / "link.csv", "broken symbolic link", "gone.csv")


def test_glob_under_a_missing_directory(tmp_path):
    read_error(
        str(tmp_path / "nope" / "*.csv"),
        "no file matches this pattern",
        f"{tmp_path / 'nope'} does not exist (nearest existing parent: {tmp_path})",
    )


# --------------------------------------------------------------------------- directories


def test_directory_reports_every_entry_it_did_not_read(tmp_path):
    write(tmp_path / "a.csv", "q,a\nx,y\n")
    write(tmp_path / "notes.txt", "x")
    write(tmp_path / ".DS_Store", b"\x00\x00\x00\x01Bud1")
    write(tmp_path / ".gitkeep", "")
    write(tmp_path / "._a.csv", b"\x00\x05\x16\x07")  # a macOS resource fork: hidden, not read
    (tmp_path / "old").mkdir()
    df = read_dataset(tmp_path, "q", "a")
    assert [f.name for f in df.attrs["files"]] == ["a.csv"]
    assert [(p.name, why) for p, why in df.attrs["files_skipped"]] == [
        (".DS_Store", "hidden file (name starts with '.')"),
        ("._a.csv", "hidden file (name starts with '.')"),
        (".gitkeep", "hidden file (name starts with '.')"),
        ("notes.txt", "unsupported extension '.txt'"),
        ("old", "a directory (subdirectories are not read)"),
    ]


def test_directory_without_dataset_files_lists_what_it_holds(tmp_path):
    write(tmp_path / "notes.txt", "x")
    write(tmp_path / ".gitkeep", "")
    assert read_error(tmp_path) == (
        f"{tmp_path}: directory holds no dataset file (it holds: .gitkeep (hidden file (name starts with '.')), "
        "notes.txt (unsupported extension '.txt')); expected files ending in .csv, .json, .jsonl, .ndjson, "
        ".parquet, .pq, .tsv"
    )


# --------------------------------------------------------------------------- characters no text may hold


@pytest.mark.parametrize(
    "name,text,where,found",
    [
        (
            "d.json",
            '[{"q": "ok", "a": "ok"}, {"q": "What\\u0000 is", "a": "ok"}]',
            "row 2, field 'q'",
            "NUL character (U+0000) at character 5 of the text, after 'What'",
        ),
        (
            "d.jsonl",
            '{"q": "ok", "a": "ok"}\n\n{"q": "ok", "a": "bad \\ud800 here"}\n',
            "row 2 (line 3), field 'a'",
            "lone surrogate U+D800 at character 5 of the text, after 'bad '",
        ),
        (
            "d.jsonl",
            '{"q": "ok", "a": "\\udfff"}\n',
            "row 1 (line 1), field 'a'",
            "lone surrogate U+DFFF at character 1 of the text;",
        ),
        (
            "d.csv",
            "q,a\n" + "x,y\n" * 3000 + "x,y\x00z\n",
            "row 3001, field 'a'",
            "NUL character (U+0000) at character 2",
        ),
        # In the first 8 KiB too: one stray NUL in UTF-8 text is a field's problem, not a binary file.
        ("d.csv", "q,a\nok,fine\nb\x00,c\n", "row 2, field 'q'", "NUL character (U+0000) at character 2 of the text"),
    ],
)
def test_nul_and_lone_surrogates_are_refused(tmp_path, name, text, where, found):
    msg = expect_error(write(tmp_path / name, text), f"{where}: {found}", "expected")
    assert ("expected text without NUL characters" in msg) != ("expected valid Unicode text" in msg)


def test_surrogate_pair_escapes_are_fine(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"q": "smile \\ud83d\\ude00", "a": "ok"}\n')
    assert read_pairs(p, "q", "a")["input_text"].tolist() == ["smile \U0001f600"]


def test_nul_in_id(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"id": "x\\u0000", "q": "ok", "a": "ok"}\n')
    expect_error(p, "row 1 (line 1), id field 'id': NUL character (U+0000) at character 2", id_field="id")


def test_invalid_utf8_in_parquet_strings(tmp_path):
    p = tmp_path / "d.parquet"
    bad = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"q": bad, "a": ["x", "y"]}), p)
    expect_error(p, "row 2, field 'q': not valid UTF-8 at byte 3 of the text", "expected UTF-8 text")


@pytest.mark.parametrize(
    "name,data,kind",
    [
        ("d.csv", "q,a\nx,y\n".encode("utf-16"), "looks like UTF-16 text (little-endian byte-order mark)"),
        ("d.csv", "q,a\nx,y\n".encode("utf-16-le"), "looks like UTF-16 text without a byte-order mark"),
        ("d.jsonl", '{"q": "x", "a": "y"}\n'.encode("utf-32"), "looks like UTF-32 text"),
        ("d.csv", "q,a\ncafé,y\n".encode("cp1252"), "not valid UTF-8 at line 2 (byte offset 7, column 4"),
    ],
)
def test_other_encodings_are_named(tmp_path, name, data, kind):
    expect_error(write(tmp_path / name, data), kind, "re-save the file as UTF-8")


# --------------------------------------------------------------------------- config keys in messages


def test_messages_name_config_keys(tmp_path):
    p = write(tmp_path / "d.xlsx", "x")
    expect_error(p, "(or set embed.format to one of csv, tsv, jsonl, json, parquet)")
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")
    expect_error(p, "embed.format = 'xml' is not a format", fmt="xml")
    expect_error(p, "missing field 'question' (embed.input_field)", input_field="question")
    expect_error(p, "missing field 'answer' (embed.target_field)", target_field="answer")


@pytest.mark.parametrize("id_field", ["id", "none"])
def test_missing_id_column_says_how_to_do_without(tmp_path, id_field):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")
    msg = expect_error(p, f"missing field {id_field!r} (embed.id_field)", id_field=id_field)
    assert msg.endswith("(no id column? set embed.id_field=null or embed.id_field='' for content-hash ids)")
    p = write(tmp_path / "d.json", '[{"q": "x", "a": "y"}]')
    expect_error(
        p, "(no id column? set embed.id_field=null or embed.id_field='' for content-hash ids)", id_field=id_field
    )


def test_empty_id_field_means_no_id_column(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")
    for df in (read_pairs(p, "q", "a", id_field=""), read_dataset(p, "q", "a", id_field="")):
        assert df["id"].tolist() == [content_id("x", "y")]


def test_skipped_null_rows_without_ids(tmp_path):
    # Content ids were computed before the skipped rows were dropped: None + str failed.
    p = write(tmp_path / "d.jsonl", '{"q": null, "a": "y"}\n{"q": "x", "a": "y"}\n')
    df = read_dataset(p, "q", "a", skip_empty=True)
    assert df["id"].tolist() == [content_id("x", "y")] and df.attrs["rows_skipped_empty"] == 1


def test_every_row_skipped_is_an_error(tmp_path):
    p = write(tmp_path / "d.csv", "q,a\nx,\n,y\n")
    read_error(
        p, "no rows left: every one of the 2 rows read has an empty or null input or target text", skip_empty=True
    )


# --------------------------------------------------------------------------- files outside the project


def fake_project(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "project"
    (root / "data" / "raw").mkdir(parents=True)
    write(root / "data" / "raw" / "in.csv", "q,a\nx,y\n")
    outside = write(tmp_path / "outside.csv", "q,a\nsecret,data\n")
    return root, outside


def test_glob_with_dotdot_cannot_leave_the_project(tmp_path):
    root, outside = fake_project(tmp_path)
    spec = str(root / "data" / "r*" / ".." / ".." / ".." / "outside.csv")
    msg = read_error(spec, error=ConfigError, allowed_root=root)
    assert msg == (
        f"embed.dataset = {spec!r}: the glob matches {root}/data/raw/../../../outside.csv, which resolves "
        f"to {outside}, outside the project ({root}); expected files inside it, or set "
        "run.allow_external_paths=true to allow it"
    )
    assert read_dataset(spec, "q", "a")["input_text"].tolist() == ["secret"]  # no allowed_root: no check


def test_symlink_in_a_dataset_directory_cannot_leave_the_project(tmp_path):
    root, outside = fake_project(tmp_path)
    (root / "data" / "raw" / "link.csv").symlink_to(outside)
    read_error(
        root / "data" / "raw",
        "the directory holds",
        "link.csv, which resolves to",
        str(outside),
        "set run.allow_external_paths=true",
        error=ConfigError,
        allowed_root=root,
    )


def test_symlink_matched_by_a_glob_cannot_leave_the_project(tmp_path):
    root, outside = fake_project(tmp_path)
    (root / "data" / "raw" / "part-2.csv").symlink_to(outside)
    write(root / "data" / "raw" / "part-1.csv", "q,a\nx,y\n")
    read_error(
        str(root / "data" / "raw" / "part-*.csv"),
        "the glob matches",
        "part-2.csv, which resolves to",
        error=ConfigError,
        allowed_root=root,
    )


def test_symlink_inside_the_project_is_fine(tmp_path):
    root, _ = fake_project(tmp_path)
    (root / "data" / "link.csv").symlink_to(root / "data" / "raw" / "in.csv")
    assert dataset_files(root / "data" / "link.csv", allowed_root=root) == [root / "data" / "link.csv"]
    assert read_dataset(root / "data", "q", "a", allowed_root=root)["input_text"].tolist() == ["x"]


# --------------------------------------------------------------------------- whatever a parser raises


def test_deeply_nested_json(tmp_path):
    expect_error(write(tmp_path / "d.json", "[" * 100_000 + "]" * 100_000), "JSON nested too deeply to read")
    expect_error(
        write(tmp_path / "d.jsonl", '{"q": ' * 100_000 + "1" + "}" * 100_000 + "\n"),
        "line 1: JSON nested too deeply to read",
    )


def test_huge_json_integer(tmp_path):
    p = write(tmp_path / "d.jsonl", '{"id": ' + "1" * 5000 + ', "q": "x", "a": "y"}\n')
    expect_error(p, "line 1: a JSON integer of 5000 digits", "expected one JSON object per line", id_field="id")


def test_unforeseen_parser_error_names_the_file(tmp_path, monkeypatch):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")

    def broken(*a, **kw):
        raise KeyError("something pandas never said before")

    monkeypatch.setattr(pd, "read_csv", broken)
    assert expect_error(p) == (
        f"{p}: could not be read as CSV (KeyError: 'something pandas never said before'); "
        "expected UTF-8 comma-separated values with a header line"
    )

    def no_memory(*a, **kw):
        raise MemoryError

    monkeypatch.setattr(pd, "read_csv", no_memory)
    with pytest.raises(MemoryError):
        read_pairs(p, "q", "a")


def test_unreadable_file(tmp_path, monkeypatch):
    p = write(tmp_path / "d.csv", "q,a\nx,y\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    expect_error(p, "cannot be read (Permission denied); expected a readable csv dataset file")
